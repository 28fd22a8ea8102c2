package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"strings"
	"time"

	"github.com/spf13/cobra"
	"go.yaml.in/yaml/v3"

	"github.com/gpuctl/gpuctl/api"
	"github.com/gpuctl/gpuctl/client"
	"github.com/gpuctl/gpuctl/jobspec"
	"github.com/gpuctl/gpuctl/views"
)

func init() {
	subcommands = append(subcommands, newSubmitCmd, newJobsCmd, newCancelCmd, newReleaseCmd, newAssignCmd, newRebalanceCmd)
}

// submitFlags are gpuctl submit's options.
type submitFlags struct {
	config string
	file   string
	dryRun bool
	hold   bool
	output string
	spec   jobspec.Flags
}

func newSubmitCmd() *cobra.Command { return submitCmd(&submitFlags{}) }

// submitCmd is gpuctl submit with its flags bound to f.
func submitCmd(f *submitFlags) *cobra.Command {
	cmd := &cobra.Command{
		Use:   "submit (-f job.yaml | --name N --gpus G [flags] -- CMD ARGS...)",
		Short: "Submit a training job, or show where it would run with --dry-run",
		Long: `submit queues a job from a job file or from flags; the command after -- is what every
rank runs. It prints the job id. --dry-run shows the parallel plan and the placement the
scheduler would choose now, without queueing the job. --hold queues it for a manual
'gpuctl assign' instead of the scheduler.`,
		Example: `  gpuctl submit -f job.yaml
  gpuctl submit --name ring --nodes 2 --gpus-per-node 4 -- /opt/ringtrain --steps 1000
  gpuctl submit --name llama --gpus 64 --model llama2-70b --dry-run -- python train.py`,
		RunE: func(cmd *cobra.Command, args []string) error {
			return runSubmit(cmd, f, args)
		},
	}
	fl := cmd.Flags()
	addConfigFlag(cmd, &f.config)
	fl.StringVarP(&f.file, "file", "f", "", "job file (YAML)")
	fl.BoolVar(&f.dryRun, "dry-run", false, "show the plan and placement without submitting")
	fl.BoolVar(&f.hold, "hold", false, "queue the job for `gpuctl assign` rather than the scheduler")
	fl.StringVarP(&f.output, "output", "o", "table", "output format: table or json")
	s := &f.spec
	fl.StringVar(&s.Name, "name", "", "job name (a DNS label)")
	fl.StringVar(&s.Tenant, "tenant", "", "tenant (fair-share account)")
	fl.StringVar(&s.Queue, "queue", "", "queue")
	fl.IntVar(&s.Priority, "priority", 0, "priority, -1000..1000, higher first")
	fl.IntVar(&s.GPUs, "gpus", 0, "total GPUs")
	fl.IntVar(&s.Nodes, "nodes", 0, "whole nodes (with --gpus-per-node)")
	fl.IntVar(&s.GPUsPerNode, "gpus-per-node", 0, "GPUs on each node")
	fl.StringVar(&s.GPUModel, "gpu", "", "GPU model (h100, a100-80gb, …)")
	fl.StringVar(&s.Model, "model", "", "model preset, for the planner")
	fl.IntVar(&s.GlobalBatch, "global-batch", 0, "global batch in sequences")
	fl.IntVar(&s.MicroBatch, "micro-batch", 0, "micro-batch size")
	fl.IntVar(&s.TP, "tp", 0, "tensor parallelism")
	fl.IntVar(&s.CP, "cp", 0, "context parallelism (ring attention)")
	fl.IntVar(&s.PP, "pp", 0, "pipeline parallelism")
	fl.IntVar(&s.DP, "dp", 0, "data parallelism")
	fl.StringVar(&s.CheckpointDir, "checkpoint-dir", "", "checkpoint dir (GPUCTL_CHECKPOINT_DIR); makes the job preemptible and movable")
	fl.DurationVar(&s.CheckpointInterval, "checkpoint-interval", 0, "checkpoint interval")
	fl.DurationVar(&s.EstimatedRuntime, "estimated-runtime", 0, "runtime estimate, for backfill and sjf")
	fl.StringArrayVar(&s.Env, "env", nil, "KEY=VALUE added to every rank's environment (repeatable)")
	fl.StringVar(&s.User, "user", "", "account the ranks run as (name or uid; default: the server's)")
	fl.StringVar(&s.Group, "group", "", "group the ranks run as (default: the user's own)")
	fl.IntSliceVar(&s.ElasticDataParallel, "elastic-dp", nil, "other data-parallel sizes the job accepts")
	return cmd
}

// submitRequest builds the request from a job file or the flags.
func submitRequest(cmd *cobra.Command, f *submitFlags, args []string) (*api.SubmitJobRequest, error) {
	req := &api.SubmitJobRequest{DryRun: f.dryRun, Hold: f.hold}
	dash := cmd.ArgsLenAtDash()
	if f.file != "" {
		if len(args) > 0 {
			return nil, errors.New("submit: give the command in the job file or after --, not both")
		}
		for _, name := range []string{"name", "gpus", "nodes", "gpus-per-node", "tp", "cp", "pp", "dp", "model", "user", "group"} {
			if cmd.Flags().Changed(name) {
				return nil, fmt.Errorf("submit: --%s and -f both describe the job: put it in the file", name)
			}
		}
		data, err := os.ReadFile(f.file)
		if err != nil {
			return nil, fmt.Errorf("submit: %w", err)
		}
		// Checked here too so mistakes show with file and line before any
		// connection is made.
		if _, err := jobspec.Parse(f.file, data); err != nil {
			return nil, err
		}
		req.SpecYaml, req.Source = string(data), f.file
		return req, nil
	}
	if dash < 0 || dash >= len(args) {
		if len(args) > 0 {
			return nil, fmt.Errorf("submit: put the command after --: gpuctl submit [flags] -- %s", strings.Join(args, " "))
		}
		return nil, errors.New("submit: give a job file with -f, or the command after --")
	}
	f.spec.Command = args[dash:]
	spec, err := jobspec.FromFlags(f.spec)
	if err != nil {
		return nil, err
	}
	data, err := yaml.Marshal(spec)
	if err != nil {
		return nil, fmt.Errorf("submit: encode job: %w", err)
	}
	req.SpecYaml, req.Source = string(data), "flags"
	return req, nil
}

func runSubmit(cmd *cobra.Command, f *submitFlags, args []string) error {
	format, err := views.ParseFormat(f.output)
	if err != nil || format == views.Wide {
		return fmt.Errorf("submit: unknown output %q: use table or json", f.output)
	}
	req, err := submitRequest(cmd, f, args)
	if err != nil {
		return err
	}
	c, err := dial(cmd.Context(), f.config)
	if err != nil {
		return err
	}
	defer c.Close()
	resp, err := c.SubmitJob(cmd.Context(), req)
	if err != nil {
		return err
	}
	w := cmd.OutOrStdout()
	o := views.Options{Format: format, Now: time.Now(), Width: terminalWidth(w), Stderr: cmd.ErrOrStderr()}
	switch {
	case f.dryRun:
		return views.DryRun(w, o, resp)
	case format == views.JSON:
		return views.Jobs(w, o, []*api.Job{resp.GetJob()})
	}
	// The id alone on stdout, so scripts can capture it.
	_, err = fmt.Fprintln(w, resp.GetJob().GetId())
	return err
}

func newJobsCmd() *cobra.Command {
	var (
		v viewFlags
		f views.JobFilter
	)
	cmd := &cobra.Command{
		Use:   "jobs [JOB...]",
		Short: "List jobs with their state, placement and why pending ones wait",
		Long: `List jobs, oldest first. Jobs that finished more than a day ago are left out
unless named, asked for by --state, or --all is given (as squeue). NODES is a
Slurm-style host list (node-[00-03]); GPUS reads 4/8 while an elastic job runs
smaller than it was submitted.`,
		RunE: func(cmd *cobra.Command, args []string) error {
			f.Names = args
			return v.run(cmd, func(ctx context.Context, c *client.Client, w io.Writer, o views.Options) error {
				jobs, err := c.Jobs(ctx, "")
				if err != nil {
					return err
				}
				if jobs, err = f.Apply(jobs, o.Now); err != nil {
					return err
				}
				return views.Jobs(w, o, jobs)
			})
		},
	}
	v.add(cmd)
	v.kinds = []api.WatchKind{api.WatchKind_WATCH_KIND_JOBS}
	cmd.Flags().StringSliceVar(&f.States, "state", nil, "only jobs in these states: "+strings.Join(views.JobStateNames(), ", "))
	cmd.Flags().StringVar(&f.Tenant, "tenant", "", "only this tenant's jobs")
	cmd.Flags().BoolVarP(&f.All, "all", "a", false, "include jobs that finished more than a day ago")
	return cmd
}

// jobOutput is the -o flag of the commands that act on one job: table
// prints a sentence, json the job as `gpuctl jobs -o json` does.
func jobOutput(cmd *cobra.Command, p *string) {
	cmd.Flags().StringVarP(p, "output", "o", "table", "output format: table (a sentence) or json (the job, as gpuctl jobs -o json)")
}

// writeJobAction prints what an action did to a job: msg, or the job as
// JSON.
func writeJobAction(cmd *cobra.Command, output string, j *api.Job, msg string) error {
	f, err := views.ParseFormat(output)
	if err != nil || f == views.Wide {
		return fmt.Errorf("unknown output %q: use table or json", output)
	}
	if f == views.JSON {
		return views.Jobs(cmd.OutOrStdout(), views.Options{Format: f, Now: time.Now()}, []*api.Job{j})
	}
	_, err = fmt.Fprintln(cmd.OutOrStdout(), api.EscapeText(msg))
	return err
}

func newCancelCmd() *cobra.Command {
	var config, output string
	cmd := &cobra.Command{
		Use:   "cancel JOB",
		Short: "Cancel a job: SIGTERM to its ranks (SIGKILL after a grace period)",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			return withClient(cmd, config, func(c *client.Client) error {
				j, err := c.CancelJob(cmd.Context(), args[0])
				if err != nil {
					return err
				}
				msg := fmt.Sprintf("%s %s: %s", j.GetId(), views.JobStateName(j.GetState()), j.GetReason())
				live := 0
				for _, n := range views.JobFromAPI(j).Placement {
					for _, r := range n.Ranks {
						if !r.Exited {
							live++
						}
					}
				}
				if live > 0 {
					msg += fmt.Sprintf(" (SIGTERM to %d ranks, SIGKILL after a grace period)", live)
				}
				return writeJobAction(cmd, output, j, msg)
			})
		},
	}
	addConfigFlag(cmd, &config)
	jobOutput(cmd, &output)
	return cmd
}

func newReleaseCmd() *cobra.Command {
	var config, output string
	cmd := &cobra.Command{
		Use:   "release JOB",
		Short: "Let a held job (submit --hold) be scheduled",
		Long: `release hands a job submitted with --hold to the scheduler, as Slurm's
scontrol release does; it then runs once its GPUs are free. To place it on
chosen nodes instead, use gpuctl assign.`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			return withClient(cmd, config, func(c *client.Client) error {
				j, err := c.ReleaseJob(cmd.Context(), args[0])
				if err != nil {
					return err
				}
				msg := fmt.Sprintf("%s released: %s", j.GetId(), views.JobStateName(j.GetState()))
				if r := j.GetPendingReason(); r != "" && j.GetState() == api.JobState_JOB_STATE_PENDING {
					msg += " (" + r + ")"
				}
				return writeJobAction(cmd, output, j, msg)
			})
		},
	}
	addConfigFlag(cmd, &config)
	jobOutput(cmd, &output)
	return cmd
}

func newAssignCmd() *cobra.Command {
	var (
		config, output string
		nodes          []string
	)
	cmd := &cobra.Command{
		Use:   "assign JOB --nodes a,b",
		Short: "Start a pending job on exactly the named nodes",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			if len(nodes) == 0 {
				return errors.New("assign: name the nodes with --nodes a,b")
			}
			return withClient(cmd, config, func(c *client.Client) error {
				j, err := c.AssignJob(cmd.Context(), args[0], nodes)
				if err != nil {
					return err
				}
				var msg strings.Builder
				fmt.Fprintf(&msg, "%s running (attempt %d) on:", j.GetId(), j.GetAttempt())
				for _, n := range views.JobFromAPI(j).Placement {
					gpus := make([]string, len(n.GPUs))
					for i, g := range n.GPUs {
						gpus[i] = fmt.Sprint(g)
					}
					fmt.Fprintf(&msg, "\n  %s  gpus %s", n.Node, strings.Join(gpus, ","))
				}
				if f, _ := views.ParseFormat(output); f == views.JSON {
					return writeJobAction(cmd, output, j, "")
				}
				_, err = fmt.Fprintln(cmd.OutOrStdout(), msg.String())
				return err
			})
		},
	}
	addConfigFlag(cmd, &config)
	cmd.Flags().StringSliceVar(&nodes, "nodes", nil, "nodes to place the job on, comma-separated")
	jobOutput(cmd, &output)
	return cmd
}

func newRebalanceCmd() *cobra.Command {
	var (
		config, output string
		apply          bool
		maxMoves       uint32
	)
	cmd := &cobra.Command{
		Use:   "rebalance [--apply]",
		Short: "Plan (or with --apply carry out) moves that pack running jobs tighter",
		Long: `rebalance asks the placer for checkpoint-restarts of running jobs that lower the
packing cost (fewer fragmented nodes, switches and racks spanned). Only jobs that
checkpoint (their job names a checkpoint dir) are moved. Without --apply it only shows
the plan. With --apply each job in turn is asked to checkpoint (SIGUSR1), stopped once
its checkpoint lands, and relaunched on its new GPUs with GPUCTL_RESUME_STEP set.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			format, err := views.ParseFormat(output)
			if err != nil || format == views.Wide {
				return fmt.Errorf("rebalance: unknown output %q: use table or json", output)
			}
			return withClient(cmd, config, func(c *client.Client) error {
				r, err := c.Rebalance(cmd.Context(), apply, maxMoves)
				if err != nil {
					return err
				}
				return views.Rebalance(cmd.OutOrStdout(), views.Options{Format: format, Now: time.Now()}, r)
			})
		},
	}
	addConfigFlag(cmd, &config)
	cmd.Flags().BoolVar(&apply, "apply", false, "carry out the moves")
	cmd.Flags().Uint32Var(&maxMoves, "max-moves", 0, "most moves to plan (default: the server's, 8)")
	cmd.Flags().StringVarP(&output, "output", "o", "table", "output format: table or json")
	return cmd
}
