package main

import (
	"fmt"
	"io"
	"os"

	"github.com/spf13/cobra"

	"github.com/gpuctl/gpuctl/scheduler"
	"github.com/gpuctl/gpuctl/scheduler/predict"
	"github.com/gpuctl/gpuctl/scheduler/simulate"
	"github.com/gpuctl/gpuctl/scheduler/trace"
	"github.com/gpuctl/gpuctl/views"
)

func newSimulateTrainCmd() *cobra.Command {
	var (
		tracePath, jobsPath, out string
		fraction                 float64
		minSupport               int
		policyOut, policyFor     string
		search                   simulate.Learning
	)
	cmd := &cobra.Command{
		Use:   "train",
		Short: "Learn a runtime model from finished jobs, for gpuctl serve --runtime-model",
		Long: `Learn how long jobs run from finished ones: a trace (--trace, Philly JSON or CSV),
or this cluster's own jobs as 'gpuctl jobs -o json' lists them (--jobs FILE, - for
stdin; the succeeded ones, each as long as its attempts ran). The model groups
similar past jobs (same user and name pattern, name pattern, user, tenant at that
size, size at that time of day, size) and predicts a job's runtime from the most specific
group with --min-support jobs; gpuctl serve --runtime-model gives it to jobs whose
file names no estimated_runtime, for sjf and backfill.

With --train-fraction below 1 it learns on that first part of the jobs in
submission order and reports its accuracy on the rest, beside one runtime for
every job (the baseline a model must beat), before writing the model learned on
that part.

With --policy-out it also learns the weights of the "learned" policy (a linear
score of a job's size, expected runtime, attained service and wait, lowest
first) by replaying the jobs it learns from in the simulator with the model's
runtimes, for gpuctl serve --policy learned+backfill --policy-weights FILE; below
1 it reports the policy against sjf on the rest.`,
		Example: `  gpuctl simulate train --trace scheduler/trace/testdata/philly-multigpu-3034.json --train-fraction 0.6 -o runtimes.json
  gpuctl jobs -o json | gpuctl simulate train --jobs - -o runtimes.json`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if (tracePath == "") == (jobsPath == "") {
				return fmt.Errorf("give one of --trace FILE or --jobs FILE (gpuctl jobs -o json)")
			}
			if out == "" {
				return fmt.Errorf("-o FILE is required: where to write the model (- for stdout)")
			}
			if fraction <= 0 || fraction > 1 {
				return fmt.Errorf("--train-fraction %v: give one in (0, 1]", fraction)
			}
			var jobs []trace.Job
			var err error
			if tracePath != "" {
				jobs, err = trace.Load(tracePath)
			} else {
				jobs, err = finishedJobs(cmd.InOrStdin(), jobsPath)
			}
			if err != nil {
				return err
			}
			learn, tested := jobs, []trace.Job(nil)
			if fraction < 1 {
				train, test, err := simulate.Split(jobs, fraction)
				if err != nil {
					return err
				}
				learn, tested = train, test
				a, b := simulate.HoldOut(predict.Train(simulate.Records(train), minSupport), test)
				fmt.Fprintf(cmd.ErrOrStderr(), "learned on %d jobs, tested on the %d after them:\n", len(train), len(test))
				fmt.Fprintf(cmd.ErrOrStderr(), "  model:              median factor %.2f, %.0f%% within 2×, %.0f%% short\n", a.MedianFactor, 100*a.Within2, 100*a.Under)
				fmt.Fprintf(cmd.ErrOrStderr(), "  one mean runtime:   median factor %.2f, %.0f%% within 2×, %.0f%% short\n", b.MedianFactor, 100*b.Within2, 100*b.Under)
			}
			model := predict.Train(simulate.Records(learn), minSupport)
			if policyOut != "" {
				if err := learnPolicy(cmd, learn, tested, model, policyFor, policyOut, search); err != nil {
					return err
				}
			}
			w := cmd.OutOrStdout()
			if out != "-" {
				f, err := os.Create(out)
				if err != nil {
					return err
				}
				defer f.Close()
				w = f
			}
			if err := model.Write(w); err != nil {
				return err
			}
			if out != "-" {
				fmt.Fprintf(cmd.ErrOrStderr(), "wrote %s: %d groups from %d jobs\n", out, len(model.Groups), len(learn))
			}
			return nil
		},
	}
	f := cmd.Flags()
	f.StringVar(&tracePath, "trace", "", "a job trace (Philly .json or .csv)")
	f.StringVar(&jobsPath, "jobs", "", "gpuctl jobs -o json output (- for stdin)")
	f.StringVarP(&out, "output", "o", "", "where to write the model (- for stdout)")
	f.Float64Var(&fraction, "train-fraction", 1, "learn on this first part of the jobs (by submission) and test on the rest")
	f.IntVar(&minSupport, "min-support", predict.DefaultMinSupport, "past jobs a group needs before it predicts")
	f.StringVar(&policyOut, "policy-out", "", "also learn the learned policy's weights and write them here")
	f.StringVar(&policyFor, "policy-for", "learned+backfill", "the policy the weights are for: learned or learned+backfill")
	f.IntVar(&search.Iterations, "learn-iterations", 12, "--policy-out: iterations of the search")
	f.IntVar(&search.Samples, "learn-samples", 16, "--policy-out: weight vectors tried in each")
	f.Uint64Var(&search.Seed, "seed", 1, "--policy-out: the search's seed")
	return cmd
}

// finishedJobs reads the succeeded jobs of the `gpuctl jobs -o json`
// document at path (- for stdin) as a trace.
func finishedJobs(stdin io.Reader, path string) ([]trace.Job, error) {
	r := stdin
	if path != "-" {
		f, err := os.Open(path)
		if err != nil {
			return nil, err
		}
		defer f.Close()
		r = f
	}
	jobs, err := views.FinishedJobs(r)
	if err != nil {
		return nil, fmt.Errorf("--jobs %s: %w", path, err)
	}
	return jobs, nil
}

// learnPolicy learns the scored policy's weights on the jobs the model
// learned from (told the model's runtimes), writes them, and with test
// jobs reports it against sjf on them.
func learnPolicy(cmd *cobra.Command, train, test []trace.Job, model *predict.Model, policyFor, out string, l simulate.Learning) error {
	if policyFor != "learned" && policyFor != "learned+backfill" {
		return fmt.Errorf("--policy-for %q: use learned or learned+backfill", policyFor)
	}
	estimate := func(tj trace.Job) int64 { return max(model.Predict(simulate.Features(tj)).Seconds, 1) }
	l.Backfill = policyFor == "learned+backfill"
	cfg := simulate.Config{GPUsPerNode: 8, Nodes: simulate.ClusterSize(train, 8), Estimate: estimate}
	w, curve, err := simulate.LearnPolicy(train, cfg, l)
	if err != nil {
		return err
	}
	fmt.Fprintf(cmd.ErrOrStderr(), "policy %s: mean JCT on the jobs it learned from %.0f s (sjf's order: %.0f s)\n", policyFor, curve[len(curve)-1], curve[0])
	if test != nil {
		tc := simulate.Config{GPUsPerNode: 8, Nodes: simulate.ClusterSize(test, 8), Estimate: estimate}
		base := "sjf"
		if l.Backfill {
			base = "sjf+backfill"
		}
		for _, name := range []string{policyFor, base} {
			p, err := scheduler.PolicyWithWeights(name, &w)
			if err != nil {
				return err
			}
			tc.Policy = p
			res, err := simulate.Run(test, tc)
			if err != nil {
				return err
			}
			fmt.Fprintf(cmd.ErrOrStderr(), "  on the %d jobs after them, %-16s mean JCT %.0f s, p99 %.0f s\n", len(test), name, res.MeanJCT, res.P99JCT)
		}
	}
	f, err := os.Create(out)
	if err != nil {
		return err
	}
	defer f.Close()
	if err := scheduler.WriteWeights(f, w); err != nil {
		return err
	}
	fmt.Fprintf(cmd.ErrOrStderr(), "wrote %s: weights for %s\n", out, policyFor)
	return nil
}
