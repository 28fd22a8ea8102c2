// Package watch serves the control plane's watch streams, after etcd's and
// Kubernetes' watches: a watcher gets a snapshot of the objects it follows,
// then every change with a revision; one that reconnects resumes from the
// revision it last applied. Changes to one object coalesce while a watcher
// has not yet been sent them, and a watcher that falls too far behind is
// resynced with a fresh snapshot rather than buffered without bound, so a
// slow client costs bounded memory and never blocks a publisher.
package watch

import (
	"cmp"
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/gpuctl/gpuctl/api"
)

// Options tunes a Hub; zero fields take the defaults noted.
type Options struct {
	// History is how many recent changes are kept for resuming watchers,
	// default 16384.
	History int
	// EventsKept is how many recent events the hub holds for snapshots,
	// default 1000.
	EventsKept int
	// MaxPending is how many unsent changes (after coalescing) a watcher
	// may hold before it is resynced, default 20000.
	MaxPending int
	// BatchSize bounds the changes in one batch, default 512.
	BatchSize int
}

func (o *Options) defaults() {
	if o.History <= 0 {
		o.History = 16384
	}
	if o.EventsKept <= 0 {
		o.EventsKept = 1000
	}
	if o.MaxPending <= 0 {
		o.MaxPending = 20000
	}
	if o.BatchSize <= 0 {
		o.BatchSize = 512
	}
}

// DefaultEventsBacklog is how many recent events a snapshot carries when
// the request names no number.
const DefaultEventsBacklog = 200

type objKey struct {
	kind api.WatchKind
	key  string
}

// Hub holds the latest state of every watched object (events: the most
// recent ones), a bounded log of recent changes, and the watchers.
type Hub struct {
	opt   Options
	epoch string

	mu       sync.Mutex
	rev      uint64
	latest   map[objKey]*api.WatchChange
	events   *ring
	log      *ring
	watchers map[*Watcher]struct{}
}

// New returns a hub with a fresh epoch.
func New(opt Options) *Hub {
	opt.defaults()
	var b [6]byte
	_, _ = rand.Read(b[:])
	return &Hub{opt: opt, epoch: hex.EncodeToString(b[:]), latest: map[objKey]*api.WatchChange{},
		events: newRing(opt.EventsKept), log: newRing(opt.History), watchers: map[*Watcher]struct{}{}}
}

// Epoch identifies this hub: revisions compare only within one epoch.
func (h *Hub) Epoch() string { return h.epoch }

// Revision is the revision of the last change published.
func (h *Hub) Revision() uint64 {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.rev
}

// PublishNode records a node's new status. The hub keeps the pointer:
// the caller must not modify n afterwards.
func (h *Hub) PublishNode(n *api.NodeStatus) {
	h.publish(&api.WatchChange{Kind: api.WatchKind_WATCH_KIND_NODES, Key: n.GetRegistration().GetName(), Node: n})
}

// DeleteNode records that a node is gone (removed from the cluster).
func (h *Hub) DeleteNode(name string) {
	h.publish(&api.WatchChange{Kind: api.WatchKind_WATCH_KIND_NODES, Key: name, Deleted: true})
}

// PublishJob records a job's new state; j must not be modified afterwards.
func (h *Hub) PublishJob(j *api.Job) {
	h.publish(&api.WatchChange{Kind: api.WatchKind_WATCH_KIND_JOBS, Key: j.GetId(), Job: j})
}

// PublishEvent records an event, once it is persisted; e must not be
// modified afterwards.
func (h *Hub) PublishEvent(e *api.Event) {
	h.publish(&api.WatchChange{Kind: api.WatchKind_WATCH_KIND_EVENTS, Event: e})
}

// PublishStall records a declared (or re-diagnosed) stall under key.
func (h *Hub) PublishStall(key string, s *api.Stall) {
	h.publish(&api.WatchChange{Kind: api.WatchKind_WATCH_KIND_STALLS, Key: key, Stall: s})
}

// DeleteStall records that the stall under key cleared.
func (h *Hub) DeleteStall(key string) {
	h.publish(&api.WatchChange{Kind: api.WatchKind_WATCH_KIND_STALLS, Key: key, Deleted: true})
}

// LoadEvents seeds the events a snapshot shows with ones read from the
// store at start, oldest first; they get revisions like any change.
func (h *Hub) LoadEvents(evs []*api.Event) {
	for _, e := range evs {
		h.PublishEvent(e)
	}
}

func (h *Hub) publish(c *api.WatchChange) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.rev++
	c.Revision = h.rev
	if c.Kind == api.WatchKind_WATCH_KIND_EVENTS {
		if c.Key == "" {
			c.Key = fmt.Sprintf("r%d", c.Revision)
		}
		h.events.push(c)
	} else if c.Deleted {
		delete(h.latest, objKey{c.Kind, c.Key})
	} else {
		h.latest[objKey{c.Kind, c.Key}] = c
	}
	h.log.push(c)
	for w := range h.watchers {
		if w.kinds[c.Kind] {
			w.offer(c, h.opt.MaxPending)
		}
	}
}

// Subscribe registers a watcher for req. Its first batches are a snapshot,
// or, when req resumes within this epoch and the history still holds every
// change since its revision, just those changes.
func (h *Hub) Subscribe(req *api.WatchRequest) *Watcher {
	kinds := map[api.WatchKind]bool{}
	var order []api.WatchKind
	for _, k := range req.GetKinds() {
		if k != api.WatchKind_WATCH_KIND_UNSPECIFIED && !kinds[k] {
			kinds[k] = true
			order = append(order, k)
		}
	}
	if len(order) == 0 {
		order = []api.WatchKind{api.WatchKind_WATCH_KIND_NODES, api.WatchKind_WATCH_KIND_JOBS,
			api.WatchKind_WATCH_KIND_EVENTS, api.WatchKind_WATCH_KIND_STALLS}
		for _, k := range order {
			kinds[k] = true
		}
	}
	backlog := int(req.GetEventsBacklog())
	if backlog <= 0 {
		backlog = DefaultEventsBacklog
	}
	w := &Watcher{h: h, kinds: kinds, order: order, backlog: backlog, index: map[objKey]int{}, notify: make(chan struct{}, 1)}
	h.mu.Lock()
	defer h.mu.Unlock()
	switch {
	case req.GetEpoch() == "" && req.GetSinceRevision() == 0:
		w.startSnapshotLocked("")
	case req.GetEpoch() != h.epoch:
		w.startSnapshotLocked("the server restarted, or another server took over, since revision " + fmt.Sprint(req.GetSinceRevision()))
	case !h.log.holdsAfter(req.GetSinceRevision(), h.rev):
		w.startSnapshotLocked(fmt.Sprintf("revision %d is not in the history this server keeps", req.GetSinceRevision()))
	default:
		w.sent = req.GetSinceRevision()
		for i := 0; i < h.log.len(); i++ {
			c := h.log.at(i)
			if c.Revision > w.sent && kinds[c.Kind] {
				w.offer(c, h.opt.MaxPending)
			}
		}
		if w.resync == "" {
			// A resumed watch is complete at once: say so, with the
			// revision reached, even when nothing changed.
			w.resumed = true
		}
	}
	h.watchers[w] = struct{}{}
	return w
}

// snapshotLocked lists the hub's current objects of w's kinds as changes,
// in kind order, objects of a kind by key.
func (h *Hub) snapshotLocked(w *Watcher) []*api.WatchChange {
	var out []*api.WatchChange
	for _, k := range w.order {
		if k == api.WatchKind_WATCH_KIND_EVENTS {
			n := h.events.len()
			for i := max(n-w.backlog, 0); i < n; i++ {
				out = append(out, h.events.at(i))
			}
			continue
		}
		start := len(out)
		for ok, c := range h.latest {
			if ok.kind == k {
				out = append(out, c)
			}
		}
		sortByKey(out[start:])
	}
	return out
}

// Watcher is one watch: what it has not been sent yet, coalesced per
// object, or the snapshot it owes.
type Watcher struct {
	h       *Hub
	kinds   map[api.WatchKind]bool
	order   []api.WatchKind
	backlog int
	notify  chan struct{}

	// Guarded by h.mu.
	pending []*api.WatchChange
	index   map[objKey]int
	// snapshot is a snapshot not yet sent, with resync's reason; once
	// pending overflows, resync names why and pending is dropped.
	snapshot   []*api.WatchChange
	snapRev    uint64
	inSnapshot bool
	resync     string
	resumed    bool
	// sent is the revision the watcher's client has been sent up to.
	sent   uint64
	closed bool
}

func (w *Watcher) startSnapshotLocked(reason string) {
	w.snapshot = w.h.snapshotLocked(w)
	w.snapRev = w.h.rev
	w.inSnapshot = true
	w.resync = reason
	w.pending, w.index = nil, map[objKey]int{}
	w.wake()
}

// offer queues c for w, replacing an unsent change of the same object;
// past max unsent changes the watcher owes a resync instead.
func (w *Watcher) offer(c *api.WatchChange, max int) {
	if w.closed {
		return
	}
	k := objKey{c.Kind, c.Key}
	if i, ok := w.index[k]; ok {
		w.pending[i] = c
	} else {
		if len(w.pending) >= max {
			w.startSnapshotLocked(fmt.Sprintf("fell behind by more than %d changes", max))
			return
		}
		w.index[k] = len(w.pending)
		w.pending = append(w.pending, c)
	}
	w.wake()
}

func (w *Watcher) wake() {
	select {
	case w.notify <- struct{}{}:
	default:
	}
}

// Next waits until the watcher has something to send, then returns it as
// batches: a snapshot (first batch Snapshot, last Synced), or the changes
// since the last call. It returns ctx's error when ctx ends first.
func (w *Watcher) Next(ctx context.Context) ([]*api.WatchBatch, error) {
	for {
		if bs := w.take(); bs != nil {
			return bs, nil
		}
		select {
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-w.notify:
		}
	}
}

// take returns what is owed now, or nil.
func (w *Watcher) take() []*api.WatchBatch {
	h := w.h
	h.mu.Lock()
	defer h.mu.Unlock()
	size := h.opt.BatchSize
	var out []*api.WatchBatch
	if w.inSnapshot {
		snap := w.snapshot
		w.snapshot, w.inSnapshot = nil, false
		for first := true; first || len(snap) > 0; first = false {
			n := min(len(snap), size)
			b := &api.WatchBatch{Epoch: h.epoch, Revision: w.snapRev, Changes: snap[:n]}
			if first {
				b.Snapshot, b.Kinds, b.ResyncReason = true, w.order, w.resync
			}
			snap = snap[n:]
			out = append(out, b)
		}
		out[len(out)-1].Synced = true
		w.resync = ""
		// Changes published after the snapshot was taken are in pending.
		w.sent = w.snapRev
	}
	if len(w.pending) > 0 || w.resumed {
		w.resumed = false
		pend := w.pending
		w.pending, w.index = nil, map[objKey]int{}
		// In revision order, each batch's revision is that of its last
		// change: a client that resumes from it after losing the rest
		// is sent the rest again.
		slices.SortFunc(pend, func(a, b *api.WatchChange) int { return cmp.Compare(a.Revision, b.Revision) })
		for len(pend) > 0 || out == nil {
			n := min(len(pend), size)
			rev := w.sent
			if n > 0 {
				rev = max(rev, pend[n-1].Revision)
			}
			out = append(out, &api.WatchBatch{Epoch: h.epoch, Revision: rev, Changes: pend[:n]})
			pend = pend[n:]
			w.sent = rev
		}
	}
	return out
}

// Close unregisters the watcher.
func (w *Watcher) Close() {
	h := w.h
	h.mu.Lock()
	defer h.mu.Unlock()
	w.closed = true
	delete(h.watchers, w)
}

// Watchers returns how many watchers are registered.
func (h *Hub) Watchers() int {
	h.mu.Lock()
	defer h.mu.Unlock()
	return len(h.watchers)
}

// Serve sends w's batches through send until ctx ends or send fails,
// waiting at least every between sends so that fast-changing objects
// (node telemetry) coalesce into one change per interval.
func Serve(ctx context.Context, w *Watcher, every time.Duration, send func(*api.WatchBatch) error) error {
	var last time.Time
	for {
		if wait := every - time.Since(last); !last.IsZero() && wait > 0 {
			t := time.NewTimer(wait)
			select {
			case <-ctx.Done():
				t.Stop()
				return ctx.Err()
			case <-t.C:
			}
		}
		bs, err := w.Next(ctx)
		if err != nil {
			return err
		}
		for _, b := range bs {
			if err := send(b); err != nil {
				return err
			}
		}
		last = time.Now()
	}
}

func sortByKey(cs []*api.WatchChange) {
	slices.SortFunc(cs, func(a, b *api.WatchChange) int { return strings.Compare(a.Key, b.Key) })
}

// ring is a bounded FIFO of changes that drops its oldest when full.
type ring struct {
	buf   []*api.WatchChange
	start int
	n     int
}

func newRing(capacity int) *ring { return &ring{buf: make([]*api.WatchChange, capacity)} }

func (r *ring) push(c *api.WatchChange) {
	if r.n < len(r.buf) {
		r.buf[(r.start+r.n)%len(r.buf)] = c
		r.n++
		return
	}
	r.buf[r.start] = c
	r.start = (r.start + 1) % len(r.buf)
}

func (r *ring) len() int { return r.n }

// at returns the i-th oldest change.
func (r *ring) at(i int) *api.WatchChange { return r.buf[(r.start+i)%len(r.buf)] }

// holdsAfter reports whether the ring still has every change after
// revision since, given that the newest change is revision top.
func (r *ring) holdsAfter(since, top uint64) bool {
	switch {
	case since > top:
		return false
	case since == top:
		return true
	case r.n == 0:
		return false
	}
	return r.at(0).Revision <= since+1
}
