package main

import (
	"encoding/json"
	"fmt"
	"io"
	"os"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"

	"github.com/gpuctl/gpuctl/scheduler"
	"github.com/gpuctl/gpuctl/scheduler/simulate"
	"github.com/gpuctl/gpuctl/scheduler/trace"
)

func init() { subcommands = append(subcommands, newSimulateCmd) }

// comparePolicies are the policies --compare runs side by side.
var comparePolicies = []string{"fifo", "sjf", "las", "priority", "fair", "backfill", "sjf+backfill", "las+backfill"}

func newSimulateCmd() *cobra.Command {
	var (
		tracePath, policy, output string
		nodes, gpn, tenants       int
		ckpt                      time.Duration
		compare, noEstimates      bool
	)
	cmd := &cobra.Command{
		Use:   "simulate",
		Short: "Replay a job trace through the scheduler in virtual time",
		Long: `Replay a trace (Philly JSON or CSV) through gpuctl's scheduler on a synthetic
cluster of racks of 32 nodes, and report JCT, queueing, utilization, restarts
and lost GPU-hours. --nodes 0 sizes the cluster to the smallest on which every
job fits and whose GPUs cover the trace's mean offered load.

Philly trace: Jeon et al., "Analysis of Large-Scale Multi-Tenant GPU Clusters
for DNN Training Workloads", USENIX ATC 2019 (marwage/philly-traces, CC BY 4.0).`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if tracePath == "" {
				tracePath = os.Getenv("GPUCTL_TRACE")
			}
			if tracePath == "" {
				return fmt.Errorf("no trace: pass --trace FILE (.json Philly or .csv) or set GPUCTL_TRACE")
			}
			if output != "table" && output != "json" {
				return fmt.Errorf("-o %q: use table or json", output)
			}
			if ckpt < time.Second {
				return fmt.Errorf("--checkpoint-interval %s: must be at least 1s", ckpt)
			}
			jobs, err := trace.Load(tracePath)
			if err != nil {
				return err
			}
			names := []string{policy}
			if compare {
				names = comparePolicies
			}
			var rows []simRow
			for _, name := range names {
				p, err := scheduler.PolicyByName(name)
				if err != nil {
					return err
				}
				start := time.Now()
				res, err := simulate.Run(jobs, simulate.Config{
					Nodes: nodes, GPUsPerNode: gpn, Policy: p, Tenants: tenants,
					CheckpointInterval: int64(ckpt / time.Second), NoEstimates: noEstimates,
				})
				if err != nil {
					return err
				}
				rows = append(rows, simRow{Result: res, WallSeconds: time.Since(start).Seconds()})
			}
			if output == "json" {
				enc := json.NewEncoder(cmd.OutOrStdout())
				enc.SetIndent("", "  ")
				return enc.Encode(rows)
			}
			return printSimTable(cmd.OutOrStdout(), tracePath, rows)
		},
	}
	f := cmd.Flags()
	f.StringVar(&tracePath, "trace", "", "trace file: .json (Philly) or .csv (id,submit_seconds,gpus,runtime_seconds[,tenant,priority,failures]); default $GPUCTL_TRACE")
	f.IntVar(&nodes, "nodes", 0, "nodes in the cluster (0: smallest that fits every job and the mean load)")
	f.IntVar(&gpn, "gpus-per-node", 8, "GPUs per node")
	f.StringVar(&policy, "policy", "fifo", "queue policy: "+strings.Join(scheduler.PolicyNames(), ", "))
	f.BoolVar(&compare, "compare", false, "run every policy on the same trace and cluster, side by side")
	f.StringVarP(&output, "output", "o", "table", "output: table or json")
	f.DurationVar(&ckpt, "checkpoint-interval", 30*time.Minute, "running time between a job's checkpoints; a failure loses the work since the last one")
	f.IntVar(&tenants, "tenants", 4, "synthetic tenants for jobs without one, assigned by a hash of the job id (for fair share)")
	f.BoolVar(&noEstimates, "no-estimates", false, "hide runtimes from the scheduler (sjf and backfill then have nothing to go on)")
	return cmd
}

// simRow is one policy's result with the wall time the replay took.
type simRow struct {
	simulate.Result
	WallSeconds float64
}

func printSimTable(w io.Writer, tracePath string, rows []simRow) error {
	if len(rows) == 0 {
		return nil
	}
	r0 := rows[0]
	fmt.Fprintf(w, "trace %s: %d jobs on %d nodes × %d GPUs (%d GPUs), checkpoint every %s\n\n",
		tracePath, r0.Jobs, r0.Nodes, r0.GPUs/max(r0.Nodes, 1), r0.GPUs, time.Duration(r0.CheckpointSeconds)*time.Second)
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "POLICY\tMEAN JCT\tP50 JCT\tP95 JCT\tP99 JCT\tMEAN QUEUE\tMAKESPAN\tUTIL\tRESTARTS\tPREEMPT\tLOST GPU-H\tWALL\t")
	hours := func(s float64) string { return fmt.Sprintf("%.1fh", s/3600) }
	for _, r := range rows {
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\t%s\t%.1f%%\t%d\t%d\t%.0f\t%.2fs\t\n",
			r.Policy, hours(r.MeanJCT), hours(r.P50JCT), hours(r.P95JCT), hours(r.P99JCT), hours(r.MeanQueue),
			hours(float64(r.Makespan)), 100*r.Utilization, r.Restarts, r.Preemptions, r.LostGPUHours, r.WallSeconds)
	}
	return tw.Flush()
}
