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

// EventFilter selects events from the log.
type EventFilter struct {
	// Node limits to one node's events; empty means all.
	Node string
	// SinceUnixNano drops events older than this.
	SinceUnixNano int64
	// Limit keeps only the newest Limit events; 0 means all.
	Limit int
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
	// Events returns events matching f, oldest first.
	Events(f EventFilter) ([]*api.Event, error)
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
