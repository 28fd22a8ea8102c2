package sshserve

import (
	"context"
	"errors"
	"io"
	"os"
	"path/filepath"
	"sync"
	"syscall"
	"testing"
	"time"

	gossh "golang.org/x/crypto/ssh"

	"github.com/gpuctl/gpuctl/api"
	"github.com/gpuctl/gpuctl/client"
	"github.com/gpuctl/gpuctl/transport"
	"github.com/gpuctl/gpuctl/tui/feed"
	"github.com/gpuctl/gpuctl/tui/fixture"
)

// refuseTransport answers every request with an error: the benchmark's
// sessions only watch.
type refuseTransport struct{}

func (refuseTransport) Call(context.Context, *api.ClientRequest, func(*api.ClientResponse) error) error {
	return errors.New("benchmark: no server")
}
func (refuseTransport) Close() error { return nil }

func cpuSeconds() float64 {
	var ru syscall.Rusage
	syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano()).Seconds()
}

// BenchmarkSSHSessions measures this process's CPU while 2,000 nodes
// stream at 1 Hz through one shared feed, with no SSH session and with 20
// sessions open (each its own program fed by the feed), and reports the
// ratio. The 20 SSH clients run in this process too, so their decryption
// counts against the server.
func BenchmarkSSHSessions(b *testing.B) {
	const nodes, sessions = 2000, 20
	window := 30 * time.Second
	dir := b.TempDir()
	line, key := pubLine(b)
	keys := filepath.Join(dir, "keys")
	if err := os.WriteFile(keys, []byte("role=operator "+line+" bench\n"), 0o600); err != nil {
		b.Fatal(err)
	}
	hub := feed.New(nil, feed.Options{})
	hub.Apply(fixture.SnapshotBatch(fixture.Cluster(nodes, 8)))
	ss, err := New(Config{Listen: "127.0.0.1:0", HostKey: filepath.Join(dir, "host"), AuthorizedKeys: keys, Hub: hub, MaxConnsPerAddr: sessions,
		Factory: func(string, transport.Role) (*client.Client, error) { return client.New(refuseTransport{}), nil }})
	if err != nil {
		b.Fatal(err)
	}
	if err := ss.Listen(); err != nil {
		b.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	wg.Go(func() { ss.Serve(ctx) })
	wg.Go(func() {
		t, f := time.NewTicker(time.Second), time.NewTicker(feed.DefaultInterval)
		defer t.Stop()
		defer f.Stop()
		for tick := 1; ; tick++ {
			select {
			case <-ctx.Done():
				return
			case <-t.C:
				hub.Apply(fixture.NodesBatch(nodes, 8, tick, uint64(100+tick)))
			case <-f.C:
				hub.Flush()
			}
		}
	})
	defer func() { cancel(); wg.Wait() }()
	measure := func() float64 {
		c0, t0 := cpuSeconds(), time.Now()
		time.Sleep(window)
		return (cpuSeconds() - c0) / time.Since(t0).Seconds()
	}
	for b.Loop() {
		idle := measure()
		var clients []*gossh.Client
		for range sessions {
			cl, err := dial(ss.Addr().String(), key)
			if err != nil {
				b.Fatal(err)
			}
			clients = append(clients, cl)
			sess, err := cl.NewSession()
			if err != nil {
				b.Fatal(err)
			}
			if err := sess.RequestPty("xterm-256color", 50, 200, gossh.TerminalModes{}); err != nil {
				b.Fatal(err)
			}
			sess.Stdout = io.Discard
			if err := sess.Shell(); err != nil {
				b.Fatal(err)
			}
		}
		deadline := time.Now().Add(10 * time.Second)
		for hub.Subscribers() < sessions && time.Now().Before(deadline) {
			time.Sleep(10 * time.Millisecond)
		}
		if n := hub.Subscribers(); n != sessions {
			b.Fatalf("%d sessions subscribed, want %d", n, sessions)
		}
		loaded := measure()
		for _, cl := range clients {
			cl.Close()
		}
		b.ReportMetric(idle*100, "cpu%-0-sessions")
		b.ReportMetric(loaded*100, "cpu%-20-sessions")
		b.ReportMetric(loaded/idle, "cpu-ratio")
		b.ReportMetric(0, "ns/op")
	}
}
