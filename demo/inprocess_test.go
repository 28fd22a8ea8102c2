package demo

import (
	"context"
	"log/slog"
	"testing"

	"github.com/gpuctl/gpuctl/agent"
	"github.com/gpuctl/gpuctl/controlplane"
	"github.com/gpuctl/gpuctl/internal/servertest"
)

// runServer starts a control plane in this process; stop ends it (and is
// safe to call twice).
func runServer(t *testing.T, dataDir, addr string) (*controlplane.Server, func()) {
	t.Helper()
	return servertest.Run(t, controlplane.Config{DataDir: dataDir, Listen: addr})
}

// runAgent runs a nodemon in this process on a simulated DGX H100 without
// eBPF, until the test ends, and returns its probes for fault injection.
func runAgent(t *testing.T, cfg agent.Config) *agent.Probes {
	t.Helper()
	probes, err := agent.OpenProbes(agent.ProbeOptions{Node: cfg.Name, Sim: "dgx-h100", EBPF: agent.EBPFOff}, slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	a, err := agent.New(cfg, probes)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		a.Run(ctx)
		close(done)
	}()
	t.Cleanup(func() { cancel(); <-done })
	return probes
}
