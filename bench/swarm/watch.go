package swarm

import (
	"context"
	"fmt"
	"sync"
	"time"

	"github.com/gpuctl/gpuctl/api"
)

// watcher follows the nodes through a client watch, as the console does,
// and times each new sample from the moment its node sent it (the sample's
// own time) to the moment the watch delivered it.
type watcher struct {
	mu        sync.Mutex
	ours      map[string]bool  // the swarm's nodes; others are ignored
	last      map[string]int64 // node → time of the newest sample seen
	state     map[string]api.NodeState
	measuring bool
	lat       []time.Duration
	visible   int // new node samples seen while measuring
	down      int // nodes that left ready while measuring
	resyncs   int
	changed   chan struct{}
}

func newWatcher(nodes []*node) *watcher {
	w := &watcher{ours: make(map[string]bool, len(nodes)), last: make(map[string]int64, len(nodes)),
		state: make(map[string]api.NodeState, len(nodes)), changed: make(chan struct{}, 1)}
	for _, n := range nodes {
		w.ours[n.name] = true
	}
	return w
}

func (w *watcher) apply(b *api.WatchBatch) error {
	now := time.Now().UnixNano()
	w.mu.Lock()
	defer w.mu.Unlock()
	if b.GetResyncReason() != "" {
		w.resyncs++
	}
	for _, c := range b.GetChanges() {
		n := c.GetNode()
		if n == nil {
			continue
		}
		name := n.GetRegistration().GetName()
		if !w.ours[name] {
			continue
		}
		st := n.GetState()
		if w.measuring && w.state[name] == api.NodeState_NODE_STATE_READY && st != api.NodeState_NODE_STATE_READY {
			w.down++
		}
		w.state[name] = st
		if len(n.GetGpus()) == 0 {
			continue
		}
		t := n.GetGpus()[0].GetLast().GetTimeUnixNano()
		if t > w.last[name] {
			if w.measuring && w.last[name] != 0 && !b.GetSnapshot() {
				w.lat = append(w.lat, time.Duration(now-t))
				w.visible++
			}
			w.last[name] = t
		}
	}
	select {
	case w.changed <- struct{}{}:
	default:
	}
	return nil
}

func (w *watcher) measure(on bool) {
	w.mu.Lock()
	w.measuring = on
	w.mu.Unlock()
}

func (w *watcher) ready() int {
	w.mu.Lock()
	defer w.mu.Unlock()
	n := 0
	for _, st := range w.state {
		if st == api.NodeState_NODE_STATE_READY {
			n++
		}
	}
	return n
}

// waitReady waits until the watch shows want nodes ready.
func (w *watcher) waitReady(ctx context.Context, want int, limit time.Duration) error {
	deadline := time.After(limit)
	for {
		if n := w.ready(); n >= want {
			return nil
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-deadline:
			return fmt.Errorf("%w: %d of %d ready after %s", errNotReady, w.ready(), want, limit)
		case <-w.changed:
		}
	}
}

// waitNone waits until the watch shows no node ready: a restarted server
// loads every node down until it reconnects.
func (w *watcher) waitNone(ctx context.Context, limit time.Duration) error {
	deadline := time.After(limit)
	for w.ready() > 0 {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-deadline:
			return fmt.Errorf("%d nodes still ready after %s", w.ready(), limit)
		case <-w.changed:
		}
	}
	return nil
}

func (w *watcher) results() (lat []time.Duration, visible, down, resyncs int) {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.lat, w.visible, w.down, w.resyncs
}
