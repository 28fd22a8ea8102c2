// Package feed follows the cluster for consoles: one watch (client.Watch
// into a client.Cache) whose snapshots are handed to every subscribed
// console at most a few times a second, each with the history of the
// snapshots before it. A local console has one subscriber; gpuctl serve's
// SSH console has one per session, all sharing the one watch and the one
// history.
package feed

import (
	"context"
	"log/slog"
	"strconv"
	"strings"
	"sync"
	"time"

	tea "charm.land/bubbletea/v2"

	"github.com/gpuctl/gpuctl/api"
	"github.com/gpuctl/gpuctl/client"
	"github.com/gpuctl/gpuctl/tui/app"
)

// DefaultInterval is the least time between two snapshots handed out:
// at most four redraws a second from cluster changes.
const DefaultInterval = 250 * time.Millisecond

// Watcher is what a hub follows: *client.Client.
type Watcher interface {
	Watch(ctx context.Context, req *api.WatchRequest, opt client.WatchOptions, fn func(*api.WatchBatch) error) error
}

// Poller lists what a watch would say, for servers that do not serve
// watch streams (protocol v1.0): *client.Client.
type Poller interface {
	Nodes(ctx context.Context) ([]*api.NodeStatus, error)
	Jobs(ctx context.Context, job string) ([]*api.Job, error)
	ListStalls(ctx context.Context, job string) ([]*api.Stall, error)
	Events(ctx context.Context, req *api.ListEventsRequest) ([]*api.Event, error)
}

// Options tunes a Hub.
type Options struct {
	// Interval is the least time between snapshots, default DefaultInterval.
	Interval time.Duration
	// PollEvery paces the fallback for servers without watch streams,
	// default 1 s.
	PollEvery time.Duration
	Log       *slog.Logger
	// Now is the clock the history's rates are measured by, default time.Now.
	Now func() time.Time
}

// Hub is one watch shared by many consoles.
type Hub struct {
	w    Watcher
	opt  Options
	log  *slog.Logger
	mu   sync.Mutex
	c    *client.Cache
	subs map[int]*mailbox
	next int
	snap *client.Snapshot
	hist *app.History
	// dirty is set by every batch; the ticker clears it.
	dirty bool
	// flushing makes Flush one writer at a time: rec records each
	// snapshot once, outside mu, for every subscriber.
	flushing sync.Mutex
	rec      *app.Recorder
}

// New returns a hub following w; Run starts it.
func New(w Watcher, opt Options) *Hub {
	if opt.Interval <= 0 {
		opt.Interval = DefaultInterval
	}
	if opt.PollEvery <= 0 {
		opt.PollEvery = time.Second
	}
	if opt.Now == nil {
		opt.Now = time.Now
	}
	log := opt.Log
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	return &Hub{w: w, opt: opt, log: log, c: client.NewCache(), subs: map[int]*mailbox{}, rec: app.NewRecorder()}
}

// Subscribe hands send every snapshot (as app.SnapshotMsg) and connection
// change (app.ConnMsg) from now on, the latest snapshot first. send may
// block (tea.Program.Send does): each subscriber has its own goroutine
// and only the newest message waits, so a slow session never holds up
// the others. The returned func ends the subscription.
func (h *Hub) Subscribe(send func(tea.Msg)) (cancel func()) {
	mb := newMailbox(send)
	h.mu.Lock()
	id := h.next
	h.next++
	h.subs[id] = mb
	if h.snap != nil {
		mb.put(app.SnapshotMsg{Snap: *h.snap, History: h.hist})
	}
	h.mu.Unlock()
	return func() {
		h.mu.Lock()
		delete(h.subs, id)
		h.mu.Unlock()
		mb.close()
	}
}

// Subscribers returns how many consoles are subscribed.
func (h *Hub) Subscribers() int {
	h.mu.Lock()
	defer h.mu.Unlock()
	return len(h.subs)
}

func (h *Hub) broadcast(msg tea.Msg) {
	h.mu.Lock()
	defer h.mu.Unlock()
	for _, mb := range h.subs {
		mb.put(msg)
	}
}

// Apply folds in one batch, as the watch does; tests and benchmarks feed
// a hub with it directly.
func (h *Hub) Apply(b *api.WatchBatch) {
	h.mu.Lock()
	h.c.Apply(b)
	h.dirty = true
	h.mu.Unlock()
}

// Flush hands out a snapshot now if anything changed since the last,
// with the history up to it. The history is recorded here, once per
// snapshot, not by each console: the subscribers only read it.
func (h *Hub) Flush() {
	h.flushing.Lock()
	defer h.flushing.Unlock()
	h.mu.Lock()
	if !h.dirty {
		h.mu.Unlock()
		return
	}
	h.dirty = false
	s := h.c.Snapshot()
	h.mu.Unlock()
	hist := h.rec.Observe(&s, h.opt.Now().UnixNano())
	h.mu.Lock()
	h.snap, h.hist = &s, hist
	subs := make([]*mailbox, 0, len(h.subs))
	for _, mb := range h.subs {
		subs = append(subs, mb)
	}
	h.mu.Unlock()
	for _, mb := range subs {
		mb.put(app.SnapshotMsg{Snap: s, History: hist})
	}
}

// Run follows the cluster until ctx ends.
func (h *Hub) Run(ctx context.Context) error {
	go h.tick(ctx)
	lost := false
	err := h.w.Watch(ctx, &api.WatchRequest{EventsBacklog: client.DefaultEventsKept}, client.WatchOptions{Log: h.log,
		OnDisconnect: func(err error, retry time.Duration) {
			lost = true
			h.broadcast(app.ConnMsg{Err: err, RetryIn: retry})
		}}, func(b *api.WatchBatch) error {
		if lost {
			lost = false
			h.broadcast(app.ConnMsg{})
		}
		h.Apply(b)
		return nil
	})
	if err != nil && isUnknownRequest(err) {
		if p, ok := h.w.(Poller); ok {
			h.log.Info("the server does not serve watch streams; polling instead", "every", h.opt.PollEvery)
			return h.poll(ctx, p)
		}
	}
	if ctx.Err() != nil {
		return nil
	}
	return err
}

func isUnknownRequest(err error) bool { return strings.Contains(err.Error(), "unknown request") }

func (h *Hub) tick(ctx context.Context) {
	t := time.NewTicker(h.opt.Interval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			h.Flush()
		}
	}
}

// poll lists the cluster every PollEvery and applies it as a snapshot.
func (h *Hub) poll(ctx context.Context, p Poller) error {
	t := time.NewTicker(h.opt.PollEvery)
	defer t.Stop()
	var rev uint64
	down := false
	for {
		b, err := pollOnce(ctx, p)
		if ctx.Err() != nil {
			return nil
		}
		if err != nil {
			down = true
			h.broadcast(app.ConnMsg{Err: err, RetryIn: h.opt.PollEvery})
		} else {
			if down {
				down = false
				h.broadcast(app.ConnMsg{})
			}
			rev++
			b.Epoch, b.Revision = "poll", rev
			h.Apply(b)
		}
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
		}
	}
}

func pollOnce(ctx context.Context, p Poller) (*api.WatchBatch, error) {
	c, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	nodes, err := p.Nodes(c)
	if err != nil {
		return nil, err
	}
	jobs, err := p.Jobs(c, "")
	if err != nil {
		return nil, err
	}
	stalls, err := p.ListStalls(c, "")
	if err != nil {
		return nil, err
	}
	evs, err := p.Events(c, &api.ListEventsRequest{Limit: 500})
	if err != nil {
		return nil, err
	}
	b := &api.WatchBatch{Snapshot: true, Synced: true}
	for _, n := range nodes {
		b.Changes = append(b.Changes, &api.WatchChange{Kind: api.WatchKind_WATCH_KIND_NODES, Key: n.GetRegistration().GetName(), Node: n})
	}
	for _, j := range jobs {
		b.Changes = append(b.Changes, &api.WatchChange{Kind: api.WatchKind_WATCH_KIND_JOBS, Key: j.GetId(), Job: j})
	}
	for i, s := range stalls {
		b.Changes = append(b.Changes, &api.WatchChange{Kind: api.WatchKind_WATCH_KIND_STALLS, Key: s.GetJob() + "/" + strconv.Itoa(i), Stall: s})
	}
	for _, e := range evs {
		b.Changes = append(b.Changes, &api.WatchChange{Kind: api.WatchKind_WATCH_KIND_EVENTS, Event: e})
	}
	return b, nil
}

// mailbox delivers the newest message to one subscriber, dropping older
// snapshots it has not taken yet (connection changes are never dropped
// behind a snapshot: the root model treats a snapshot as "connected").
type mailbox struct {
	send func(tea.Msg)
	ch   chan tea.Msg
	done chan struct{}
	once sync.Once
}

func newMailbox(send func(tea.Msg)) *mailbox {
	mb := &mailbox{send: send, ch: make(chan tea.Msg, 1), done: make(chan struct{})}
	go mb.loop()
	return mb
}

func (mb *mailbox) put(msg tea.Msg) {
	for {
		select {
		case mb.ch <- msg:
			return
		case <-mb.done:
			return
		default:
		}
		// Full: drop the older message and try again.
		select {
		case <-mb.ch:
		default:
		}
	}
}

func (mb *mailbox) loop() {
	for {
		select {
		case <-mb.done:
			return
		case msg := <-mb.ch:
			mb.send(msg)
		}
	}
}

func (mb *mailbox) close() { mb.once.Do(func() { close(mb.done) }) }
