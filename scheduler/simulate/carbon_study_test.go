package simulate

import (
	"flag"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/gpuctl/gpuctl/scheduler"
	"github.com/gpuctl/gpuctl/scheduler/carbon"
	"github.com/gpuctl/gpuctl/scheduler/trace"
)

var carbonStudy = flag.Bool("carbon-study", false, "replay the Philly trace over 5 seeds with and without the carbon-aware option and print the table of docs/scheduling.md")

// studyFraction of jobs are deferrable (by 12 h beyond their work), chosen
// per seed by a hash of the seed and the job id.
const studyFraction = 0.3

// studyNodes is twice ClusterSize's 37 nodes for the trace: at the trace's
// mean load the queue holds jobs for weeks and no policy moves them by hours.
var studyNodes = 74

type studyRun struct{ base, carbon Result }

func studyOnce(t *testing.T, jobs []trace.Job, in *carbon.Intensities, seed uint64) studyRun {
	t.Helper()
	pol, err := scheduler.PolicyByName(scheduler.DefaultPolicy)
	if err != nil {
		t.Fatal(err)
	}
	cfg := Config{Nodes: studyNodes, GPUsPerNode: 8, Sites: []string{"solar", "wind"}, Intensity: in, Deferrable: studyFraction, Seed: seed, Policy: pol}
	base := run(t, jobs, cfg)
	cfg.Policy = scheduler.WithCarbon(pol, in)
	return studyRun{base, run(t, jobs, cfg)}
}

func studyInputs(t *testing.T) ([]trace.Job, *carbon.Intensities) {
	jobs, err := trace.Load(filepath.Join("..", "trace", "testdata", "philly-multigpu-3034.json"))
	if err != nil {
		t.Fatal(err)
	}
	f, err := os.Open(filepath.Join("testdata", "two-sites.carbon"))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	in, err := carbon.Parse(f, f.Name())
	if err != nil {
		t.Fatal(err)
	}
	return jobs, in
}

// TestCarbonAwareOnPhilly replays the Philly trace with 30% of jobs
// deferrable: the option must emit less and no deferrable job may miss its
// deadline. With -carbon-study it runs 5 seeds and prints the table.
func TestCarbonAwareOnPhilly(t *testing.T) {
	jobs, in := studyInputs(t)
	seeds := []uint64{1}
	if *carbonStudy {
		seeds = []uint64{1, 2, 3, 4, 5}
	}
	var saved, dMean, dP99, holds, missed []float64
	var last studyRun
	for _, seed := range seeds {
		r := studyOnce(t, jobs, in, seed)
		if r.carbon.KgCO2e >= r.base.KgCO2e {
			t.Errorf("seed %d: %.0f kgCO2e with the option, %.0f without", seed, r.carbon.KgCO2e, r.base.KgCO2e)
		}
		if r.base.DeferrableJobs == 0 || r.carbon.Holds == 0 {
			t.Errorf("seed %d: %d deferrable jobs, %d holds", seed, r.base.DeferrableJobs, r.carbon.Holds)
		}
		saved = append(saved, 100*(r.base.KgCO2e-r.carbon.KgCO2e)/r.base.KgCO2e)
		dMean = append(dMean, 100*(r.carbon.MeanJCT-r.base.MeanJCT)/r.base.MeanJCT)
		dP99 = append(dP99, 100*(r.carbon.P99JCT-r.base.P99JCT)/r.base.P99JCT)
		holds = append(holds, float64(r.carbon.Holds))
		missed = append(missed, float64(r.carbon.MissedDeadlines-r.base.MissedDeadlines))
		last = r
		t.Logf("seed %d: %d jobs (%d deferrable) on %d GPUs: %.0f → %.0f kgCO2e (%.1f%% saved, %.0f kWh → %.0f kWh); mean JCT %.0f → %.0f s; p99 JCT %.0f → %.0f s; missed deadlines %d → %d",
			seed, r.base.Jobs, r.base.DeferrableJobs, r.base.GPUs, r.base.KgCO2e, r.carbon.KgCO2e, saved[len(saved)-1],
			r.base.EnergyKWh, r.carbon.EnergyKWh, r.base.MeanJCT, r.carbon.MeanJCT, r.base.P99JCT, r.carbon.P99JCT,
			r.base.MissedDeadlines, r.carbon.MissedDeadlines)
	}
	if !*carbonStudy {
		return
	}
	var b strings.Builder
	fmt.Fprintf(&b, "| %s, %d jobs, %d GPUs, %d%% deferrable, %d seeds | mean | 95%% CI |\n|---|---|---|\n",
		last.base.Policy, last.base.Jobs, last.base.GPUs, int(studyFraction*100), len(seeds))
	for _, row := range []struct {
		name string
		v    []float64
	}{
		{"kgCO2e saved (%)", saved},
		{"mean JCT change (%)", dMean},
		{"p99 JCT change (%)", dP99},
		{"holds decided", holds},
		{"extra missed deadlines", missed},
	} {
		m, h := meanCI(row.v)
		fmt.Fprintf(&b, "| %s | %.2f | ±%.2f |\n", row.name, m, h)
	}
	fmt.Print(b.String())
}

// meanCI is the mean and the half-width of its 95% confidence interval
// (Student's t; up to 10 samples).
func meanCI(v []float64) (float64, float64) {
	var sum, sq float64
	for _, x := range v {
		sum += x
	}
	m := sum / float64(len(v))
	if len(v) < 2 {
		return m, 0
	}
	for _, x := range v {
		sq += (x - m) * (x - m)
	}
	t975 := []float64{12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262}
	return m, t975[min(len(v)-2, len(t975)-1)] * math.Sqrt(sq/float64(len(v)-1)/float64(len(v)))
}
