package controlplane

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"
)

// ReadOnly says whether the control plane may change anything now. A
// highly available server cannot while its store is unreachable (etcd
// down or without quorum) or while it has lost its election key and
// campaigns again: every change is then refused at once with the reason,
// reads are answered from memory, and node sessions go on (heartbeats,
// telemetry, lease renewals), so nothing that runs is stopped for it.
// The zero value, and nil, is never read-only (a server on its own bbolt
// file).
type ReadOnly struct {
	// What names the store in the reason, e.g. "etcd at http://10.0.0.1:2379".
	What string
	Now  func() time.Time
	Log  *slog.Logger

	mu     sync.Mutex
	causes map[string]cause // by kind: storeAway, or what Hold named
	told   map[int]func(error)
	nextID int
}

type cause struct {
	since time.Time
	why   string
}

// storeAway is the cause kind of an unreachable store.
const storeAway = "store"

// ErrReadOnly is what every change refused while read-only wraps.
var ErrReadOnly = errors.New("the control plane is read-only")

// ReadOnlyError is why a change was refused: the cause and since when.
type ReadOnlyError struct {
	Since  time.Time
	Reason string
}

func (e *ReadOnlyError) Error() string { return e.Reason }

// Unwrap makes errors.Is(err, ErrReadOnly) hold.
func (e *ReadOnlyError) Unwrap() error { return ErrReadOnly }

// Err is nil when changes may be made, else why not (a *ReadOnlyError):
// the store away when it is (the other causes follow from it), else the
// oldest cause.
func (r *ReadOnly) Err() error {
	if r == nil {
		return nil
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.errLocked()
}

func (r *ReadOnly) errLocked() error {
	if c, ok := r.causes[storeAway]; ok {
		return &ReadOnlyError{Since: c.since, Reason: c.why}
	}
	var first *cause
	for _, c := range r.causes {
		if first == nil || c.since.Before(first.since) {
			c := c
			first = &c
		}
	}
	if first == nil {
		return nil
	}
	return &ReadOnlyError{Since: first.since, Reason: first.why}
}

// Hold makes the control plane read-only for kind until Release(kind),
// saying why; a second Hold of one kind keeps the first's time.
func (r *ReadOnly) Hold(kind, why string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if _, ok := r.causes[kind]; ok {
		return
	}
	if r.causes == nil {
		r.causes = map[string]cause{}
	}
	now := r.now()
	r.causes[kind] = cause{since: now, why: why}
	r.log().Warn("the control plane is read-only", "cause", kind, "reason", why)
	r.tellLocked()
}

// Release ends kind's hold.
func (r *ReadOnly) Release(kind string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	c, ok := r.causes[kind]
	if !ok {
		return
	}
	delete(r.causes, kind)
	r.log().Info("read-only cause ended", "cause", kind, "lasted", r.now().Sub(c.since).Round(time.Millisecond).String())
	r.tellLocked()
}

// Notify has f told Err after every change, until the returned func is
// called. f runs under the tracker's lock: it must only hand the news on.
func (r *ReadOnly) Notify(f func(error)) (stop func()) {
	if r == nil {
		return func() {}
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.told == nil {
		r.told = map[int]func(error){}
	}
	id := r.nextID
	r.nextID++
	r.told[id] = f
	return func() {
		r.mu.Lock()
		delete(r.told, id)
		r.mu.Unlock()
	}
}

func (r *ReadOnly) tellLocked() {
	err := r.errLocked()
	for _, f := range r.told {
		f(err)
	}
}

func (r *ReadOnly) now() time.Time {
	if r.Now == nil {
		return time.Now()
	}
	return r.Now()
}

func (r *ReadOnly) log() *slog.Logger {
	if r.Log == nil {
		return slog.New(slog.DiscardHandler)
	}
	return r.Log
}

// ReadOnlyProbeEvery is how often Watch asks the store whether it answers,
// and ReadOnlyProbeTimeout how long it waits for the answer: together they
// bound how long a change may wait on a store that went away before it is
// refused instead.
const (
	ReadOnlyProbeEvery   = 500 * time.Millisecond
	ReadOnlyProbeTimeout = time.Second
)

// Watch probes the store until ctx ends: the first failed probe makes the
// control plane read-only, saying since when, and the first answer ends
// it. probe must read with quorum (a lone etcd member would answer a
// serializable read while it cannot commit).
func (r *ReadOnly) Watch(ctx context.Context, probe func(context.Context) error) {
	t := time.NewTicker(ReadOnlyProbeEvery)
	defer t.Stop()
	for {
		pctx, cancel := context.WithTimeout(ctx, ReadOnlyProbeTimeout)
		err := probe(pctx)
		cancel()
		switch {
		case ctx.Err() != nil:
			return
		case err != nil:
			r.Hold(storeAway, fmt.Sprintf("the store (%s) is unreachable since %s: the control plane is read-only; retry when it returns (%v)",
				r.What, r.now().UTC().Format(time.RFC3339), err))
		default:
			r.Release(storeAway)
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

// StoreAway is the error of a store that Watch found unreachable, nil
// while it answers: reads then come from memory instead.
func (r *ReadOnly) StoreAway() error {
	if r == nil {
		return nil
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if c, ok := r.causes[storeAway]; ok {
		return &ReadOnlyError{Since: c.since, Reason: c.why}
	}
	return nil
}
