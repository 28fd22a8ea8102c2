package ha

import (
	"bytes"
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/gpuctl/gpuctl/api"
	"github.com/gpuctl/gpuctl/internal/etcdtest"
	"github.com/gpuctl/gpuctl/store"
	"github.com/gpuctl/gpuctl/store/etcdstore"
	"github.com/gpuctl/gpuctl/transport"
)

func openStore(t *testing.T, c *etcdtest.Cluster) (*etcdstore.Store, Config) {
	t.Helper()
	cli := c.Client(t)
	st, err := etcdstore.Open(context.Background(), cli, etcdstore.Options{})
	if err != nil {
		t.Fatal(err)
	}
	return st, Config{Client: cli, TTL: time.Second}
}

func join(t *testing.T, cfg Config, name string) *Member {
	t.Helper()
	cfg.Name, cfg.Addr = name, "127.0.0.1:7443"
	m, err := Join(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { m.Close() })
	return m
}

// TestDeposedLeaderCannotWrite: a leader whose session ends (here revoked,
// as its expiry after a partition would) is replaced, and every write it
// still tries is refused with store.ErrNotLeader and leaves nothing.
func TestDeposedLeaderCannotWrite(t *testing.T) {
	c := etcdtest.Start(t, 3)
	ctx := context.Background()
	st1, cfg1 := openStore(t, c)
	st2, cfg2 := openStore(t, c)
	a, b := join(t, cfg1, "a"), join(t, cfg2, "b")

	// Not fenced yet: a standby writes nothing.
	if err := st1.PutJob(&api.Job{Id: "j-standby"}); !errors.Is(err, store.ErrNotLeader) {
		t.Fatalf("an unfenced store's write: %v, want ErrNotLeader", err)
	}
	lead, err := a.Campaign(ctx)
	if err != nil {
		t.Fatal(err)
	}
	st1.Fence(lead.Key, lead.Rev)
	if err := st1.PutJob(&api.Job{Id: "j-1", Name: "before"}); err != nil {
		t.Fatalf("the leader's write: %v", err)
	}
	won := make(chan Leadership, 1)
	go func() {
		l, err := b.Campaign(ctx)
		if err != nil {
			t.Error(err)
		}
		won <- l
	}()
	select {
	case <-won:
		t.Fatal("b leads while a still does")
	case <-time.After(300 * time.Millisecond):
	}
	if _, err := cfg1.Client.Revoke(ctx, a.session.Lease()); err != nil {
		t.Fatal(err)
	}
	var lb Leadership
	select {
	case lb = <-won:
	case <-time.After(5 * time.Second):
		t.Fatal("b did not lead after a's session ended")
	}
	st2.Fence(lb.Key, lb.Rev)
	select {
	case <-a.Lost():
	case <-time.After(5 * time.Second):
		t.Fatal("a was not told it lost its session")
	}
	if got := b.Leader().GetName(); got != "b" {
		t.Errorf("b sees leader %q", got)
	}

	writes := map[string]func() error{
		"PutJob":      func() error { return st1.PutJob(&api.Job{Id: "j-2", Name: "deposed"}) },
		"AppendEvent": func() error { return st1.AppendEvent(&api.Event{TimeUnixNano: 1, Message: "deposed"}) },
		"PutNode":     func() error { return st1.PutNode(&api.NodeStatus{Registration: &api.NodeRegistration{Name: "node-x"}}) },
		"Update": func() error {
			return st1.Update(func(tx store.Tx) error { return tx.PutJob(&api.Job{Id: "j-3", Name: "deposed"}) })
		},
		"PutToken":    func() error { return st1.PutToken(&api.JoinToken{Id: "t-deposed"}) },
		"PutIdentity": func() error { return st1.PutIdentity(&api.Identity{Serial: "01", Name: "deposed"}) },
	}
	for name, w := range writes {
		if err := w(); !errors.Is(err, store.ErrNotLeader) {
			t.Errorf("deposed leader's %s: %v, want ErrNotLeader", name, err)
		}
	}
	for _, id := range []string{"j-2", "j-3"} {
		if _, err := st2.Job(id); !errors.Is(err, store.ErrNotFound) {
			t.Errorf("job %s written by the deposed leader: %v", id, err)
		}
	}
	if _, err := st2.Node("node-x"); !errors.Is(err, store.ErrNotFound) {
		t.Errorf("node written by the deposed leader: %v", err)
	}
	if j, err := st2.Job("j-1"); err != nil || j.GetName() != "before" {
		t.Errorf("the old leader's acknowledged write: %v %v", j, err)
	}
	if err := st2.PutJob(&api.Job{Id: "j-4"}); err != nil {
		t.Errorf("the new leader's write: %v", err)
	}
	servers, err := b.Servers(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if len(servers) != 1 || servers[0].GetName() != "b" || servers[0].GetRole() != RoleLeader {
		t.Errorf("servers listed: %v, want b alone, leading (a's entry went with its session)", servers)
	}
}

// TestSharedAuthority: servers starting on one store end up with one
// cluster CA and join secret, their own server certificates signed by
// it; a data dir that issued from another CA is refused, not replaced.
func TestSharedAuthority(t *testing.T) {
	c := etcdtest.Start(t, 1)
	st, _ := openStore(t, c)
	dirs := []string{filepath.Join(t.TempDir(), "pki"), filepath.Join(t.TempDir(), "pki")}
	var cas [][]byte
	for _, d := range dirs {
		if _, err := OpenSharedAuthority(st, d, transport.AuthorityOptions{}); err != nil {
			t.Fatal(err)
		}
		b, err := os.ReadFile(filepath.Join(d, transport.CACertFile))
		if err != nil {
			t.Fatal(err)
		}
		cas = append(cas, b)
	}
	if !bytes.Equal(cas[0], cas[1]) {
		t.Fatal("the two servers have different CAs")
	}
	for _, f := range []string{transport.CAKeyFile, transport.TokenSecretFile} {
		a, _ := os.ReadFile(filepath.Join(dirs[0], f))
		b, _ := os.ReadFile(filepath.Join(dirs[1], f))
		if !bytes.Equal(a, b) {
			t.Errorf("%s differs between the servers", f)
		}
	}

	// A data dir of another cluster, that has issued certificates.
	other := filepath.Join(t.TempDir(), "pki")
	if _, err := transport.OpenAuthority(other, transport.AuthorityOptions{}); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(filepath.Dir(other), "admin.yaml"), []byte("server: x\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	_, err := OpenSharedAuthority(st, other, transport.AuthorityOptions{})
	if err == nil || !strings.Contains(err.Error(), "another cluster") {
		t.Fatalf("a data dir with another cluster's CA: %v, want it refused", err)
	}
}

// TestLeaderSinceIsWhenItBeganToLead: a standby that waited an hour
// before its leader resigned shows, once it leads, since when it leads:
// in its own status, in the server list, and at the other servers.
func TestLeaderSinceIsWhenItBeganToLead(t *testing.T) {
	c := etcdtest.Start(t, 1)
	ctx := context.Background()
	_, cfgA := openStore(t, c)
	stB, cfgB := openStore(t, c)
	_, cfgC := openStore(t, c)
	// b's clock, moved by the test.
	var clock atomic.Int64
	clock.Store(time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC).UnixNano())
	cfgB.Now = func() time.Time { return time.Unix(0, clock.Load()) }
	a, b, other := join(t, cfgA, "a"), join(t, cfgB, "b"), join(t, cfgC, "c")
	if _, err := a.Campaign(ctx); err != nil {
		t.Fatal(err)
	}
	won := make(chan error, 1)
	go func() {
		_, err := b.Campaign(ctx)
		won <- err
	}()
	// b is in the election, waiting behind a.
	deadline := time.Now().Add(10 * time.Second)
	for {
		resp, err := cfgB.Client.Get(ctx, b.cfg.key("leader/"), clientv3.WithPrefix(), clientv3.WithCountOnly())
		if err != nil {
			t.Fatal(err)
		}
		if resp.Count == 2 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d candidates in the election, want a and b", resp.Count)
		}
		time.Sleep(20 * time.Millisecond)
	}
	leading := time.Unix(0, clock.Add(int64(time.Hour))).UTC()
	if err := a.Close(); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-won:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("b did not lead after a resigned")
	}
	since := func(s *api.ServerStatus) time.Time { return time.Unix(0, s.GetSinceUnixNano()).UTC() }
	st := Status(ctx, b, stB)
	if got := since(st.GetSelf()); !got.Equal(leading) {
		t.Errorf("b's own status: since %s, want %s (when it began to lead)", got, leading)
	}
	if got := since(st.GetLeader()); !got.Equal(leading) {
		t.Errorf("b's status names the leader since %s, want %s", got, leading)
	}
	for _, s := range st.GetServers() {
		if s.GetName() == "b" && !since(s).Equal(leading) {
			t.Errorf("the server list has b %s since %s, want %s", s.GetRole(), since(s), leading)
		}
	}
	deadline = time.Now().Add(10 * time.Second)
	for l := other.Leader(); l.GetName() != "b" || !since(l).Equal(leading); l = other.Leader() {
		if time.Now().After(deadline) {
			t.Fatalf("another server sees leader %q since %s, want b since %s", l.GetName(), since(l), leading)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// TestCampaignAgainAfterSessionExpired: a leader cut off from etcd longer
// than its session's TTL loses its election key; once etcd is back it
// opens a new session and campaigns again, and its win is a real one
// (the key it won with exists), as is a win after its lease was revoked.
func TestCampaignAgainAfterSessionExpired(t *testing.T) {
	c := etcdtest.Start(t, 1)
	_, cfg := openStore(t, c)
	a := join(t, cfg, "a")
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	first, err := a.Campaign(ctx)
	if err != nil {
		t.Fatal(err)
	}
	lost := a.Lost()
	c.Kill(0)
	select {
	case <-lost:
	case <-time.After(15 * time.Second):
		t.Fatal("the session did not end while etcd was away")
	}
	c.Restart(0)
	again, err := a.Campaign(ctx)
	if err != nil {
		t.Fatalf("campaign after etcd's return: %v", err)
	}
	if again == first {
		t.Fatalf("won again with the vanished key %v", first)
	}
	hasKey := func(l Leadership) {
		t.Helper()
		resp, err := cfg.Client.Get(ctx, l.Key)
		if err != nil {
			t.Fatal(err)
		}
		if len(resp.Kvs) != 1 || resp.Kvs[0].CreateRevision != l.Rev {
			t.Fatalf("the won key %s (revision %d) is not in etcd: %v", l.Key, l.Rev, resp.Kvs)
		}
	}
	hasKey(again)
	if a.Self().GetRole() != RoleLeader || a.Leader().GetName() != "a" {
		t.Errorf("after winning again: self %v, leader %v", a.Self(), a.Leader())
	}

	s, _ := a.current()
	if _, err := cfg.Client.Revoke(ctx, s.Lease()); err != nil {
		t.Fatal(err)
	}
	third, err := a.Campaign(ctx)
	if err != nil {
		t.Fatalf("campaign after the lease was revoked: %v", err)
	}
	hasKey(third)
}
