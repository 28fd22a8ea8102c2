package main

import (
	"fmt"
	"strings"

	"github.com/spf13/cobra"

	"github.com/gpuctl/gpuctl/client"
	"github.com/gpuctl/gpuctl/views"
)

func init() {
	subcommands = append(subcommands, newRestartCmd, newCheckpointCmd)
}

func newRestartCmd() *cobra.Command {
	var (
		config, from, output string
		exclude              []string
	)
	cmd := &cobra.Command{
		Use:   "restart JOB [--from-checkpoint latest|STEP] [--exclude NODE]",
		Short: "Restart a running or failed job from a checkpoint, optionally avoiding nodes",
		Long: `Restart stops the job's ranks (SIGTERM, SIGKILL after a grace), lets the
scheduler place it again without the excluded nodes (healthy nodes are
kept, excluded ones swapped for free nodes, which run a short validation
all-reduce first), and relaunches every rank with GPUCTL_RESUME_STEP set to
the checkpoint. Follow it with ` + "`gpuctl jobs JOB`" + ` and ` + "`gpuctl events`" + `.`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			return withClient(cmd, config, func(c *client.Client) error {
				j, err := c.RestartJob(cmd.Context(), args[0], from, exclude)
				if err != nil {
					return err
				}
				state, reason := views.JobStateName(j.GetState()), j.GetReason()
				msg := fmt.Sprintf("%s %s: %s", j.GetId(), state, reason)
				if strings.HasPrefix(reason, state+":") {
					msg = j.GetId() + " " + reason
				}
				if len(j.GetExclude()) > 0 {
					msg += "; avoiding " + strings.Join(j.GetExclude(), ",")
				}
				return writeJobAction(cmd, output, j, msg)
			})
		},
	}
	addConfigFlag(cmd, &config)
	cmd.Flags().StringVar(&from, "from-checkpoint", "latest", "checkpoint to resume from: latest or a step number")
	cmd.Flags().StringSliceVar(&exclude, "exclude", nil, "nodes the restarted job must avoid, comma-separated or repeated")
	jobOutput(cmd, &output)
	return cmd
}

func newCheckpointCmd() *cobra.Command {
	var config, output string
	cmd := &cobra.Command{
		Use:   "checkpoint JOB",
		Short: "Ask every rank of a running job to checkpoint now (SIGUSR1)",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			return withClient(cmd, config, func(c *client.Client) error {
				j, err := c.CheckpointJob(cmd.Context(), args[0])
				if err != nil {
					return err
				}
				return writeJobAction(cmd, output, j, fmt.Sprintf("%s: SIGUSR1 sent to its ranks; last complete checkpoint step %d, into %s",
					j.GetId(), j.GetLastCheckpointStep(), j.GetCheckpointDir()))
			})
		},
	}
	addConfigFlag(cmd, &config)
	jobOutput(cmd, &output)
	return cmd
}
