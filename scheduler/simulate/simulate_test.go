package simulate

import (
	"math"
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
