package agent

import (
	"context"
	"io"
	"log/slog"
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
