package main

import (
	"context"
	"strings"
	"testing"
	"time"
)

// watchCmd runs a --watch command in the background until the test ends.
func (c *cluster) watchCmd(t *testing.T, args ...string) *syncBuffer {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	out := &syncBuffer{}
	root := newRootCmd()
	root.SetOut(out)
	root.SetErr(out)
	root.SetArgs(withFlags(args, "--config", c.config))
	done := make(chan struct{})
	go func() {
		defer close(done)
		root.ExecuteContext(ctx)
	}()
	t.Cleanup(func() {
		cancel()
		<-done
	})
	return out
}

// TestWatchFollowsStreams runs nodes and events with --watch into a pipe
// (not a terminal): a cordon shows as a new refresh of the node table and
// as one new event line, with no escape codes anywhere.
func TestWatchFollowsStreams(t *testing.T) {
	c := startCluster(t, 2)
	nodes := c.watchCmd(t, "nodes", "--watch", "--interval", "200ms")
	events := c.watchCmd(t, "events", "--watch", "--limit", "5")
	eventually(t, "the first node table", 20*time.Second, func() bool { return strings.Contains(nodes.String(), "node-01") })
	eventually(t, "the events there were", 10*time.Second, func() bool { return strings.Contains(events.String(), "MESSAGE") })
	if _, errOut, err := c.gpuctl(t, "cordon", "node-01", "--reason", "watch test"); err != nil {
		t.Fatalf("cordon: %v\n%s", err, errOut)
	}
	eventually(t, "the node table refreshed with the cordon", 10*time.Second, func() bool {
		return strings.Contains(nodes.String(), "ready,cordoned")
	})
	eventually(t, "the cordon event streamed", 10*time.Second, func() bool {
		return strings.Contains(events.String(), "cordoned: takes no new work (watch test)")
	})
	for name, out := range map[string]string{"nodes": nodes.String(), "events": events.String()} {
		if strings.Contains(out, "\x1b") {
			t.Errorf("piped %s --watch wrote escape codes:\n%q", name, out)
		}
	}
	if n := strings.Count(events.String(), "MESSAGE"); n != 1 {
		t.Errorf("events --watch printed its header %d times, want once:\n%s", n, events.String())
	}
	if n := strings.Count(nodes.String(), "refreshed on change"); n < 2 {
		t.Errorf("nodes --watch refreshed %d times, want at least twice:\n%s", n, nodes.String())
	}
}
