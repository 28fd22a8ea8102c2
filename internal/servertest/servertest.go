// Package servertest runs a real gpuctl control plane in the test's
// process, on loopback, for integration tests that need a server but not
// its process boundary.
package servertest

import (
	"context"
	"testing"

	"github.com/gpuctl/gpuctl/controlplane"
)

// Start runs a server with cfg (Listen defaults to a free loopback port)
// until the test ends.
func Start(t testing.TB, cfg controlplane.Config) *controlplane.Server {
	t.Helper()
	s, _ := Run(t, cfg)
	return s
}

// Run is Start with a stop that ends the server sooner (a test of what
// outlives it); stop is safe to call more than once.
func Run(t testing.TB, cfg controlplane.Config) (s *controlplane.Server, stop func()) {
	t.Helper()
	if cfg.Listen == "" {
		cfg.Listen = "127.0.0.1:0"
	}
	s, err := controlplane.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	if err := s.Listen(ctx); err != nil {
		cancel()
		t.Fatal(err)
	}
	done := make(chan struct{})
	go func() {
		s.Serve(ctx)
		close(done)
	}()
	stop = func() { cancel(); <-done }
	t.Cleanup(stop)
	return s, stop
}
