// Package simnodes joins in-process nodemons on simulated GPUs to a test's
// server, for tests that need gpuctl nodes but not their processes.
package simnodes

import (
	"context"
	"log/slog"
	"path/filepath"
	"testing"
	"time"

	"github.com/gpuctl/gpuctl/agent"
	"github.com/gpuctl/gpuctl/api"
	"github.com/gpuctl/gpuctl/controlplane"
)

// Join joins an in-process nodemon per name to s, each on simulated DGX
// H100 GPUs without eBPF, until the test ends, and waits for them to be
// ready.
func Join(t testing.TB, s *controlplane.Server, dir string, names ...string) {
	t.Helper()
	token, err := s.CreateJoinToken(time.Hour, len(names), "simnodes")
	if err != nil {
		t.Fatal(err)
	}
	for _, name := range names {
		probes, err := agent.OpenProbes(agent.ProbeOptions{Node: name, Sim: "dgx-h100", EBPF: agent.EBPFOff}, slog.New(slog.DiscardHandler))
		if err != nil {
			t.Fatal(err)
		}
		a, err := agent.New(agent.Config{Server: s.Addr().String(), Token: token, Name: name, DataDir: filepath.Join(dir, name),
			CgroupRoot: "off", AllowRootRanks: true}, probes)
		if err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan struct{})
		go func() { a.Run(ctx); close(done) }()
		t.Cleanup(func() { cancel(); <-done })
	}
	deadline := time.Now().Add(30 * time.Second)
	for {
		ready := 0
		for _, n := range s.Nodes() {
			if n.GetState() == api.NodeState_NODE_STATE_READY {
				ready++
			}
		}
		if ready >= len(names) {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("simnodes: %d of %d nodes ready after 30 s", ready, len(names))
		}
		time.Sleep(50 * time.Millisecond)
	}
}
