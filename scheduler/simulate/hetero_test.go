package simulate

import (
	"flag"
	"fmt"
	"strings"
	"testing"

	"github.com/gpuctl/gpuctl/scheduler"
	"github.com/gpuctl/gpuctl/scheduler/trace"
)

var heteroStudy = flag.Bool("hetero-study", false, "run the mixed A100/H100 study over 5 seeds and print the table of docs/scheduling.md")

// TestStudyHeteroOnPhilly runs the mixed-cluster study on the Philly
// trace's held-out 40% (the estimates study's split): type allocation must
// run more of the work on each job's faster model than the type-agnostic
// scheduler. With -hetero-study it runs 5 seeds and prints the table.
func TestStudyHeteroOnPhilly(t *testing.T) {
	seeds := 2
	if *heteroStudy {
		seeds = 5
	}
	st, err := StudyHetero(loadPhilly(t), 0.6, seeds, []string{"a100", "h100"}, []string{"fifo", "backfill", "las"}, Config{})
	if err != nil {
		t.Fatal(err)
	}
	agnostic := map[string]HeteroRun{}
	for _, r := range st.Runs {
		base, _, aware := strings.Cut(strings.TrimSuffix(r.Policy, " (type-agnostic)"), "+max-")
		if !aware {
			agnostic[base] = r
			continue
		}
		if a := agnostic[base]; r.BestTypeShare <= a.BestTypeShare {
			t.Errorf("%s ran %.3f of its GPU time on jobs' faster model, type-agnostic %s %.3f", r.Policy, r.BestTypeShare, base, a.BestTypeShare)
		}
	}
	if !*heteroStudy {
		return
	}
	var b strings.Builder
	fmt.Fprintf(&b, "%d held-out jobs (%d before them left out) on %d nodes (%d %s, %d %s), %d seeds; mean speedup of %s over %s %.2f×\n\n",
		st.TestJobs, st.TrainJobs, st.Nodes, st.Nodes/2, st.Models[0], st.Nodes-st.Nodes/2, st.Models[1], st.Seeds, st.Models[1], st.Models[0], st.Speedup[1])
	b.WriteString("| policy | mean JCT (s) | p99 JCT (s) | makespan (s) | utilisation | fairness (Jain) | GPU time on the faster model |\n|---|---|---|---|---|---|---|\n")
	for _, r := range st.Runs {
		fmt.Fprintf(&b, "| %s | %.0f ± %.0f | %.0f ± %.0f | %.0f ± %.0f | %.3f ± %.3f | %.3f ± %.3f | %.3f |\n", r.Policy,
			r.MeanJCT, r.MeanJCTCI, r.P99JCT, r.P99JCTCI, r.Makespan, r.MakespanCI, r.Utilization, r.UtilizationCI,
			r.Fairness, r.FairnessCI, r.BestTypeShare)
	}
	fmt.Print(b.String())
}

// TestRunMixedSpeed: a job allowed both models runs its work at the faster
// one's speed when that is free; a mix of one model is refused.
func TestRunMixedSpeed(t *testing.T) {
	rates := func(trace.Job) []float64 { return []float64{1, 2} }
	jobs := []trace.Job{{ID: "a", GPUs: 8, Runtime: 1000}}
	res := run(t, jobs, Config{Nodes: 2, GPUsPerNode: 8, Policy: scheduler.WithHetero(scheduler.FIFO{}, scheduler.MaxThroughput),
		Mix: &Mix{Models: []string{"a100", "h100"}, Rates: rates}})
	if res.MeanJCT != 500 || res.BestTypeShare != 1 {
		t.Fatalf("JCT %.0f (want 500: twice as fast on h100), best-type share %.2f", res.MeanJCT, res.BestTypeShare)
	}
	_, err := Run(jobs, Config{Nodes: 2, GPUsPerNode: 8, Policy: scheduler.FIFO{}, Mix: &Mix{Models: []string{"a100"}, Rates: rates}})
	if err == nil || !strings.Contains(err.Error(), "two or more models") {
		t.Fatalf("one model: %v", err)
	}
}
