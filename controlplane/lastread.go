package controlplane

import (
	"errors"
	"fmt"
	"sync"

	"github.com/gpuctl/gpuctl/api"
	"github.com/gpuctl/gpuctl/store"
	"github.com/gpuctl/gpuctl/transport"
)

// lastRead keeps the last answer the store gave to each read a server
// makes for its clients and at its handshakes, so that while the store is
// away (the control plane read-only) they are answered as they last were
// rather than refused. Only what was read may be answered: a question
// never asked before is still refused with the store's error.
type lastRead struct {
	mu     sync.Mutex
	nodes  remembered[[]*api.NodeStatus]
	jobs   remembered[[]*api.Job]
	events map[store.EventFilter][]*api.Event
	// deny is the deny-list as last read, per certificate serial: its
	// entry, or nil when it was not on the list.
	deny map[string]*api.Revocation
}

// Bounds of what lastRead keeps: a few listings of events (a console or
// a script asks the same few again and again) and every certificate seen.
const (
	lastReadEventFilters = 16
	lastReadSerials      = 100_000
)

type remembered[T any] struct {
	v  T
	ok bool
}

// recall returns v when err is nil and keeps it in l; otherwise l's last
// value, or err when there is none.
func recall[T any](mu *sync.Mutex, l *remembered[T], v T, err error) (T, error) {
	mu.Lock()
	defer mu.Unlock()
	if err == nil {
		*l = remembered[T]{v: v, ok: true}
		return v, nil
	}
	if l.ok {
		return l.v, nil
	}
	return v, err
}

// Nodes is st.Nodes, or its last answer.
func (l *lastRead) Nodes(st store.Store) ([]*api.NodeStatus, error) {
	ns, err := st.Nodes()
	return recall(&l.mu, &l.nodes, ns, err)
}

// Jobs is st.Jobs, or its last answer.
func (l *lastRead) Jobs(st store.Store) ([]*api.Job, error) {
	js, err := st.Jobs()
	return recall(&l.mu, &l.jobs, js, err)
}

// Events is st.Events(f), or its last answer to f.
func (l *lastRead) Events(st store.Store, f store.EventFilter) ([]*api.Event, error) {
	evs, err := st.Events(f)
	l.mu.Lock()
	defer l.mu.Unlock()
	if err == nil {
		if l.events == nil {
			l.events = map[store.EventFilter][]*api.Event{}
		}
		if _, ok := l.events[f]; ok || len(l.events) < lastReadEventFilters {
			l.events[f] = evs
		}
		return evs, nil
	}
	if last, ok := l.events[f]; ok {
		return last, nil
	}
	return nil, err
}

// checkDenyList refuses a certificate on the deny-list, saying when and
// by whom it was revoked. When the deny-list cannot be read, the answer
// last read for the certificate stands (while the store is away nothing
// can be changed, so a stale entry admits no more than reads); one never
// checked before is refused.
func (l *lastRead) checkDenyList(ids store.IdentityStore, p transport.PeerInfo) error {
	serial := transport.Serial(p.Cert)
	r, err := ids.Revocation(serial)
	switch {
	case errors.Is(err, store.ErrNotFound):
		r, err = nil, nil
	case err != nil:
		l.mu.Lock()
		last, ok := l.deny[serial]
		l.mu.Unlock()
		if !ok {
			return fmt.Errorf("the server cannot read its deny-list to check certificate %s (%v), and has not checked it before: try again when the store is back, or ask the cluster admin", serial, err)
		}
		r = last
	}
	if err == nil {
		l.mu.Lock()
		if l.deny == nil {
			l.deny = map[string]*api.Revocation{}
		}
		if _, ok := l.deny[serial]; ok || len(l.deny) < lastReadSerials {
			l.deny[serial] = r
		}
		l.mu.Unlock()
	}
	if r != nil {
		return revokedError(p.Role, p.Name, r)
	}
	return nil
}
