package agent

import (
	"bytes"
	"context"
	"crypto/tls"
	"log/slog"
	"net"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/quic-go/quic-go"

	"github.com/gpuctl/gpuctl/transport"
)

// lockedBuffer is a log sink the test reads while the agent writes.
type lockedBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *lockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *lockedBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

// TestJoinRetriesWhileServerBusy fills the server's join slots for this
// address with connections that never send a request; nodemon's join is
// turned away as busy, waits and tries again, and gets in once the server
// has cut the idle connections off.
func TestJoinRetriesWhileServerBusy(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	auth, err := transport.OpenAuthority(t.TempDir(), transport.AuthorityOptions{})
	if err != nil {
		t.Fatal(err)
	}
	l, err := transport.Listen(ctx, "127.0.0.1:0", auth, transport.ListenConfig{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { l.Close() })
	tok, _, err := auth.CreateToken(time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().(*net.UDPAddr)

	// Idle join connections from 127.0.0.1 until the server turns one away.
	var idle []*quic.Conn
	t.Cleanup(func() {
		for _, c := range idle {
			c.CloseWithError(0, "")
		}
	})
	for len(idle) < 64 {
		c, err := quic.DialAddr(ctx, addr.String(), &tls.Config{InsecureSkipVerify: true, NextProtos: []string{transport.ALPNJoin}}, nil)
		if err != nil {
			t.Fatal(err)
		}
		idle = append(idle, c)
		select {
		case <-c.Context().Done():
		case <-time.After(100 * time.Millisecond):
			continue // it holds a slot
		}
		break // turned away: the slots are full
	}

	var logs lockedBuffer
	a := &Agent{cfg: Config{Server: addr.String(), Token: tok, Name: "gpu-busy", DataDir: t.TempDir()},
		log: slog.New(slog.NewTextHandler(&logs, nil)), servers: transport.NewServers([]string{addr.String()})}
	start := time.Now()
	id, err := a.identity(ctx)
	if err != nil {
		t.Fatalf("join while the server was busy: %v\nlog:\n%s", err, logs.String())
	}
	if id.Name != "gpu-busy" {
		t.Fatalf("joined as %q", id.Name)
	}
	if !strings.Contains(logs.String(), "server busy; retrying the join") {
		t.Fatalf("the join never met a busy server:\n%s", logs.String())
	}
	if _, err := transport.LoadNodeIdentity(filepath.Join(a.cfg.DataDir, "identity")); err != nil {
		t.Fatal(err)
	}
	t.Logf("joined after %s, %d idle connections holding the slots", time.Since(start).Round(time.Millisecond), len(idle)-1)
}
