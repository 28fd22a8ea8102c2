package client

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/gpuctl/gpuctl/api"
	"github.com/gpuctl/gpuctl/controlplane"
	"github.com/gpuctl/gpuctl/internal/hatest"
	"github.com/gpuctl/gpuctl/internal/servertest"
	"github.com/gpuctl/gpuctl/transport"
)

// These tests run the client against real servers on loopback:
// controlplane.New as the leader, hatest's fake standby (a real listener
// with the cluster CA that only names the leader) and a second real
// server of the same CA to fail over to.

// startServer runs a real control plane on 127.0.0.1:0 in dir; pki, when
// set, is the pki directory of a server whose CA it shares.
func startServer(t *testing.T, dir, pki string) *controlplane.Server {
	t.Helper()
	if pki != "" {
		hatest.SharePKI(t, pki, filepath.Join(dir, "pki"))
	}
	return servertest.Start(t, controlplane.Config{DataDir: dir})
}

// admin is the administrator identity a server wrote into its data dir.
func admin(t *testing.T, dir string) *transport.Identity {
	t.Helper()
	_, id, err := transport.LoadClientConfig(controlplane.AdminConfigPath(dir))
	if err != nil {
		t.Fatal(err)
	}
	return id
}

// twoServers starts two servers of one CA, the first behind a link that
// can be cut, and returns the link, the second server and the
// administrator's identity.
func twoServers(t *testing.T) (*hatest.Link, *controlplane.Server, *transport.Identity) {
	t.Helper()
	dir := t.TempDir()
	first := startServer(t, filepath.Join(dir, "first"), "")
	second := startServer(t, filepath.Join(dir, "second"), filepath.Join(dir, "first", "pki"))
	return hatest.StartLink(t, first.Addr().String()), second, admin(t, filepath.Join(dir, "first"))
}

func dialServers(t *testing.T, id *transport.Identity, addrs ...string) *Client {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	c, err := DialServers(ctx, addrs, id)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

func testCtx(t *testing.T) context.Context {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	t.Cleanup(cancel)
	return ctx
}

// server is the address the client's requests go to now.
func (c *Client) server() string {
	q := c.t.(*quicTransport)
	q.mu.Lock()
	defer q.mu.Unlock()
	if q.cur == nil {
		return ""
	}
	return q.cur.addr
}

// TestRequestAtStandbyIsAnsweredByTheLeader: a client given [standby,
// leader] connects to the standby; its request there is sent on to the
// leader and answered, and the client stays with the leader.
func TestRequestAtStandbyIsAnsweredByTheLeader(t *testing.T) {
	ctx := testCtx(t)
	dir := t.TempDir()
	leader := startServer(t, dir, "")
	standby := hatest.StartStandby(t, filepath.Join(dir, "pki"), leader.Addr().String())
	c := dialServers(t, admin(t, dir), standby.Addr(), leader.Addr().String())
	if got := c.server(); got != standby.Addr() {
		t.Fatalf("connected to %s, want the standby %s first", got, standby.Addr())
	}
	if _, err := c.Nodes(ctx); err != nil {
		t.Fatalf("list nodes through the standby: %v", err)
	}
	if got := c.server(); got != leader.Addr().String() {
		t.Fatalf("the client talks to %s after the redirect, want the leader %s", got, leader.Addr())
	}
	if _, err := c.Nodes(ctx); err != nil {
		t.Fatal(err)
	}
	if n := len(standby.Requests()); n != 1 {
		t.Fatalf("the standby was asked %d times, want 1 (the next request goes to the leader)", n)
	}
}

// TestChangeThroughStandbyIsMadeOnce: a request that changes the cluster,
// refused by the standby (not acted on), is sent once to the leader: one
// token made, not two.
func TestChangeThroughStandbyIsMadeOnce(t *testing.T) {
	ctx := testCtx(t)
	dir := t.TempDir()
	leader := startServer(t, dir, "")
	standby := hatest.StartStandby(t, filepath.Join(dir, "pki"), leader.Addr().String())
	c := dialServers(t, admin(t, dir), standby.Addr(), leader.Addr().String())
	if _, _, err := c.CreateJoinToken(ctx, TokenOptions{TTL: time.Hour, Description: "once"}); err != nil {
		t.Fatalf("create a token through the standby: %v", err)
	}
	direct := dialServers(t, admin(t, dir), leader.Addr().String())
	toks, err := direct.ListTokens(ctx)
	if err != nil {
		t.Fatal(err)
	}
	made := 0
	for _, tk := range toks {
		if tk.GetDescription() == "once" {
			made++
		}
	}
	if made != 1 {
		t.Fatalf("the leader made %d tokens, want 1", made)
	}
	reqs := standby.Requests()
	if len(reqs) != 1 || reqs[0].GetCreateJoinToken() == nil {
		t.Fatalf("the standby was asked %v, want the one token request", reqs)
	}
}

// TestRedirectsAreBounded: standbys naming each other (an election in
// flux) get the request at most 1 + maxRedirects times, and the error says
// why.
func TestRedirectsAreBounded(t *testing.T) {
	ctx := testCtx(t)
	dir := t.TempDir()
	leader := startServer(t, dir, "")
	pki := filepath.Join(dir, "pki")
	a := hatest.StartStandby(t, pki, "")
	b := hatest.StartStandby(t, pki, a.Addr())
	a.SetLeader(b.Addr())
	c := dialServers(t, admin(t, dir), a.Addr(), b.Addr())
	_, err := c.Nodes(ctx)
	if err == nil || !strings.Contains(err.Error(), "disagree about who leads") {
		t.Fatalf("err = %v, want the servers' disagreement named", err)
	}
	t.Logf("as reported: %v", err)
	if n := len(a.Requests()) + len(b.Requests()); n != 1+maxRedirects {
		t.Fatalf("the standbys were asked %d times, want %d", n, 1+maxRedirects)
	}

	// With no leader elected the standby's own answer is the error.
	a.SetLeader("")
	c = dialServers(t, admin(t, dir), a.Addr(), leader.Addr().String())
	_, err = c.Nodes(ctx)
	if err == nil || !strings.Contains(err.Error(), hatest.StandbyReason) {
		t.Fatalf("err = %v, want the standby's answer", err)
	}
}

// TestWatchMovesToTheNextServer: the server a watch follows is cut off
// without a word; the client's connection ends within
// transport.ClientIdleTimeout and the watch resumes on the next server,
// which resyncs it with a snapshot of its own epoch.
func TestWatchMovesToTheNextServer(t *testing.T) {
	link, second, id := twoServers(t)
	c := dialServers(t, id, link.Addr(), second.Addr().String())

	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	var (
		mu       sync.Mutex
		epochs   []string
		resynced time.Time
		reason   string
		cut      time.Time
	)
	err := c.Watch(ctx, &api.WatchRequest{Kinds: []api.WatchKind{api.WatchKind_WATCH_KIND_NODES}},
		WatchOptions{Backoff: &transport.Backoff{Base: 50 * time.Millisecond, Max: 50 * time.Millisecond}},
		func(b *api.WatchBatch) error {
			mu.Lock()
			defer mu.Unlock()
			if b.GetSnapshot() && b.GetSynced() {
				epochs = append(epochs, b.GetEpoch())
				if len(epochs) == 1 {
					cut = time.Now()
					link.Cut()
				} else {
					resynced, reason = time.Now(), b.GetResyncReason()
					cancel()
				}
			}
			return nil
		})
	if err != nil && !errors.Is(err, context.Canceled) {
		t.Fatalf("watch: %v", err)
	}
	if len(epochs) != 2 || epochs[0] == epochs[1] || reason == "" {
		t.Fatalf("snapshots of epochs %q (resync reason %q), want one from each server", epochs, reason)
	}
	if got := c.server(); got != second.Addr().String() {
		t.Fatalf("the client talks to %s, want the second server %s", got, second.Addr())
	}
	took := resynced.Sub(cut)
	if took > transport.ClientIdleTimeout+2*time.Second {
		t.Fatalf("the watch resumed %s after the cut, want within %s and a pause", took, transport.ClientIdleTimeout)
	}
	t.Logf("watch resumed on the second server %s after the cut (resync: %q)", took.Round(time.Millisecond), reason)
}

// TestRequestAfterServerLost: the server is cut off without a word; a
// request sent meanwhile fails once the connection ends (within
// transport.ClientIdleTimeout), saying it may have been carried out, and
// the next request goes to the next server.
func TestRequestAfterServerLost(t *testing.T) {
	ctx := testCtx(t)
	link, second, id := twoServers(t)
	c := dialServers(t, id, link.Addr(), second.Addr().String())
	if _, err := c.Nodes(ctx); err != nil {
		t.Fatal(err)
	}
	cut := time.Now()
	link.Cut()
	_, err := c.Nodes(ctx)
	lost := time.Since(cut)
	if err == nil || !strings.Contains(err.Error(), "lost the connection to "+link.Addr()) {
		t.Fatalf("request to the lost server: %v, want the lost connection named", err)
	}
	if lost > transport.ClientIdleTimeout+time.Second {
		t.Fatalf("the request failed %s after the cut, want within %s", lost, transport.ClientIdleTimeout)
	}
	t.Logf("as reported %s after the cut: %v", lost.Round(time.Millisecond), err)
	if _, err := c.Nodes(ctx); err != nil {
		t.Fatalf("the next request: %v", err)
	}
	if got := c.server(); got != second.Addr().String() {
		t.Fatalf("the next request went to %s, want %s", got, second.Addr())
	}
}

// TestSilentFirstServer: the first server listed answers nothing (killed
// or stopped: no close, no ICMP over the relay); a new client is
// answered by the second within a second, not after the first one's dial
// timeout.
func TestSilentFirstServer(t *testing.T) {
	ctx := testCtx(t)
	link, second, id := twoServers(t)
	link.Cut()
	start := time.Now()
	c := dialServers(t, id, link.Addr(), second.Addr().String())
	if _, err := c.Nodes(ctx); err != nil {
		t.Fatal(err)
	}
	took := time.Since(start)
	t.Logf("connected and answered by the second server %s after the start", took.Round(time.Millisecond))
	if took > time.Second {
		t.Fatalf("a silent first server held the client %s, want within 1s", took)
	}
	if got := c.server(); got != second.Addr().String() {
		t.Fatalf("the client talks to %s, want the second server %s", got, second.Addr())
	}
}

// TestServerRememberedAcrossRuns: a client config lists [standby, leader];
// the first run is sent on by the standby, and the next run (a new
// process, here a new Dial of the same config) starts with the leader,
// remembered in the cache dir. An address the list does not hold is not
// dialled from the cache.
func TestServerRememberedAcrossRuns(t *testing.T) {
	ctx := testCtx(t)
	t.Setenv("XDG_CACHE_HOME", t.TempDir())
	dir := t.TempDir()
	leader := startServer(t, dir, "")
	standby := hatest.StartStandby(t, filepath.Join(dir, "pki"), leader.Addr().String())
	servers := standby.Addr() + "," + leader.Addr().String()
	cfg, err := transport.ClientConfigYAML(servers, admin(t, dir))
	if err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(t.TempDir(), "config.yaml")
	if err := os.WriteFile(path, cfg, 0o600); err != nil {
		t.Fatal(err)
	}
	run := func() string {
		t.Helper()
		c, err := Dial(ctx, path)
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		first := c.server()
		if _, _, err := c.CreateJoinToken(ctx, TokenOptions{TTL: time.Hour}); err != nil {
			t.Fatal(err)
		}
		return first
	}
	if got := run(); got != standby.Addr() {
		t.Fatalf("the first run connected to %s, want the first listed, the standby %s", got, standby.Addr())
	}
	if got := run(); got != leader.Addr().String() {
		t.Fatalf("the second run connected to %s, want the leader %s remembered from the first", got, leader.Addr())
	}
	if n := len(standby.Requests()); n != 1 {
		t.Fatalf("the standby was asked %d times, want once (by the first run only)", n)
	}

	// A cache naming a server the config does not list is ignored.
	last := openLastServer([]string{standby.Addr(), leader.Addr().String()})
	last.save("203.0.113.1:7443")
	if got := run(); got != standby.Addr() {
		t.Fatalf("with a foreign address cached the run connected to %s, want the first listed %s", got, standby.Addr())
	}
}
