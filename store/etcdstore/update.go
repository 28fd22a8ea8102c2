package etcdstore

import (
	"errors"
	"fmt"

	clientv3 "go.etcd.io/etcd/client/v3"
	"google.golang.org/protobuf/proto"

	"github.com/gpuctl/gpuctl/api"
	"github.com/gpuctl/gpuctl/store"
)

// batch collects the writes of one Update. A key written twice keeps its
// last value in its first place: etcd refuses a transaction that puts one
// key twice.
type batch struct {
	s        *Store
	fenceRev int64
	ops      []put
	at       map[string]int
	events   int
	// keyOf is the key each event of the batch got, kept when the batch
	// fails so that its retry puts the same events under the same keys.
	keyOf map[*api.Event]string
}

type put struct {
	key string
	val []byte
}

func (b *batch) add(key string, m proto.Message) error {
	v, err := proto.Marshal(m)
	if err != nil {
		return err
	}
	if len(key)+len(v) > b.s.opts.MaxTxnBytes {
		return fmt.Errorf("record of %d bytes exceeds the %d bytes one etcd request may carry (etcd's --max-request-bytes)", len(v), b.s.opts.MaxTxnBytes)
	}
	if i, ok := b.at[key]; ok {
		b.ops[i].val = v
		return nil
	}
	b.at[key] = len(b.ops)
	b.ops = append(b.ops, put{key, v})
	return nil
}

func (b *batch) PutNode(n *api.NodeStatus) error {
	name := n.GetRegistration().GetName()
	if name == "" {
		return fmt.Errorf("etcd store: put node: record has no name")
	}
	if err := b.add(b.s.k.node(name), n); err != nil {
		return fmt.Errorf("etcd store: put node %s: %w", name, err)
	}
	return nil
}

func (b *batch) PutJob(j *api.Job) error {
	if j.GetId() == "" {
		return fmt.Errorf("etcd store: put job: record has no id")
	}
	if err := b.add(b.s.k.job(j.GetId()), j); err != nil {
		return fmt.Errorf("etcd store: put job %s: %w", j.GetId(), err)
	}
	return nil
}

func (b *batch) AppendEvent(e *api.Event) error {
	key, ok := b.s.retryKey(e)
	if !ok {
		key = b.s.eventKey(e, b.fenceRev)
	}
	b.keyOf[e] = key
	if err := b.add(key, e); err != nil {
		return fmt.Errorf("etcd store: append event: %w", err)
	}
	b.events++
	return nil
}

// retryKey is the key e got in the last batch, when that batch failed: a
// batch split in several transactions may have stored part of its events,
// and the job owner retries a failed step with the same events, which then
// land on the keys they have, not twice.
func (s *Store) retryKey(e *api.Event) (string, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	k, ok := s.retryKeys[e]
	return k, ok
}

func (s *Store) eventKey(e *api.Event, fenceRev int64) string {
	s.mu.Lock()
	s.eventN++
	n := s.eventN
	s.mu.Unlock()
	return s.k.event(e.GetTimeUnixNano(), fenceRev, n)
}

// Update runs fn and commits its writes under the fence in one etcd
// transaction. A batch of more than MaxTxnOps writes (or MaxTxnBytes) is
// committed as several fenced transactions in the order fn wrote, and is
// then NOT atomic: when one of them fails, the ones before it stay
// committed and the error says how many. Records are puts, so a retry of
// the same writes converges (events reuse their keys, see retryKey); a
// reader may meet the half-written batch meanwhile. Raise etcd's
// --max-txn-ops (and MaxTxnOps with it) where scheduling passes write more
// than 128 records.
func (s *Store) Update(fn func(store.Tx) error) error {
	n, err := s.update(fn)
	var fe fnError
	switch {
	case err == nil:
		return nil
	case errors.As(err, &fe):
		return fe.err // as fn returned it
	}
	return fmt.Errorf("etcd store: update (%d writes): %w", n, err)
}

// fnError carries an error of update's fn, returned as it came.
type fnError struct{ err error }

func (e fnError) Error() string { return e.err.Error() }

// update runs fn and commits its writes; fn's error comes wrapped in
// errFn, a commit's error bare.
func (s *Store) update(fn func(store.Tx) error) (int, error) {
	_, _, rev, err := s.fence()
	if err != nil {
		return 0, err
	}
	b := &batch{s: s, fenceRev: rev, at: map[string]int{}, keyOf: map[*api.Event]string{}}
	if err := fn(b); err != nil {
		return 0, fnError{err}
	}
	err = s.commitPuts(b.ops)
	s.mu.Lock()
	s.retryKeys = nil
	if err != nil {
		s.retryKeys = b.keyOf
	}
	s.mu.Unlock()
	if err != nil {
		return len(b.ops), err
	}
	s.noteEvents(b.events)
	return len(b.ops), nil
}

// write is Update of one record, its errors saying what.
func (s *Store) write(what string, fn func(store.Tx) error) error {
	_, err := s.update(fn)
	var fe fnError
	switch {
	case err == nil:
		return nil
	case errors.As(err, &fe):
		return fe.err
	}
	return fmt.Errorf("etcd store: %s: %w", what, err)
}

// commitPuts commits puts in chunks etcd accepts, in order.
func (s *Store) commitPuts(puts []put) error {
	chunks := s.chunks(puts, 0)
	if len(chunks) == 0 {
		_, err := s.txn(nil, nil) // nothing to write, but a deposed leader learns it
		return err
	}
	for i, c := range chunks {
		ops := make([]clientv3.Op, len(c))
		for j, p := range c {
			ops[j] = clientv3.OpPut(p.key, string(p.val))
		}
		if _, err := s.txn(nil, ops); err != nil {
			if i > 0 {
				return fmt.Errorf("committed %d of %d transactions of this batch (more than --max-txn-ops %d writes), then: %w", i, len(chunks), s.opts.MaxTxnOps, err)
			}
			return err
		}
	}
	return nil
}

// chunks splits puts into runs of at most MaxTxnOps-reserve writes and
// MaxTxnBytes bytes.
func (s *Store) chunks(puts []put, reserve int) [][]put {
	var out [][]put
	start, size := 0, 0
	for i, p := range puts {
		n := len(p.key) + len(p.val)
		if i > start && (i-start >= s.opts.MaxTxnOps-reserve || size+n > s.opts.MaxTxnBytes) {
			out = append(out, puts[start:i])
			start, size = i, 0
		}
		size += n
	}
	if start < len(puts) {
		out = append(out, puts[start:])
	}
	return out
}
