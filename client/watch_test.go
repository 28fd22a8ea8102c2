package client

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/gpuctl/gpuctl/api"
	"github.com/gpuctl/gpuctl/transport"
)

// scriptTransport answers each Call with the next script entry: the
// batches to send, then the error that ends the call (a lost connection).
type scriptTransport struct {
	mu     sync.Mutex
	script []scriptCall
	reqs   []*api.WatchRequest
}

type scriptCall struct {
	batches []*api.WatchBatch
	err     error
}

func (s *scriptTransport) Close() error { return nil }

func (s *scriptTransport) Call(ctx context.Context, req *api.ClientRequest, fn func(*api.ClientResponse) error) error {
	s.mu.Lock()
	s.reqs = append(s.reqs, req.GetWatch())
	if len(s.script) == 0 {
		s.mu.Unlock()
		<-ctx.Done()
		return ctx.Err()
	}
	c := s.script[0]
	s.script = s.script[1:]
	s.mu.Unlock()
	for _, b := range c.batches {
		if err := fn(&api.ClientResponse{Body: &api.ClientResponse_Watch{Watch: b}}); err != nil {
			return err
		}
	}
	return c.err
}

func node(name string, util uint32) *api.WatchChange {
	return &api.WatchChange{Kind: api.WatchKind_WATCH_KIND_NODES, Key: name, Node: &api.NodeStatus{
		Registration: &api.NodeRegistration{Name: name},
		Gpus:         []*api.GPUStatus{{Last: &api.GPUSample{UtilGpuPercent: util}}},
	}}
}

func TestWatchResumesFromLastAppliedRevision(t *testing.T) {
	lost := errors.New("connection lost")
	tr := &scriptTransport{script: []scriptCall{
		{batches: []*api.WatchBatch{
			{Epoch: "e1", Revision: 5, Snapshot: true, Changes: []*api.WatchChange{node("n0", 10), node("n1", 20)}, Synced: true},
			{Epoch: "e1", Revision: 7, Changes: []*api.WatchChange{node("n1", 30)}},
		}, err: lost},
		{batches: []*api.WatchBatch{
			{Epoch: "e1", Revision: 9, Changes: []*api.WatchChange{{Kind: api.WatchKind_WATCH_KIND_NODES, Key: "n0", Deleted: true}}},
		}, err: lost},
		{batches: []*api.WatchBatch{
			{Epoch: "e2", Revision: 1, Snapshot: true, ResyncReason: "another epoch", Changes: []*api.WatchChange{node("n2", 1)}, Synced: true},
		}},
	}}
	c := New(tr)
	cache := NewCache()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	var disconnects int
	err := c.Watch(ctx, &api.WatchRequest{Kinds: []api.WatchKind{api.WatchKind_WATCH_KIND_NODES}},
		WatchOptions{Backoff: &transport.Backoff{Base: time.Millisecond, Max: time.Millisecond},
			OnDisconnect: func(error, time.Duration) { disconnects++ }},
		func(b *api.WatchBatch) error {
			cache.Apply(b)
			if b.GetEpoch() == "e2" {
				cancel()
			}
			return nil
		})
	if err != nil {
		t.Fatal(err)
	}
	if disconnects != 2 {
		t.Errorf("disconnects = %d, want 2", disconnects)
	}
	want := []struct {
		epoch string
		rev   uint64
	}{{"", 0}, {"e1", 7}, {"e1", 9}}
	if len(tr.reqs) < len(want) {
		t.Fatalf("%d watch requests, want %d", len(tr.reqs), len(want))
	}
	for i, w := range want {
		if got := tr.reqs[i]; got.GetEpoch() != w.epoch || got.GetSinceRevision() != w.rev {
			t.Errorf("request %d resumes from %q/%d, want %q/%d", i, got.GetEpoch(), got.GetSinceRevision(), w.epoch, w.rev)
		}
		if k := tr.reqs[i].GetKinds(); len(k) != 1 || k[0] != api.WatchKind_WATCH_KIND_NODES {
			t.Errorf("request %d kinds %v", i, k)
		}
	}
	s := cache.Snapshot()
	if len(s.Nodes) != 1 || s.Nodes[0].GetRegistration().GetName() != "n2" || !s.Synced || s.Epoch != "e2" {
		t.Fatalf("after resync the cache holds %v (synced %v, epoch %s), want only n2", s.Nodes, s.Synced, s.Epoch)
	}
}

func TestCacheAppliesChangesAndBoundsEvents(t *testing.T) {
	c := NewCache()
	c.EventsKept = 3
	ev := func(n int64) *api.WatchChange {
		return &api.WatchChange{Kind: api.WatchKind_WATCH_KIND_EVENTS, Event: &api.Event{TimeUnixNano: n}}
	}
	c.Apply(&api.WatchBatch{Epoch: "e", Revision: 1, Snapshot: true, Changes: []*api.WatchChange{node("b", 1), node("a", 2), ev(1), ev(2)}})
	if c.Snapshot().Synced {
		t.Error("synced before the snapshot's last part")
	}
	c.Apply(&api.WatchBatch{Epoch: "e", Revision: 2, Synced: true, Changes: []*api.WatchChange{ev(3), ev(4),
		{Kind: api.WatchKind_WATCH_KIND_JOBS, Key: "j-1", Job: &api.Job{Id: "j-1", Name: "train"}},
		{Kind: api.WatchKind_WATCH_KIND_STALLS, Key: "j-1/0", Stall: &api.Stall{Job: "j-1"}}}})
	if !c.Changed() {
		t.Error("Changed false after Apply")
	}
	s := c.Snapshot()
	if c.Changed() {
		t.Error("Changed true after Snapshot")
	}
	if !s.Synced || s.Revision != 2 {
		t.Errorf("synced %v revision %d", s.Synced, s.Revision)
	}
	if s.Nodes[0].GetRegistration().GetName() != "a" || s.Node("b") == nil || s.Node("zz") != nil {
		t.Errorf("nodes not sorted or not found: %v", s.Nodes)
	}
	if len(s.Events) != 3 || s.Events[0].GetTimeUnixNano() != 2 {
		t.Errorf("events %v, want the last 3", s.Events)
	}
	if s.Job("train") == nil || s.Job("j-1") == nil || len(s.Stalls) != 1 {
		t.Errorf("jobs %v stalls %v", s.Jobs, s.Stalls)
	}
	c.Apply(&api.WatchBatch{Epoch: "e", Revision: 3, Changes: []*api.WatchChange{{Kind: api.WatchKind_WATCH_KIND_STALLS, Key: "j-1/0", Deleted: true}}})
	if s2 := c.Snapshot(); len(s2.Stalls) != 0 || len(s.Stalls) != 1 {
		t.Errorf("a cleared stall stays, or an earlier snapshot changed: %v %v", s2.Stalls, s.Stalls)
	}
}
