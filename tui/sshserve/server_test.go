package sshserve

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	gossh "golang.org/x/crypto/ssh"

	"github.com/gpuctl/gpuctl/client"
	"github.com/gpuctl/gpuctl/controlplane"
	"github.com/gpuctl/gpuctl/transport"
	"github.com/gpuctl/gpuctl/tui/feed"
)

// console is a real control plane on loopback with the SSH console in
// front of it.
type console struct {
	addr     string
	factory  Factory
	operator gossh.Signer
	viewer   gossh.Signer
	stranger gossh.Signer
	// keys is the authorized-keys file; lines its lines by key name.
	keys  string
	lines map[string]string
}

func startConsole(t *testing.T, tune ...func(*Config)) *console {
	t.Helper()
	dir := t.TempDir()
	srv, err := controlplane.New(controlplane.Config{DataDir: filepath.Join(dir, "server"), Listen: "127.0.0.1:0"})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	if err := srv.Listen(ctx); err != nil {
		cancel()
		t.Fatal(err)
	}
	served := make(chan struct{})
	go func() { srv.Serve(ctx); close(served) }()
	c := &console{}
	c.factory = func(user string, role transport.Role) (*client.Client, error) {
		id, err := srv.Authority().IssueClient(user, role)
		if err != nil {
			return nil, err
		}
		return client.DialIdentity(ctx, srv.Addr().String(), id)
	}
	feedClient, err := c.factory("ssh-console", transport.RoleViewer)
	if err != nil {
		t.Fatal(err)
	}
	hub := feed.New(feedClient, feed.Options{PollEvery: 200 * time.Millisecond})
	var opLine, viewLine string
	opLine, c.operator = pubLine(t)
	viewLine, c.viewer = pubLine(t)
	_, c.stranger = pubLine(t)
	c.lines = map[string]string{"alice": "role=operator " + opLine + " alice", "bob": "role=viewer " + viewLine + " bob"}
	keys := filepath.Join(dir, "console_keys")
	c.keys = keys
	if err := os.WriteFile(keys, []byte(c.lines["alice"]+"\n"+c.lines["bob"]+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	cfg := Config{Listen: "127.0.0.1:0", HostKey: filepath.Join(dir, "host_key"), AuthorizedKeys: keys, Factory: c.factory, Hub: hub}
	for _, f := range tune {
		f(&cfg)
	}
	ss, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	if err := ss.Listen(); err != nil {
		t.Fatal(err)
	}
	c.addr = ss.Addr().String()
	var wg sync.WaitGroup
	wg.Go(func() { hub.Run(ctx) })
	wg.Go(func() { ss.Serve(ctx) })
	t.Cleanup(func() {
		cancel()
		wg.Wait()
		feedClient.Close()
		<-served
	})
	if _, err := os.Stat(filepath.Join(dir, "host_key")); err != nil {
		t.Errorf("no host key created on first start: %v", err)
	}
	return c
}

// screen is an SSH session's output, polled for text.
type screen struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (s *screen) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.buf.Write(p)
}

func (s *screen) waitFor(t *testing.T, what string, limit time.Duration) {
	t.Helper()
	deadline := time.Now().Add(limit)
	for {
		s.mu.Lock()
		ok := strings.Contains(s.buf.String(), what)
		out := s.buf.String()
		s.mu.Unlock()
		if ok {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%q not on screen within %s; got %d bytes:\n%q", what, limit, len(out), tail(out, 2000))
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func (s *screen) has(what string) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return strings.Contains(s.buf.String(), what)
}

func tail(s string, n int) string {
	if len(s) > n {
		return s[len(s)-n:]
	}
	return s
}

func dial(addr string, key gossh.Signer) (*gossh.Client, error) {
	return gossh.Dial("tcp", addr, &gossh.ClientConfig{User: "ops", Auth: []gossh.AuthMethod{gossh.PublicKeys(key)},
		HostKeyCallback: gossh.InsecureIgnoreHostKey(), Timeout: 5 * time.Second})
}

func openConsole(t *testing.T, addr string, key gossh.Signer) (*screen, func(string)) {
	t.Helper()
	o := openSession(t, addr, key)
	return o.out, o.send
}

// session is an open console seen from the client: its screen, what it
// wrote to stderr, and ended once the server has closed it.
type clientSession struct {
	out, errs *screen
	send      func(string)
	ended     chan struct{}
}

func openSession(t *testing.T, addr string, key gossh.Signer) *clientSession {
	t.Helper()
	return openSessionSized(t, addr, key, 160, 40)
}

// openSessionSized opens a console on a width×height PTY.
func openSessionSized(t *testing.T, addr string, key gossh.Signer, width, height int) *clientSession {
	t.Helper()
	return openSessionTerm(t, addr, key, "xterm-256color", width, height)
}

// openSessionTerm opens a console on a width×height PTY of terminal type term.
func openSessionTerm(t *testing.T, addr string, key gossh.Signer, term string, width, height int) *clientSession {
	t.Helper()
	cl, err := dial(addr, key)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cl.Close() })
	sess, err := cl.NewSession()
	if err != nil {
		t.Fatal(err)
	}
	if err := sess.RequestPty(term, height, width, gossh.TerminalModes{}); err != nil {
		t.Fatal(err)
	}
	o := &clientSession{out: &screen{}, errs: &screen{}, ended: make(chan struct{})}
	sess.Stdout, sess.Stderr = o.out, o.errs
	in, err := sess.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := sess.Shell(); err != nil {
		t.Fatal(err)
	}
	o.send = func(keys string) { in.Write([]byte(keys)) }
	go func() { sess.Wait(); close(o.ended) }()
	return o
}

// endsWithin reports whether the server ended the session within limit.
func (o *clientSession) endsWithin(limit time.Duration) bool { return closedWithin(o.ended, limit) }

// closedWithin reports whether ch is closed within limit.
func closedWithin(ch <-chan struct{}, limit time.Duration) bool {
	select {
	case <-ch:
		return true
	case <-time.After(limit):
		return false
	}
}

func TestSSHConsoleRoles(t *testing.T) {
	c := startConsole(t)

	op, _ := openConsole(t, c.addr, c.operator)
	op.waitFor(t, "alice@ssh (operator)", 15*time.Second)
	op.waitFor(t, "cordon node", 5*time.Second)

	view, _ := openConsole(t, c.addr, c.viewer)
	view.waitFor(t, "bob@ssh (viewer)", 15*time.Second)
	view.waitFor(t, "next metric", 5*time.Second)
	if view.has("cordon node") {
		t.Error("the viewer's console offers cordon")
	}

	if _, err := dial(c.addr, c.stranger); err == nil || !strings.Contains(err.Error(), "unable to authenticate") {
		t.Errorf("an unlisted key got in: %v", err)
	}

	// The server checks the role again whatever the console shows.
	vc, err := c.factory("bob", transport.RoleViewer)
	if err != nil {
		t.Fatal(err)
	}
	defer vc.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if _, err := vc.Cordon(ctx, "node-00", "cordon", "x"); err == nil || !strings.Contains(err.Error(), "permission denied") {
		t.Errorf("a viewer's cordon: %v, want permission denied", err)
	}
}
