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

func run(t *testing.T, jobs []trace.Job, cfg Config) Result {
	t.Helper()
	r, err := Run(jobs, cfg)
	if err != nil {
		t.Fatal(err)
	}
	return r
}

func near(a, b float64) bool { return math.Abs(a-b) < 1e-6 }

func TestRunFIFO(t *testing.T) {
	jobs := []trace.Job{
		{ID: "a", Submit: 0, GPUs: 16, Runtime: 100},
		{ID: "b", Submit: 10, GPUs: 8, Runtime: 50},
	}
	r := run(t, jobs, Config{Nodes: 2, GPUsPerNode: 8, Policy: scheduler.FIFO{}})
	// a runs 0-100, b 100-150.
	if r.Makespan != 150 || !near(r.MeanJCT, 120) || !near(r.MeanQueue, 45) || r.P99JCT != 140 || r.P50JCT != 100 {
		t.Fatalf("result %+v", r)
	}
	if !near(r.Utilization, 2000.0/(16*150)) {
		t.Fatalf("utilization %v", r.Utilization)
	}
}

func TestRunFailuresLoseWorkSinceCheckpoint(t *testing.T) {
	// Recorded: 100 s of execution with a failure at 40 s. Checkpoints every
	// 30 s: the failure loses 10 s, so the job's work is 90 s and an
	// uninterrupted replay takes the recorded 100 s.
	jobs := []trace.Job{{ID: "a", GPUs: 8, Runtime: 100, Failures: []int64{40}}}
	r := run(t, jobs, Config{Nodes: 1, GPUsPerNode: 8, Policy: scheduler.FIFO{}, CheckpointInterval: 30})
	if r.Restarts != 1 || r.Makespan != 100 || !near(r.LostGPUHours, 10*8/3600.0) {
		t.Fatalf("result %+v", r)
	}
}

func TestRunBackfillNeverDelaysHead(t *testing.T) {
	jobs := []trace.Job{
		{ID: "a", Submit: 0, GPUs: 8, Runtime: 100},
		{ID: "big", Submit: 1, GPUs: 16, Runtime: 10},
		{ID: "c", Submit: 2, GPUs: 8, Runtime: 50},
	}
	fifo := run(t, jobs, Config{Nodes: 2, GPUsPerNode: 8, Policy: scheduler.FIFO{}})
	bf := run(t, jobs, Config{Nodes: 2, GPUsPerNode: 8, Policy: scheduler.EASY{Base: scheduler.FIFO{}}})
	// FIFO: a 0-100, big 100-110, c 110-160. Backfill: c 2-52 beside a,
	// big still 100-110.
	if fifo.Makespan != 160 || bf.Makespan != 110 || bf.BackfilledStarts != 1 {
		t.Fatalf("fifo %+v\nbackfill %+v", fifo, bf)
	}
	if !near(bf.MeanJCT, (100+109+50)/3.0) {
		t.Fatalf("backfill mean JCT %v", bf.MeanJCT)
	}
}

func TestRunPreemptionCheckpoints(t *testing.T) {
	jobs := []trace.Job{
		{ID: "low", Submit: 0, GPUs: 8, Runtime: 1000},
		{ID: "high", Submit: 100, GPUs: 8, Runtime: 100, Priority: 5},
	}
	r := run(t, jobs, Config{Nodes: 1, GPUsPerNode: 8, Policy: scheduler.PriorityAging{Preempt: true, GraceSec: 10}})
	// high preempts at 100, low checkpoints and stops at 110 (no work
	// lost), high runs 110-210, low resumes for its last 890 s.
	if r.Preemptions != 1 || r.LostGPUHours != 0 || r.Makespan != 1100 {
		t.Fatalf("result %+v", r)
	}
}

func TestRunErrors(t *testing.T) {
	jobs := []trace.Job{{ID: "a", GPUs: 32, Runtime: 10}}
	tests := []struct {
		cfg  Config
		want string
	}{
		{Config{Nodes: 2, GPUsPerNode: 8, Policy: scheduler.FIFO{}}, "needs 32 GPUs"},
		{Config{Nodes: 4, GPUsPerNode: 8}, "no policy"},
		{Config{Nodes: 4, Policy: scheduler.FIFO{}}, "GPUs per node"},
	}
	for _, tc := range tests {
		if _, err := Run(jobs, tc.cfg); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%+v: err %v, want %q", tc.cfg, err, tc.want)
		}
	}
	if _, err := Run(nil, Config{}); err == nil {
		t.Error("empty trace accepted")
	}
}

func TestClusterSize(t *testing.T) {
	jobs := []trace.Job{
		{ID: "a", Submit: 0, GPUs: 64, Runtime: 10},
		{ID: "b", Submit: 100, GPUs: 8, Runtime: 10000},
	}
	// Largest job: 8 nodes. Load: (640+80000)/100 = 806.4 GPUs: 101 nodes.
	if got := ClusterSize(jobs, 8); got != 101 {
		t.Fatalf("size %d", got)
	}
	if got := ClusterSize(jobs[:1], 8); got != 8 {
		t.Fatalf("single job size %d", got)
	}
}

// phillyPath is the Philly trace committed in scheduler/trace/testdata
// (Jeon et al., ATC'19; CC BY 4.0: see its README.md).
var phillyPath = filepath.Join("..", "trace", "testdata", "philly-multigpu-3034.json")

func loadPhilly(tb testing.TB) []trace.Job {
	tb.Helper()
	jobs, err := trace.Load(phillyPath)
	if err != nil {
		tb.Fatal(err)
	}
	return jobs
}

func TestPhillyReplay(t *testing.T) {
	if testing.Short() {
		t.Skip("replays the whole trace")
	}
	jobs := loadPhilly(t)
	for _, name := range []string{"backfill", "las+backfill"} {
		p, _ := scheduler.PolicyByName(name)
		r := run(t, jobs, Config{GPUsPerNode: 8, Policy: p, Tenants: 4})
		if r.Jobs != 3034 || r.Nodes != 37 || r.Restarts < 816 || r.Utilization <= 0.5 || r.Utilization > 1 {
			t.Fatalf("%s: %+v", name, r)
		}
	}
}

func BenchmarkSimulatePhilly(b *testing.B) {
	jobs := loadPhilly(b)
	for _, name := range []string{"fifo", "backfill", "las+backfill"} {
		b.Run(name, func(b *testing.B) {
			p, _ := scheduler.PolicyByName(name)
			for b.Loop() {
				if _, err := Run(jobs, Config{GPUsPerNode: 8, Policy: p, Tenants: 4}); err != nil {
					b.Fatal(err)
				}
			}
			sec := b.Elapsed().Seconds() / float64(b.N)
			b.ReportMetric(sec, "s/replay")
			b.ReportMetric(float64(len(jobs))/sec, "jobs/s")
		})
	}
}

// twoSiteIntensity: site=solar is 450 gCO2e/kWh except a 100 dip from 10:00
// to 16:00 UTC; site=grid is 300 all day.
func twoSiteIntensity(t testing.TB) *carbon.Intensities {
	solar := "site=solar" + strings.Repeat(" 450", 10) + strings.Repeat(" 100", 6) + strings.Repeat(" 450", 8)
	in, err := carbon.Parse(strings.NewReader(solar+"\nsite=grid"+strings.Repeat(" 300", 24)+"\n"), "test")
	if err != nil {
		t.Fatal(err)
	}
	return in
}

func TestRunCarbonAccounting(t *testing.T) {
	in := twoSiteIntensity(t)
	// One 8-GPU job for an hour from 00:00 on the solar site (node0000):
	// 8 × 0.7 kW × 1 h = 5.6 kWh at 450 g/kWh.
	jobs := []trace.Job{{ID: "a", GPUs: 8, Runtime: 3600}}
	r := run(t, jobs, Config{Nodes: 2, GPUsPerNode: 8, Policy: scheduler.FIFO{}, Sites: []string{"solar", "grid"}, Intensity: in})
	if !near(r.EnergyKWh, 5.6) || !near(r.KgCO2e, 5.6*0.45) {
		t.Fatalf("energy %g kWh, %g kgCO2e", r.EnergyKWh, r.KgCO2e)
	}
	// No curve: energy, and no emissions.
	r = run(t, jobs, Config{Nodes: 2, GPUsPerNode: 8, Policy: scheduler.FIFO{}})
	if !near(r.EnergyKWh, 5.6) || r.KgCO2e != 0 {
		t.Fatalf("without a curve: energy %g kWh, %g kgCO2e", r.EnergyKWh, r.KgCO2e)
	}
}

func TestRunCarbonAwareDefers(t *testing.T) {
	in := twoSiteIntensity(t)
	// Both jobs arrive at 06:00 and run an hour; "d" may wait 12 h. Two
	// nodes, one a site, so each job fits on either.
	jobs := []trace.Job{{ID: "d", Submit: 6 * 3600, GPUs: 8, Runtime: 3600}, {ID: "n", Submit: 6 * 3600, GPUs: 8, Runtime: 3600}}
	cfg := Config{Nodes: 2, GPUsPerNode: 8, Sites: []string{"solar", "grid"}, Intensity: in, Deferrable: 1, Seed: 1}
	cfg.Policy = scheduler.WithCarbon(scheduler.FIFO{}, in)
	// Every job deferrable: both wait for 10:00 on the solar site.
	r := run(t, jobs, cfg)
	if r.DeferrableJobs != 2 || r.MissedDeadlines != 0 || r.Holds == 0 {
		t.Fatalf("deferred %d, holds %d, missed %d", r.DeferrableJobs, r.Holds, r.MissedDeadlines)
	}
	// Both wait for 10:00; the solar node takes one, and the other, seeing
	// no cleaner window left than the grid site now, runs there (the rule
	// does not count capacity): 100 + 300 g/kWh, not 450 + 300 at 06:00.
	if !near(r.KgCO2e, 5.6*(0.1+0.3)) {
		t.Fatalf("kgCO2e %g; want one run in the dip and one on the grid site", r.KgCO2e)
	}
	base := cfg
	base.Policy = scheduler.FIFO{}
	b := run(t, jobs, base)
	if b.KgCO2e <= r.KgCO2e || b.Holds != 0 {
		t.Fatalf("without the option %g kgCO2e, with it %g", b.KgCO2e, r.KgCO2e)
	}
	// Nothing deferrable: the option changes nothing.
	cfg.Deferrable, base.Deferrable = 0, 0
	if a, b := run(t, jobs, cfg), run(t, jobs, base); a.MeanJCT != b.MeanJCT || a.KgCO2e != b.KgCO2e || a.Holds != 0 {
		t.Fatalf("no deferrable jobs, yet the option changed the run: %+v vs %+v", a, b)
	}
}

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
	var saved, savedDef, dMean, dP99, holds, missed []float64
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
		savedDef = append(savedDef, 100*(r.base.DeferrableKgCO2e-r.carbon.DeferrableKgCO2e)/r.base.DeferrableKgCO2e)
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
		{"deferrable jobs' kgCO2e saved (%)", savedDef},
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
