package simulate

import (
	"fmt"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/gpuctl/gpuctl/scheduler/predict"
	"github.com/gpuctl/gpuctl/scheduler/trace"
)

func TestSplitKeepsTimeOrder(t *testing.T) {
	jobs := []trace.Job{{ID: "c", Submit: 300}, {ID: "a", Submit: 100}, {ID: "b", Submit: 200}, {ID: "d", Submit: 400}}
	train, test, err := Split(jobs, 0.5)
	if err != nil {
		t.Fatal(err)
	}
	if got := fmt.Sprint(ids(train), ids(test), test[0].Submit, test[1].Submit); got != "[a b] [c d] 0 100" {
		t.Errorf("split: %s", got)
	}
	for _, f := range []float64{0, 1, 0.1} {
		if _, _, err := Split(jobs, f); err == nil {
			t.Errorf("fraction %v of 4 jobs accepted", f)
		}
	}
}

func ids(jobs []trace.Job) []string {
	var out []string
	for _, j := range jobs {
		out = append(out, j.ID)
	}
	return out
}

// TestStudyEstimatesOnPhilly learns on the first 60% of the Philly trace
// and schedules the rest: every variant runs, and the table is logged.
func TestStudyEstimatesOnPhilly(t *testing.T) {
	jobs, err := trace.Load("../trace/testdata/philly-multigpu-3034.json")
	if err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	// A short search in make test; make bench-estimates searches longer.
	learn := &Learning{Iterations: 3, Samples: 6, Elite: 2, Seed: 1}
	if os.Getenv("GPUCTL_BENCH_ESTIMATES") != "" {
		learn = &Learning{Seed: 1}
	}
	st, err := StudyEstimates(jobs, 0.6, 5, Config{GPUsPerNode: 8}, learn)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("study took %s", time.Since(start).Round(time.Millisecond))
	if st.TrainJobs+st.TestJobs != len(jobs) || st.Predicted.N != st.TestJobs {
		t.Errorf("study: %d train + %d test of %d jobs, %d predicted", st.TrainJobs, st.TestJobs, len(jobs), st.Predicted.N)
	}
	var b strings.Builder
	fmt.Fprintf(&b, "predicted: %+v\nmodel alone: %+v\nlimits: %+v\none mean: %+v\n", st.Predicted, st.Model, st.Limits, st.Mean)
	for _, r := range st.Runs {
		fmt.Fprintf(&b, "%-9s %-9s mean %8.0f ±%6.0f p99 %9.0f ±%7.0f span %9.0f util %.3f\n", r.Policy, r.Estimates, r.MeanJCT, r.MeanJCTCI, r.P99JCT, r.P99JCTCI, r.Makespan, r.Utilization)
	}
	for _, l := range st.Learned {
		fmt.Fprintf(&b, "%s: weights %+v, best mean JCT on the first part by iteration %.0f\n", l.Name, l.Weights, l.Curve)
		// The search starts from SJF on the first part: it never ends worse.
		for i := 1; i < len(l.Curve); i++ {
			if l.Curve[i] > l.Curve[i-1] {
				t.Errorf("%s: the best mean JCT rose from %.0f to %.0f", l.Name, l.Curve[i-1], l.Curve[i])
			}
		}
	}
	t.Log("\n" + b.String())
	// Capped by the limits, the model must tell the scheduler more than
	// the limits alone. (Alone, it does not beat one mean runtime on this
	// trace: docs/scheduling.md says so.)
	if st.Predicted.MedianFactor >= st.Limits.MedianFactor || st.Predicted.Within2 <= st.Limits.Within2 {
		t.Errorf("the model under the limits (median factor %.2f, %.0f%% within 2×) is no better than the limits (%.2f, %.0f%%)",
			st.Predicted.MedianFactor, 100*st.Predicted.Within2, st.Limits.MedianFactor, 100*st.Limits.Within2)
	}
	if len(st.Runs) != 11 {
		t.Errorf("%d runs, want 11", len(st.Runs))
	}
}

func TestHoldOut(t *testing.T) {
	// Two tenants whose jobs each run as long as their last: the model
	// learns each exactly, the one runtime for all cannot.
	var train, test []trace.Job
	for i := range 40 {
		user, run := "a", int64(600)
		if i%2 == 1 {
			user, run = "b", 36000
		}
		j := trace.Job{ID: fmt.Sprint(i), Tenant: user, Name: user + "-train", GPUs: 8, Submit: int64(i) * 60, Runtime: run}
		if i < 30 {
			train = append(train, j)
		} else {
			test = append(test, j)
		}
	}
	model, mean := HoldOut(predict.Train(Records(train), 0), test)
	if model.N != len(test) || mean.N != len(test) {
		t.Fatalf("scored %d and %d jobs, want %d", model.N, mean.N, len(test))
	}
	if model.MedianFactor != 1 || mean.MedianFactor <= 2 {
		t.Errorf("median factor: model %.2f (want 1), one runtime %.2f (want above 2)", model.MedianFactor, mean.MedianFactor)
	}
}
