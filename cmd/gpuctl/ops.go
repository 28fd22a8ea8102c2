package main

import (
	"context"
	"fmt"
	"io"
	"os/signal"
	"strings"
	"syscall"
	"time"

	"github.com/spf13/cobra"

	"github.com/gpuctl/gpuctl/api"
	"github.com/gpuctl/gpuctl/client"
	"github.com/gpuctl/gpuctl/views"
)

func init() {
	subcommands = append(subcommands, newStallsCmd, newLogsCmd,
		func() *cobra.Command { return newNodeActionCmd("cordon") },
		func() *cobra.Command { return newNodeActionCmd("uncordon") },
		func() *cobra.Command { return newNodeActionCmd("drain") })
}

func newStallsCmd() *cobra.Command {
	var (
		v   viewFlags
		job string
	)
	cmd := &cobra.Command{
		Use:   "stalls",
		Short: "NCCL stalls: communicators whose ranks stopped agreeing, and which rank holds them up",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			return v.run(cmd, func(ctx context.Context, c *client.Client, w io.Writer, f views.Format) error {
				stalls, err := c.ListStalls(ctx, job)
				if err != nil {
					return err
				}
				return views.Stalls(w, f, stalls, time.Now())
			})
		},
	}
	v.add(cmd)
	cmd.Flags().StringVar(&job, "job", "", "only this job's stalls (id or name)")
	return cmd
}

var nodeActionHelp = map[string]string{
	"cordon":   "Stop placing new work on a node; what runs there keeps running",
	"uncordon": "Let a cordoned or draining node take new work again",
	"drain":    "Cordon a node and move its jobs elsewhere (checkpoint, stop, relaunch)",
}

func newNodeActionCmd(action string) *cobra.Command {
	var config, reason string
	cmd := &cobra.Command{
		Use:   action + " NODE",
		Short: nodeActionHelp[action],
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			return withClient(cmd, config, func(c *client.Client) error {
				r, err := c.Cordon(cmd.Context(), args[0], action, reason)
				if err != nil {
					return err
				}
				return writeNodeAction(cmd.OutOrStdout(), action, r)
			})
		},
	}
	addConfigFlag(cmd, &config)
	if action != "uncordon" {
		cmd.Flags().StringVar(&reason, "reason", "", "why, shown in `gpuctl nodes` and the event log")
	}
	return cmd
}

// writeNodeAction says what a cordon, uncordon or drain did.
func writeNodeAction(w io.Writer, action string, r *api.CordonResponse) error {
	n := r.GetNode()
	line := n.GetRegistration().GetName() + " " + n.GetState().Short()
	if reason := n.GetCordonReason(); reason != "" {
		line += " (" + reason + ")"
	}
	if action == "uncordon" && n.GetState() == api.NodeState_NODE_STATE_DOWN {
		line += ": takes new work once it reconnects"
	}
	if _, err := fmt.Fprintln(w, line); err != nil {
		return err
	}
	if action != "drain" {
		return nil
	}
	if len(r.GetJobs()) == 0 {
		_, err := fmt.Fprintln(w, "  no jobs run there")
		return err
	}
	for _, j := range r.GetJobs() {
		what := "stays: " + j.GetReason()
		if j.GetMoving() {
			what = "moving to " + strings.Join(j.GetTo(), ",") + " (checkpoint, stop, relaunch)"
		}
		if _, err := fmt.Fprintf(w, "  %s  %s\n", j.GetJob(), what); err != nil {
			return err
		}
	}
	return nil
}

func newLogsCmd() *cobra.Command {
	var (
		config string
		rank   int32
		follow bool
		tail   uint32
	)
	cmd := &cobra.Command{
		Use:   "logs JOB",
		Short: "Print a rank's output (stdout and stderr), relayed from its node",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			if rank < 0 {
				return fmt.Errorf("logs: --rank %d is negative; ranks count from 0", rank)
			}
			ctx, stop := signal.NotifyContext(cmd.Context(), syscall.SIGINT, syscall.SIGTERM)
			defer stop()
			c, err := dial(ctx, config)
			if err != nil {
				return err
			}
			defer c.Close()
			w := cmd.OutOrStdout()
			return c.Logs(ctx, &api.LogsRequest{Job: args[0], Rank: rank, Follow: follow, TailBytes: tail}, func(ch *api.LogsChunk) error {
				_, err := w.Write(ch.GetData())
				return err
			})
		},
	}
	addConfigFlag(cmd, &config)
	cmd.Flags().Int32Var(&rank, "rank", 0, "the rank whose log to print")
	cmd.Flags().BoolVarP(&follow, "follow", "f", false, "keep printing what the rank writes until the job ends")
	cmd.Flags().Uint32Var(&tail, "tail", 0, "start this many bytes before the end (0: from the start)")
	return cmd
}
