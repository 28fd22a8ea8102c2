// Package store persists what gpuctl serve must not lose across a restart:
// nodes, their cordons, the event log and jobs. Everything is written before the
// caller acknowledges it to a peer.
package store

import (
	"errors"

	"github.com/gpuctl/gpuctl/api"
)

// ErrNotFound is returned when the asked-for record does not exist.
var ErrNotFound = errors.New("not found")

// ErrNotLeader is returned by a replicated store's write when this server
// does not hold the leadership it writes under: it was deposed (another
// gpuctl serve now leads) or it is a standby. Nothing of the write is stored.
var ErrNotLeader = errors.New("this gpuctl serve is no longer the leader (another server now is, or none is elected yet); nothing was written")

// EventFilter selects events from the log.
type EventFilter struct {
	// Node limits to one node's events; empty means all.
	Node string
	// SinceUnixNano drops events older than this.
	SinceUnixNano int64
	// Job limits to one job's events; empty means all.
	Job string
	// Limit keeps only the newest Limit events; 0 means all.
	Limit int
}

// Tx is the writes of one transaction: they commit together or not at all.
type Tx interface {
	PutNode(n *api.NodeStatus) error
	PutJob(j *api.Job) error
	AppendEvent(e *api.Event) error
}

// Store is the persistence interface of the control plane. The bbolt
// implementation is the embedded default; an etcd one can sit behind the
// same methods for a highly available console.
type Store interface {
	// PutNode creates or replaces a node's record.
	PutNode(n *api.NodeStatus) error
	// Node returns one node or ErrNotFound.
	Node(name string) (*api.NodeStatus, error)
	// Nodes returns every node, sorted by name.
	Nodes() ([]*api.NodeStatus, error)
	// AppendNodeEvents persists a node's events in order, skipping those
	// whose per-node seq was persisted before (a resend after reconnect),
	// and returns the highest seq now persisted for the node.
	AppendNodeEvents(node string, events []*api.Event) (uint64, error)
	// LastNodeEventSeq returns the highest event seq persisted for node, 0
	// for none.
	LastNodeEventSeq(node string) (uint64, error)
	// AppendEvent persists an event raised by the server itself.
	AppendEvent(e *api.Event) error
	// Events returns events matching f in time order, oldest first
	// (events of several nodes interleave by their time, however late a
	// node delivered them).
	Events(f EventFilter) ([]*api.Event, error)
	// Update runs fn in one transaction: its writes commit together or,
	// when fn or the commit fails, not at all.
	Update(fn func(Tx) error) error
	// PutJob creates or replaces a job's record (its spec, plan, state and
	// placement) under its id.
	PutJob(j *api.Job) error
	// Job returns one job or ErrNotFound.
	Job(id string) (*api.Job, error)
	// Jobs returns every job, sorted by id.
	Jobs() ([]*api.Job, error)
	// Close releases the store.
	Close() error
}
