package client

import (
	"cmp"
	"slices"
	"strings"

	"github.com/gpuctl/gpuctl/api"
)

// DefaultEventsKept is how many recent events a Cache holds.
const DefaultEventsKept = 2000

// Cache holds what a watch has said so far: the latest state of every
// node, job and stall, and the most recent events. Apply folds in one
// batch; Snapshot hands out an immutable view. It is not safe for
// concurrent use: one goroutine applies, and snapshots are values.
type Cache struct {
	// EventsKept bounds the events held, default DefaultEventsKept.
	EventsKept int

	epoch    string
	revision uint64
	synced   bool
	nodes    map[string]*api.NodeStatus
	jobs     map[string]*api.Job
	stalls   map[string]*api.Stall
	events   []*api.Event
	// changed is set by Apply and cleared by Snapshot, so a console can
	// redraw only when something changed.
	changed bool
}

// NewCache returns an empty cache.
func NewCache() *Cache {
	return &Cache{nodes: map[string]*api.NodeStatus{}, jobs: map[string]*api.Job{}, stalls: map[string]*api.Stall{}}
}

// Apply folds in one batch: a snapshot first forgets what the cache held of
// the batch's kinds.
func (c *Cache) Apply(b *api.WatchBatch) {
	if b.GetSnapshot() {
		kinds := b.GetKinds()
		if len(kinds) == 0 {
			kinds = []api.WatchKind{api.WatchKind_WATCH_KIND_NODES, api.WatchKind_WATCH_KIND_JOBS,
				api.WatchKind_WATCH_KIND_EVENTS, api.WatchKind_WATCH_KIND_STALLS}
		}
		for _, k := range kinds {
			switch k {
			case api.WatchKind_WATCH_KIND_NODES:
				c.nodes = map[string]*api.NodeStatus{}
			case api.WatchKind_WATCH_KIND_JOBS:
				c.jobs = map[string]*api.Job{}
			case api.WatchKind_WATCH_KIND_STALLS:
				c.stalls = map[string]*api.Stall{}
			case api.WatchKind_WATCH_KIND_EVENTS:
				c.events = nil
			}
		}
		c.synced = false
	}
	for _, ch := range b.GetChanges() {
		switch ch.GetKind() {
		case api.WatchKind_WATCH_KIND_NODES:
			applyKeyed(c.nodes, ch, ch.GetNode())
		case api.WatchKind_WATCH_KIND_JOBS:
			applyKeyed(c.jobs, ch, ch.GetJob())
		case api.WatchKind_WATCH_KIND_STALLS:
			applyKeyed(c.stalls, ch, ch.GetStall())
		case api.WatchKind_WATCH_KIND_EVENTS:
			if e := ch.GetEvent(); e != nil && !ch.GetDeleted() {
				c.events = append(c.events, e)
			}
		}
	}
	if keep := c.eventsKept(); len(c.events) > keep {
		c.events = slices.Clone(c.events[len(c.events)-keep:])
	}
	if b.GetSynced() {
		c.synced = true
	}
	c.epoch, c.revision = b.GetEpoch(), b.GetRevision()
	c.changed = true
}

func applyKeyed[T any](m map[string]*T, ch *api.WatchChange, obj *T) {
	if ch.GetDeleted() || obj == nil {
		delete(m, ch.GetKey())
		return
	}
	m[ch.GetKey()] = obj
}

func (c *Cache) eventsKept() int {
	if c.EventsKept > 0 {
		return c.EventsKept
	}
	return DefaultEventsKept
}

// Changed reports whether a batch was applied since the last Snapshot.
func (c *Cache) Changed() bool { return c.changed }

// Snapshot is the cluster as a watch last described it. Its slices are
// shared, never modified: treat every object as read-only.
type Snapshot struct {
	Epoch    string
	Revision uint64
	// Synced is false until the first snapshot has fully arrived.
	Synced bool
	// Nodes by name, Jobs oldest first, Stalls by job then start, Events
	// oldest first.
	Nodes  []*api.NodeStatus
	Jobs   []*api.Job
	Stalls []*api.Stall
	Events []*api.Event
}

// Snapshot returns the cache's current view and clears Changed.
func (c *Cache) Snapshot() Snapshot {
	c.changed = false
	s := Snapshot{Epoch: c.epoch, Revision: c.revision, Synced: c.synced, Events: slices.Clone(c.events)}
	s.Nodes = sortedValues(c.nodes, func(a, b *api.NodeStatus) int {
		return strings.Compare(a.GetRegistration().GetName(), b.GetRegistration().GetName())
	})
	s.Jobs = sortedValues(c.jobs, api.OldestFirst)
	s.Stalls = sortedValues(c.stalls, func(a, b *api.Stall) int {
		return cmp.Or(strings.Compare(a.GetJob(), b.GetJob()), cmp.Compare(a.GetSinceUnixNano(), b.GetSinceUnixNano()),
			cmp.Compare(a.GetComm(), b.GetComm()))
	})
	return s
}

func sortedValues[T any](m map[string]*T, cmpFn func(a, b *T) int) []*T {
	out := make([]*T, 0, len(m))
	for _, v := range m {
		out = append(out, v)
	}
	slices.SortFunc(out, cmpFn)
	return out
}

// Node returns the named node, or nil.
func (s *Snapshot) Node(name string) *api.NodeStatus {
	i, ok := slices.BinarySearchFunc(s.Nodes, name, func(n *api.NodeStatus, name string) int {
		return strings.Compare(n.GetRegistration().GetName(), name)
	})
	if !ok {
		return nil
	}
	return s.Nodes[i]
}

// Job returns the job key means, by api.FindJob, or nil when it means
// none or is ambiguous.
func (s *Snapshot) Job(key string) *api.Job {
	j, _ := api.FindJob(s.Jobs, key)
	return j
}
