package simulate

import (
	"math"
	"reflect"
	"strings"
	"testing"

	"github.com/gpuctl/gpuctl/scheduler/costmodel"
)

// llamaRun is a run shaped like Llama 3 405B's: 54 days of training, an
// interruption every three hours (Dubey et al. 2024, §3.3.4), a one-minute
// checkpoint at the Young–Daly interval, on nodes of 8 GPUs. The failure
// rate is the job's, so the node count only sets the cluster recovery
// searches (the benchmark replays the full 2,048 nodes).
func llamaRun(nodes int, seed uint64) FailureConfig {
	const mtbf, ckpt = 3 * 3600.0, 60.0
	return FailureConfig{
		JobNodes: nodes, GPUsPerNode: 8, Spares: max(nodes/32, 16),
		Work:               54 * 24 * 3600,
		CheckpointInterval: costmodel.YoungDalyInterval(ckpt, mtbf), CheckpointTime: ckpt,
		Detect: 30, Restart: 150, MTBF: mtbf, GPUFaultShare: 0.587, Repair: 12 * 3600, Seed: seed,
	}
}

func runFailures(t *testing.T, cfg FailureConfig) FailureResult {
	t.Helper()
	r, err := RunFailures(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return r
}

func TestRunFailuresMatchesExpectedWallTime(t *testing.T) {
	// With spares enough, the replay's mean wall time over seeds is Daly's
	// expectation for the same run.
	var sum float64
	const seeds = 8
	cfg := llamaRun(256, 0)
	for s := range uint64(seeds) {
		cfg.Seed = s + 1
		r := runFailures(t, cfg)
		sum += r.WallSeconds
		if r.SpareWaitSeconds != 0 || r.Replacements == 0 || r.Interruptions != r.NodeFailures+r.GPUFailures {
			t.Fatalf("seed %d: %+v", s, r)
		}
		if got := r.WorkSeconds + r.CheckpointSeconds + r.LostWorkSeconds + r.RecoverySeconds; !near(got, r.WallSeconds) {
			t.Fatalf("seed %d: work + checkpoints + lost + recovery = %.0f s, wall %.0f s", s, got, r.WallSeconds)
		}
	}
	mean := sum / seeds
	want := costmodel.ExpectedWallTime(cfg.Work, cfg.CheckpointInterval, cfg.CheckpointTime, cfg.Detect+cfg.Restart, cfg.MTBF)
	if e := mean/want - 1; math.Abs(e) > 0.01 {
		t.Fatalf("simulated %.1f h, formula %.1f h (%+.2f%%)", mean/3600, want/3600, e*100)
	}
}

func TestRunFailuresDeterministic(t *testing.T) {
	a, b := runFailures(t, llamaRun(64, 7)), runFailures(t, llamaRun(64, 7))
	if !reflect.DeepEqual(a, b) {
		t.Fatalf("same seed, different runs:\n%+v\n%+v", a, b)
	}
	if c := runFailures(t, llamaRun(64, 8)); c.WallSeconds == a.WallSeconds {
		t.Fatalf("seeds 7 and 8 gave the same run")
	}
}

func TestRunFailuresWaitsForRepairs(t *testing.T) {
	// Without spares every replacement waits for a repaired node, and the
	// run takes longer than with them.
	cfg := llamaRun(64, 3)
	cfg.Work = 10 * 24 * 3600
	with := runFailures(t, cfg)
	cfg.Spares, cfg.Repair = 0, 3600
	without := runFailures(t, cfg)
	if without.SpareWaitSeconds <= 0 || without.WallSeconds <= with.WallSeconds {
		t.Fatalf("no spares: waited %.0f s, wall %.0f s against %.0f s with spares", without.SpareWaitSeconds, without.WallSeconds, with.WallSeconds)
	}
	if without.Actions["restart in place"] == 0 {
		t.Errorf("with no spares the job should restart on its repaired node: %v", without.Actions)
	}
}

func TestRunFailuresRare(t *testing.T) {
	// Failures far apart against the run: wall time is the work plus the
	// checkpoints, and failures are rare.
	cfg := FailureConfig{JobNodes: 4, GPUsPerNode: 8, Work: 10000, CheckpointInterval: 1000, CheckpointTime: 10,
		Detect: 1, Restart: 1, MTBF: 1e12, Seed: 1}
	r := runFailures(t, cfg)
	if r.Interruptions != 0 || r.Checkpoints != 9 || r.WallSeconds != 10000+90 {
		t.Fatalf("%+v", r)
	}
}

func TestRunFailuresOutpaced(t *testing.T) {
	// Nodes failing faster than repairs bring them back, with no spares,
	// is an error that says what to change.
	cfg := llamaRun(64, 1)
	cfg.Spares, cfg.Repair, cfg.MTBF = 0, 30*24*3600, 600
	if _, err := RunFailures(cfg); err == nil || !strings.Contains(err.Error(), "add spares") {
		t.Fatalf("err %v", err)
	}
}

func TestRunFailuresErrors(t *testing.T) {
	ok := llamaRun(8, 1)
	tests := []struct {
		name string
		edit func(*FailureConfig)
		want string
	}{
		{"no nodes", func(c *FailureConfig) { c.JobNodes = 0 }, "at least one node"},
		{"no work", func(c *FailureConfig) { c.Work = 0 }, "positive amount of work"},
		{"no mtbf", func(c *FailureConfig) { c.MTBF = 0 }, "MTBF"},
		{"no interval", func(c *FailureConfig) { c.CheckpointInterval = 0 }, "checkpoint interval"},
		{"negative restart", func(c *FailureConfig) { c.Restart = -1 }, "must not be negative"},
		{"gpu share", func(c *FailureConfig) { c.GPUFaultShare = 2 }, "GPU fault share"},
	}
	for _, tt := range tests {
		c := ok
		tt.edit(&c)
		if _, err := RunFailures(c); err == nil || !strings.Contains(err.Error(), tt.want) {
			t.Errorf("%s: err %v, want %q", tt.name, err, tt.want)
		}
	}
}

func BenchmarkRunFailuresLlama(b *testing.B) {
	cfg := llamaRun(2048, 1)
	var n int
	for b.Loop() {
		r, err := RunFailures(cfg)
		if err != nil {
			b.Fatal(err)
		}
		n += r.Interruptions
	}
	b.ReportMetric(b.Elapsed().Seconds()*1e3/float64(b.N), "ms/run")
	b.ReportMetric(float64(n)/b.Elapsed().Seconds(), "failures/s")
}
