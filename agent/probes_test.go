package agent

import (
	"context"
	"io"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/gpuctl/gpuctl/api"
)

// TestSamplingBatchesCarryRankStatus runs the probe loop on a simulated
// host: every batch with GPU samples lists the live ranks, and the rank's
// GPU shows its process.
func TestSamplingBatchesCarryRankStatus(t *testing.T) {
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	p, err := OpenProbes(ProbeOptions{Node: "node-a", Sim: "dgx-h100", EBPF: EBPFOff}, log)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { p.Close() })
	e := newTestExecutor(t, "")
	if err := e.x.Launch(sleepJob("tele", 4, 0)); err != nil {
		t.Fatal(err)
	}
	pid := rankPID(t, e.x, "tele", 0)
	killOnCleanup(t, pid)

	var mu sync.Mutex
	var batches []*api.Telemetry
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		p.run(ctx, 100*time.Millisecond, e.x, func(tm *api.Telemetry) {
			mu.Lock()
			batches = append(batches, tm)
			mu.Unlock()
		}, newEventQueue(100))
	}()
	t.Cleanup(func() { cancel(); <-done })
	eventually(t, "a sampling batch with the rank", 10*time.Second, func() bool {
		mu.Lock()
		defer mu.Unlock()
		for _, b := range batches {
			if len(b.GetGpus()) == 0 {
				continue
			}
			if len(b.GetRanks()) != 1 {
				t.Fatalf("sampling batch has %d ranks, want 1", len(b.GetRanks()))
			}
			r := b.GetRanks()[0]
			if r.GetJob() != "tele" || r.GetAttempt() != 4 || r.GetPid() != uint32(pid) || r.GetProcState() == "" {
				t.Fatalf("rank status = %v", r)
			}
			return true
		}
		return false
	})
}

// A rank is given the profiler plugin nodemon traces, unless nodemon's
// environment names one; the job's own setting comes last and wins.
func TestRankEnvProfiler(t *testing.T) {
	p := &Probes{profiler: "/opt/gpuctl/libnccl-profiler-gpuctl.so"}
	t.Setenv(ProfilerEnv, "")
	if got, want := p.rankEnv(), []string{ProfilerEnv + "=/opt/gpuctl/libnccl-profiler-gpuctl.so"}; !slices.Equal(got, want) {
		t.Errorf("rankEnv = %q, want %q", got, want)
	}
	l := &api.LaunchRanks{Job: "j", Env: map[string]string{ProfilerEnv: "theirs"}}
	env := rankEnv("n", "c", p.rankEnv(), l, &api.RankSpec{})
	if last := lastValue(env, ProfilerEnv); last != "theirs" {
		t.Errorf("the job's %s is overridden: last value %q", ProfilerEnv, last)
	}
	t.Setenv(ProfilerEnv, "/host/plugin.so")
	if got := p.rankEnv(); len(got) != 0 {
		t.Errorf("rankEnv with nodemon's own %s = %q, want nothing", ProfilerEnv, got)
	}
	if got := (&Probes{}).rankEnv(); len(got) != 0 {
		t.Errorf("rankEnv without a plugin = %q", got)
	}
}

// lastValue is the value exec gives a process for key: the last one in env.
func lastValue(env []string, key string) string {
	v := ""
	for _, kv := range env {
		if k, val, ok := strings.Cut(kv, "="); ok && k == key {
			v = val
		}
	}
	return v
}
