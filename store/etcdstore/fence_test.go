package etcdstore

import (
	"bytes"
	"context"
	"crypto/rand"
	"errors"
	"strings"
	"sync"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.etcd.io/etcd/client/v3/concurrency"

	"github.com/gpuctl/gpuctl/api"
	"github.com/gpuctl/gpuctl/internal/etcdtest"
	"github.com/gpuctl/gpuctl/store"
)

// campaign opens a store on cli and returns it with an election session
// (TTL 1 s) whose campaign runs in the background; won is closed once it
// leads and the store is fenced under its key.
func campaign(t *testing.T, cli *clientv3.Client, name string) (*Store, *concurrency.Session, <-chan struct{}) {
	t.Helper()
	s, err := Open(context.Background(), cli, Options{Prefix: "/gpuctl/"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	sess, err := concurrency.NewSession(cli, concurrency.WithTTL(1))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { sess.Close() })
	e := concurrency.NewElection(sess, "/gpuctl/election")
	won := make(chan struct{})
	go func() {
		if err := e.Campaign(sess.Ctx(), name); err != nil {
			return // the session ended first
		}
		s.Fence(e.Key(), e.Rev())
		close(won)
	}()
	return s, sess, won
}

func wait(t *testing.T, ch <-chan struct{}, what string) {
	t.Helper()
	select {
	case <-ch:
	case <-time.After(15 * time.Second):
		t.Fatalf("%s: not within 15s", what)
	}
}

func TestDeposedLeaderWritesNothing(t *testing.T) {
	c := etcdtest.Start(t, 3)
	a, sessA, wonA := campaign(t, c.Client(t), "a")
	wait(t, wonA, "a elected")
	b, _, wonB := campaign(t, c.Client(t), "b")

	// b campaigns but does not lead: it is a standby and may not write.
	if err := b.PutJob(&api.Job{Id: "j-standby"}); !errors.Is(err, store.ErrNotLeader) {
		t.Fatalf("standby's PutJob: %v, want ErrNotLeader", err)
	}
	if err := a.PutJob(&api.Job{Id: "j-a"}); err != nil {
		t.Fatalf("leader's PutJob: %v", err)
	}
	if _, err := a.AppendNodeEvents("n1", []*api.Event{{Seq: 1, Node: "n1", TimeUnixNano: 1}}); err != nil {
		t.Fatal(err)
	}
	must(t, a.PutNode(&api.NodeStatus{Registration: &api.NodeRegistration{Name: "n1"}}))
	must(t, a.PutIdentity(&api.Identity{Kind: api.IdentityKind_IDENTITY_KIND_NODE, Name: "n1", Serial: "s1"}))
	must(t, a.PutToken(&api.JoinToken{Id: "t1", Uses: 5}))

	// a's session expires (a paused process: no more keep-alives), so its
	// election key goes and b is elected; a still believes it leads.
	sessA.Orphan()
	wait(t, wonB, "b elected after a's session expired")

	late := time.Now().UnixNano()
	lateEvent := &api.Event{Message: "late", TimeUnixNano: late}
	r := &api.Revocation{Reason: "late"}
	writes := []struct {
		name string
		fn   func() error
	}{
		{"PutJob", func() error { return a.PutJob(&api.Job{Id: "j-late"}) }},
		{"PutNode", func() error { return a.PutNode(&api.NodeStatus{Registration: &api.NodeRegistration{Name: "n-late"}}) }},
		{"AppendEvent", func() error { return a.AppendEvent(lateEvent) }},
		{"Update", func() error {
			return a.Update(func(tx store.Tx) error {
				if err := tx.PutJob(&api.Job{Id: "j-late"}); err != nil {
					return err
				}
				return tx.AppendEvent(lateEvent)
			})
		}},
		{"Update of many chunks", func() error {
			return a.Update(func(tx store.Tx) error {
				for range 300 {
					if err := tx.AppendEvent(lateEvent); err != nil {
						return err
					}
				}
				return nil
			})
		}},
		{"AppendNodeEvents", func() error {
			_, err := a.AppendNodeEvents("n1", []*api.Event{{Seq: 2, Node: "n1", Message: "late", TimeUnixNano: late}})
			return err
		}},
		{"PutIdentity", func() error {
			return a.PutIdentity(&api.Identity{Kind: api.IdentityKind_IDENTITY_KIND_USER, Name: "mallory", Serial: "late"})
		}},
		{"RevokeSerial", func() error { return a.RevokeSerial(&api.Revocation{Serial: "late"}) }},
		{"RevokeIdentities", func() error {
			_, err := a.RevokeIdentities(api.IdentityKind_IDENTITY_KIND_NODE, "n1", r)
			return err
		}},
		{"RemoveNode", func() error { _, err := a.RemoveNode("n1", r); return err }},
		{"PutToken", func() error { return a.PutToken(&api.JoinToken{Id: "t-late"}) }},
		{"UpdateToken", func() error {
			_, err := a.UpdateToken("t1", func(tok *api.JoinToken) error {
				tok.Used = append(tok.Used, &api.JoinTokenUse{Node: "late"})
				return nil
			})
			return err
		}},
	}
	for _, w := range writes {
		err := w.fn()
		if !errors.Is(err, store.ErrNotLeader) {
			t.Errorf("deposed leader's %s: %v, want ErrNotLeader", w.name, err)
		} else if !strings.Contains(err.Error(), "no longer the leader") {
			t.Errorf("deposed leader's %s: %q does not say it is no longer the leader", w.name, err)
		}
	}

	// Nothing of them is visible, to either store.
	for _, s := range []*Store{a, b} {
		if _, err := s.Job("j-late"); !errors.Is(err, store.ErrNotFound) {
			t.Errorf("deposed write of j-late visible: %v", err)
		}
		if _, err := s.Node("n-late"); !errors.Is(err, store.ErrNotFound) {
			t.Errorf("deposed write of n-late visible: %v", err)
		}
		if evs, err := s.Events(store.EventFilter{SinceUnixNano: late}); err != nil || len(evs) != 0 {
			t.Errorf("deposed events visible: %v, %v", evs, err)
		}
		if last, _ := s.LastNodeEventSeq("n1"); last != 1 {
			t.Errorf("n1's seq moved to %d by a deposed leader", last)
		}
		if _, err := s.Identity("late"); !errors.Is(err, store.ErrNotFound) {
			t.Errorf("deposed identity visible: %v", err)
		}
		if _, err := s.Revocation("late"); !errors.Is(err, store.ErrNotFound) {
			t.Errorf("deposed revocation visible: %v", err)
		}
		if _, err := s.Revocation("s1"); !errors.Is(err, store.ErrNotFound) {
			t.Errorf("deposed revocation of s1 visible: %v", err)
		}
		if _, err := s.Node("n1"); err != nil {
			t.Errorf("deposed RemoveNode removed n1: %v", err)
		}
		if toks, err := s.Tokens(); err != nil || len(toks) != 1 || len(toks[0].GetUsed()) != 0 {
			t.Errorf("tokens after deposed writes: %v, %v", toks, err)
		}
	}

	// The new leader's writes land, and it reads what a committed.
	must(t, b.PutJob(&api.Job{Id: "j-b"}))
	must(t, b.AppendEvent(&api.Event{Message: "b leads", TimeUnixNano: time.Now().UnixNano()}))
	if top, err := b.AppendNodeEvents("n1", []*api.Event{{Seq: 1, Node: "n1"}, {Seq: 2, Node: "n1", TimeUnixNano: 2}}); err != nil || top != 2 {
		t.Fatalf("new leader's AppendNodeEvents = %d, %v", top, err)
	}
	jobs, err := a.Jobs()
	if err != nil || len(jobs) != 2 || jobs[0].GetId() != "j-a" || jobs[1].GetId() != "j-b" {
		t.Fatalf("jobs after the handover: %v, %v", jobs, err)
	}
}

// TestEventsOfANewLeaderSortAfter: events of one nanosecond written by
// two leaders in turn keep the order of the handover.
func TestEventsOfANewLeaderSortAfter(t *testing.T) {
	c := etcdtest.Start(t, 1)
	cli := c.Client(t)
	a := openFenced(t, cli, Options{Prefix: "/p/"})
	must(t, a.AppendEvent(&api.Event{TimeUnixNano: 5, Message: "first"}))
	b := openFenced(t, cli, Options{Prefix: "/p/"}) // a new leadership key revision
	must(t, b.AppendEvent(&api.Event{TimeUnixNano: 5, Message: "second"}))
	if err := a.AppendEvent(&api.Event{TimeUnixNano: 5}); !errors.Is(err, store.ErrNotLeader) {
		t.Fatalf("old leadership's write: %v", err)
	}
	evs, err := b.Events(store.EventFilter{})
	if err != nil || len(evs) != 2 || evs[0].GetMessage() != "first" || evs[1].GetMessage() != "second" {
		t.Fatalf("events = %v, %v", evs, err)
	}
}

func TestSecretRaceGivesOneValue(t *testing.T) {
	c := etcdtest.Start(t, 1)
	var stores []*Store
	for range 2 {
		s, err := Open(context.Background(), c.Client(t), Options{}) // not fenced
		if err != nil {
			t.Fatal(err)
		}
		stores = append(stores, s)
	}
	var mu sync.Mutex
	var got [][]byte
	var wg sync.WaitGroup
	for i := range 8 {
		wg.Go(func() {
			v, err := stores[i%2].LoadOrCreateSecret("ca", func() ([]byte, error) { return []byte(rand.Text()), nil })
			if err != nil {
				t.Error(err)
				return
			}
			mu.Lock()
			got = append(got, v)
			mu.Unlock()
		})
	}
	wg.Wait()
	for _, v := range got {
		if !bytes.Equal(v, got[0]) || len(v) == 0 {
			t.Fatalf("racing servers got different secrets: %q", got)
		}
	}
	boom := errors.New("no entropy")
	if _, err := stores[0].LoadOrCreateSecret("other", func() ([]byte, error) { return nil, boom }); !errors.Is(err, boom) {
		t.Fatalf("create's error: %v", err)
	}
}

func must(t testing.TB, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}

// TestClaimTerm: each leadership's claim returns the holder before it, so
// a server winning again sees whether another led in between; a deposed
// leader's claim is refused like any write; and while etcd is known to be
// away (SetAway) every request fails at once with that reason.
func TestClaimTerm(t *testing.T) {
	c := etcdtest.Start(t, 1)
	cli := c.Client(t)
	a, sessA, wonA := campaign(t, cli, "a")
	wait(t, wonA, "a elected")
	if prev, err := a.ClaimTerm("a 1"); err != nil || prev != "" {
		t.Fatalf("the first claim: %q, %v; want none before", prev, err)
	}
	if prev, err := a.ClaimTerm("a 2"); err != nil || prev != "a 1" {
		t.Fatalf("claiming again: %q, %v; want a 1 before", prev, err)
	}
	b, _, wonB := campaign(t, cli, "b")
	sessA.Close()
	wait(t, wonB, "b elected")
	if prev, err := b.ClaimTerm("b 1"); err != nil || prev != "a 2" {
		t.Fatalf("b's claim: %q, %v; want a 2 before", prev, err)
	}
	if _, err := a.ClaimTerm("a 3"); !errors.Is(err, store.ErrNotLeader) {
		t.Fatalf("the deposed leader's claim: %v, want ErrNotLeader", err)
	}

	away := errors.New("the store (etcd) is unreachable since 12:00")
	b.SetAway(func() error { return away })
	start := time.Now()
	for name, req := range map[string]func() error{
		"PutJob": func() error { return b.PutJob(&api.Job{Id: "j-away"}) },
		"Jobs":   func() error { _, err := b.Jobs(); return err },
		"Events": func() error { _, err := b.Events(store.EventFilter{Limit: 10}); return err },
	} {
		if err := req(); !errors.Is(err, away) {
			t.Errorf("%s while away: %v, want the away reason", name, err)
		}
	}
	if took := time.Since(start); took > time.Second {
		t.Errorf("requests while away took %s, want at once", took)
	}
	if err := b.Ping(context.Background()); err != nil {
		t.Errorf("Ping is not held back by SetAway: %v", err)
	}
	b.SetAway(func() error { return nil })
	if err := b.PutJob(&api.Job{Id: "j-back"}); err != nil {
		t.Errorf("a write once back: %v", err)
	}
}
