package watch

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/gpuctl/gpuctl/api"
)

func nodeStatus(name string, util uint32) *api.NodeStatus {
	return &api.NodeStatus{Registration: &api.NodeRegistration{Name: name},
		Gpus: []*api.GPUStatus{{Last: &api.GPUSample{UtilGpuPercent: util}}}}
}

// take returns what w owes now, failing if it owes nothing.
func take(t *testing.T, w *Watcher) []*api.WatchBatch {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	bs, err := w.Next(ctx)
	if err != nil {
		t.Fatalf("Next: %v", err)
	}
	return bs
}

// owesNothing asserts w has nothing to send.
func owesNothing(t *testing.T, w *Watcher) {
	t.Helper()
	if bs := w.take(); bs != nil {
		t.Fatalf("watcher owes %d batches, want none: %v", len(bs), bs)
	}
}

func keys(bs []*api.WatchBatch) []string {
	var out []string
	for _, b := range bs {
		for _, c := range b.GetChanges() {
			k := c.GetKey()
			if c.GetDeleted() {
				k = "-" + k
			}
			if n := c.GetNode(); n != nil {
				k += fmt.Sprintf("=%d", n.GetGpus()[0].GetLast().GetUtilGpuPercent())
			}
			out = append(out, k)
		}
	}
	return out
}

func TestSnapshotThenCoalescedChanges(t *testing.T) {
	h := New(Options{})
	h.PublishNode(nodeStatus("n1", 10))
	h.PublishNode(nodeStatus("n0", 5))
	h.PublishJob(&api.Job{Id: "j-1"})
	w := h.Subscribe(&api.WatchRequest{Kinds: []api.WatchKind{api.WatchKind_WATCH_KIND_NODES}})
	defer w.Close()
	bs := take(t, w)
	if len(bs) != 1 || !bs[0].GetSnapshot() || !bs[0].GetSynced() || bs[0].GetEpoch() != h.Epoch() || bs[0].GetRevision() != 3 {
		t.Fatalf("snapshot batches %v", bs)
	}
	if got := strings.Join(keys(bs), " "); got != "n0=5 n1=10" {
		t.Fatalf("snapshot %q, want nodes by name and no job", got)
	}
	// Three changes to n1 and one to n0 before the watcher is served:
	// one change per node, the latest, in revision order.
	h.PublishNode(nodeStatus("n1", 11))
	h.PublishNode(nodeStatus("n0", 6))
	h.PublishJob(&api.Job{Id: "j-1", Name: "x"})
	h.PublishNode(nodeStatus("n1", 12))
	bs = take(t, w)
	if got := strings.Join(keys(bs), " "); got != "n0=6 n1=12" {
		t.Fatalf("changes %q, want n0=6 n1=12", got)
	}
	if bs[len(bs)-1].GetRevision() != 7 || bs[0].GetSnapshot() {
		t.Fatalf("batch %v: want revision 7, not a snapshot", bs[len(bs)-1])
	}
	owesNothing(t, w)
}

func TestSlowWatcherIsResyncedWithBoundedMemory(t *testing.T) {
	h := New(Options{MaxPending: 10})
	w := h.Subscribe(&api.WatchRequest{})
	defer w.Close()
	take(t, w)
	for i := range 25 {
		h.PublishEvent(&api.Event{Message: fmt.Sprint(i)})
		h.mu.Lock()
		n := len(w.pending)
		h.mu.Unlock()
		if n > 10 {
			t.Fatalf("watcher holds %d changes, bound 10", n)
		}
	}
	bs := take(t, w)
	if !bs[0].GetSnapshot() || !strings.Contains(bs[0].GetResyncReason(), "fell behind") {
		t.Fatalf("first batch after overflow %v, want a resync snapshot", bs[0])
	}
	var msgs []string
	for _, b := range bs {
		for _, c := range b.GetChanges() {
			msgs = append(msgs, c.GetEvent().GetMessage())
		}
	}
	// The resync carries the recent events (all 25 fit the backlog).
	if len(msgs) == 0 || msgs[len(msgs)-1] != "24" {
		t.Fatalf("resync events %v, want the newest last", msgs)
	}
}

func TestResume(t *testing.T) {
	h := New(Options{History: 8})
	h.PublishNode(nodeStatus("n0", 1))
	h.PublishStall("j-1/0", &api.Stall{Job: "j-1"})
	w := h.Subscribe(&api.WatchRequest{})
	take(t, w)
	w.Close()
	at := h.Revision()
	h.PublishNode(nodeStatus("n0", 2))
	h.DeleteStall("j-1/0")
	h.PublishNode(nodeStatus("n0", 3))

	tests := []struct {
		name       string
		req        *api.WatchRequest
		wantReason string
		want       string
	}{
		{"within history", &api.WatchRequest{Epoch: h.Epoch(), SinceRevision: at}, "", "-j-1/0 n0=3"},
		{"nothing since", &api.WatchRequest{Epoch: h.Epoch(), SinceRevision: h.Revision()}, "", ""},
		{"another epoch", &api.WatchRequest{Epoch: "old", SinceRevision: at}, "server restarted", "n0=3"},
		{"from the future", &api.WatchRequest{Epoch: h.Epoch(), SinceRevision: 99}, "not in the history", "n0=3"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			w := h.Subscribe(tc.req)
			defer w.Close()
			bs := take(t, w)
			if tc.wantReason == "" {
				if bs[0].GetSnapshot() {
					t.Fatalf("resumed watch got a snapshot: %v", bs[0])
				}
			} else if !bs[0].GetSnapshot() || !strings.Contains(bs[0].GetResyncReason(), tc.wantReason) {
				t.Fatalf("batch %v, want a snapshot because %q", bs[0], tc.wantReason)
			}
			if got := strings.Join(keys(bs), " "); got != tc.want {
				t.Fatalf("changes %q, want %q", got, tc.want)
			}
			if rev := bs[len(bs)-1].GetRevision(); rev != h.Revision() {
				t.Fatalf("revision %d, want %d", rev, h.Revision())
			}
		})
	}
	// Past the history bound the watcher is resynced.
	for i := range 10 {
		h.PublishNode(nodeStatus("n1", uint32(i)))
	}
	w = h.Subscribe(&api.WatchRequest{Epoch: h.Epoch(), SinceRevision: at})
	defer w.Close()
	if bs := take(t, w); !bs[0].GetSnapshot() {
		t.Fatalf("a revision past the history resumed: %v", bs[0])
	}
}

func TestBatchesSplitWithResumableRevisions(t *testing.T) {
	h := New(Options{BatchSize: 2})
	for i := range 5 {
		h.PublishNode(nodeStatus(fmt.Sprintf("n%d", i), 0))
	}
	w := h.Subscribe(&api.WatchRequest{Kinds: []api.WatchKind{api.WatchKind_WATCH_KIND_NODES}})
	defer w.Close()
	bs := take(t, w)
	if len(bs) != 3 || !bs[0].GetSnapshot() || bs[1].GetSnapshot() || bs[1].GetSynced() || !bs[2].GetSynced() {
		t.Fatalf("snapshot split as %v", bs)
	}
	for i := range 5 {
		h.PublishNode(nodeStatus(fmt.Sprintf("n%d", i), 1))
	}
	bs = take(t, w)
	var revs []uint64
	for _, b := range bs {
		revs = append(revs, b.GetRevision())
	}
	if fmt.Sprint(revs) != "[7 9 10]" {
		t.Fatalf("batch revisions %v, want each the revision of its last change", revs)
	}
}

func TestConcurrentPublishersAndWatchers(t *testing.T) {
	h := New(Options{MaxPending: 64})
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	var wg sync.WaitGroup
	final := map[string]uint32{}
	var mu sync.Mutex
	for p := range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range 500 {
				name := fmt.Sprintf("n%d", (p*500+i)%37)
				h.PublishNode(nodeStatus(name, uint32(i)))
			}
		}()
	}
	w := h.Subscribe(&api.WatchRequest{Kinds: []api.WatchKind{api.WatchKind_WATCH_KIND_NODES}})
	defer w.Close()
	done := make(chan struct{})
	go func() {
		defer close(done)
		_ = Serve(ctx, w, time.Millisecond, func(b *api.WatchBatch) error {
			mu.Lock()
			defer mu.Unlock()
			if b.GetSnapshot() {
				clear(final)
			}
			for _, c := range b.GetChanges() {
				final[c.GetKey()] = c.GetNode().GetGpus()[0].GetLast().GetUtilGpuPercent()
			}
			return nil
		})
	}()
	wg.Wait()
	// Once publishers stop, the watcher converges on the hub's state.
	deadline := time.Now().Add(time.Second)
	for {
		h.mu.Lock()
		want := map[string]uint32{}
		for k, c := range h.latest {
			want[k.key] = c.GetNode().GetGpus()[0].GetLast().GetUtilGpuPercent()
		}
		h.mu.Unlock()
		mu.Lock()
		same := fmt.Sprint(want) == fmt.Sprint(final)
		mu.Unlock()
		if same {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("watcher state %v, hub %v", final, want)
		}
		time.Sleep(5 * time.Millisecond)
	}
	cancel()
	<-done
}
