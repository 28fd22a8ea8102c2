package etcdstore

import (
	"encoding/binary"
	"errors"
	"fmt"
	"slices"

	clientv3 "go.etcd.io/etcd/client/v3"
	"google.golang.org/protobuf/proto"

	"github.com/gpuctl/gpuctl/api"
	"github.com/gpuctl/gpuctl/store"
)

// AppendEvent persists one server-raised event.
func (s *Store) AppendEvent(e *api.Event) error {
	return s.write("append event", func(tx store.Tx) error { return tx.AppendEvent(e) })
}

// AppendNodeEvents persists node's events in order, skipping seqs already
// persisted, and returns the highest seq persisted. The node's seq key is
// written in the transaction of its events, under a compare of the seq
// key's revision, so a batch split by MaxTxnOps still never stores an
// event twice: a resend after a failed chunk finds the seq it reached.
func (s *Store) AppendNodeEvents(node string, events []*api.Event) (uint64, error) {
	var last uint64
	err := s.retry(func() error {
		_, _, rev, err := s.fence()
		if err != nil {
			return err
		}
		var modRev int64
		if last, modRev, err = s.lastSeq(node); err != nil {
			return err
		}
		var puts []put
		var seqs []uint64
		for _, e := range events {
			if e.GetSeq() <= last {
				continue
			}
			v, err := proto.Marshal(e)
			if err != nil {
				return err
			}
			puts = append(puts, put{s.eventKey(e, rev), v})
			last = e.GetSeq()
			seqs = append(seqs, last)
		}
		seqKey := s.k.eventSeq(node)
		if len(puts) == 0 {
			_, err := s.txn(nil, nil)
			return err
		}
		done := 0
		for _, c := range s.chunks(puts, 1) {
			var v [8]byte
			binary.BigEndian.PutUint64(v[:], seqs[done+len(c)-1])
			ops := []clientv3.Op{clientv3.OpPut(seqKey, string(v[:]))}
			for _, p := range c {
				ops = append(ops, clientv3.OpPut(p.key, string(p.val)))
			}
			resp, err := s.txn([]clientv3.Cmp{clientv3.Compare(clientv3.ModRevision(seqKey), "=", modRev)}, ops)
			if err != nil {
				return err
			}
			modRev = resp.Header.Revision
			done += len(c)
			s.noteEvents(len(c))
		}
		return nil
	})
	if err != nil {
		return 0, fmt.Errorf("etcd store: append events of %s: %w", node, err)
	}
	return last, nil
}

// LastNodeEventSeq returns the highest persisted seq of node's events.
func (s *Store) LastNodeEventSeq(node string) (uint64, error) {
	last, _, err := s.lastSeq(node)
	if err != nil {
		return 0, fmt.Errorf("etcd store: last event seq of %s: %w", node, err)
	}
	return last, nil
}

func (s *Store) lastSeq(node string) (uint64, int64, error) {
	if err := s.unreachable(); err != nil {
		return 0, 0, err
	}
	ctx, cancel := s.reqCtx()
	defer cancel()
	resp, err := s.cli.Get(ctx, s.k.eventSeq(node))
	if err != nil {
		return 0, 0, err
	}
	if len(resp.Kvs) == 0 {
		return 0, 0, nil
	}
	kv := resp.Kvs[0]
	if len(kv.Value) != 8 {
		return 0, 0, fmt.Errorf("event seq of %s: %d bytes, want 8", node, len(kv.Value))
	}
	return binary.BigEndian.Uint64(kv.Value), kv.ModRevision, nil
}

// Events returns matching events in time order, oldest first. It reads
// newest first in pages, from SinceUnixNano's key up, so Limit stops the
// read early.
func (s *Store) Events(f store.EventFilter) ([]*api.Event, error) {
	start := s.k.events()
	if f.SinceUnixNano != 0 {
		start = s.k.eventsSince(f.SinceUnixNano)
	}
	end := clientv3.GetPrefixRangeEnd(s.k.events())
	page := pageSize
	if f.Node == "" && f.Job == "" && f.Limit > 0 {
		page = min(page, f.Limit)
	}
	if err := s.unreachable(); err != nil {
		return nil, fmt.Errorf("etcd store: list events: %w", err)
	}
	var out []*api.Event
	var rev int64
	for {
		ctx, cancel := s.reqCtx()
		opts := []clientv3.OpOption{clientv3.WithRange(end), clientv3.WithLimit(int64(page)), clientv3.WithSort(clientv3.SortByKey, clientv3.SortDescend)}
		if rev != 0 {
			opts = append(opts, clientv3.WithRev(rev))
		}
		resp, err := s.cli.Get(ctx, start, opts...)
		cancel()
		if err != nil {
			return nil, fmt.Errorf("etcd store: list events: %w", err)
		}
		rev = resp.Header.Revision
		for _, kv := range resp.Kvs {
			e := &api.Event{}
			if err := proto.Unmarshal(kv.Value, e); err != nil {
				return nil, fmt.Errorf("etcd store: decode event %s: %w", kv.Key, err)
			}
			if f.Node != "" && e.GetNode() != f.Node || f.Job != "" && e.GetJob() != f.Job {
				continue
			}
			out = append(out, e)
			if f.Limit > 0 && len(out) >= f.Limit {
				slices.Reverse(out)
				return out, nil
			}
		}
		if !resp.More || len(resp.Kvs) == 0 {
			break
		}
		end = string(resp.Kvs[len(resp.Kvs)-1].Key)
	}
	slices.Reverse(out)
	return out, nil
}

// noteEvents counts added events and prunes the log when it has grown a
// slack past EventsKept: pruning then costs two requests per kept/64
// events instead of per pass.
func (s *Store) noteEvents(added int) {
	if added == 0 {
		return
	}
	s.mu.Lock()
	if s.eventCount >= 0 {
		s.eventCount += int64(added)
	}
	kept, count := int64(s.opts.EventsKept), s.eventCount
	s.mu.Unlock()
	if kept <= 0 || count >= 0 && count <= kept+kept/64 {
		return
	}
	if err := s.prune(kept); err != nil && !errors.Is(err, store.ErrNotLeader) {
		s.opts.Log.Warn("etcd store: prune the event log", "err", err)
	}
}

// prune deletes the oldest events past kept, in one ranged delete.
func (s *Store) prune(kept int64) error {
	s.pruneMu.Lock()
	defer s.pruneMu.Unlock()
	ctx, cancel := s.reqCtx()
	defer cancel()
	prefix := s.k.events()
	resp, err := s.cli.Get(ctx, prefix, clientv3.WithPrefix(), clientv3.WithCountOnly())
	if err != nil {
		return err
	}
	n := resp.Count
	if n <= kept {
		s.setEventCount(n, 0)
		return nil
	}
	old, err := s.cli.Get(ctx, prefix, clientv3.WithRange(clientv3.GetPrefixRangeEnd(prefix)),
		clientv3.WithSort(clientv3.SortByKey, clientv3.SortAscend), clientv3.WithLimit(n-kept), clientv3.WithKeysOnly(), clientv3.WithRev(resp.Header.Revision))
	if err != nil {
		return err
	}
	if len(old.Kvs) == 0 {
		return nil
	}
	lastKey := string(old.Kvs[len(old.Kvs)-1].Key)
	if _, err := s.txn(nil, []clientv3.Op{clientv3.OpDelete(prefix, clientv3.WithRange(lastKey+"\x00"))}); err != nil {
		return err
	}
	s.setEventCount(n, int64(len(old.Kvs)))
	s.opts.Log.Debug("etcd store: pruned the event log", "deleted", len(old.Kvs), "kept", n-int64(len(old.Kvs)))
	return nil
}

func (s *Store) setEventCount(n, deleted int64) {
	s.mu.Lock()
	s.eventCount = n - deleted
	s.mu.Unlock()
}
