package store

import (
	"encoding/binary"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"time"

	bolt "go.etcd.io/bbolt"
	"google.golang.org/protobuf/proto"

	"github.com/gpuctl/gpuctl/api"
)

var (
	bucketNodes     = []byte("nodes")
	bucketEvents    = []byte("events")
	bucketEventSeqs = []byte("event_seqs")
	bucketMeta      = []byte("meta")
)

// DefaultMaxEvents bounds the event log; the oldest events are pruned past it.
const DefaultMaxEvents = 200_000

// Bolt is the bbolt-backed Store.
type Bolt struct {
	db        *bolt.DB
	maxEvents int
}

// OpenBolt opens (creating if needed) the store file at path. A file that
// is empty, truncated or damaged is refused with a *CorruptError naming it
// and its last backup; it is never replaced by an empty store.
func OpenBolt(path string) (*Bolt, error) {
	if err := os.MkdirAll(filepath.Dir(path), 0o700); err != nil {
		return nil, fmt.Errorf("open store: create %s: %w", filepath.Dir(path), err)
	}
	db, err := openChecked(path, &bolt.Options{Timeout: 2 * time.Second})
	if err != nil {
		if err == bolt.ErrTimeout {
			return nil, fmt.Errorf("open store %s: locked by another process (is another gpuctl serve using this --data-dir?)", path)
		}
		return nil, fmt.Errorf("open store %s: %w", path, err)
	}
	err = db.Update(func(tx *bolt.Tx) error {
		for _, b := range [][]byte{bucketNodes, bucketEvents, bucketEventSeqs, bucketMeta} {
			if _, err := tx.CreateBucketIfNotExists(b); err != nil {
				return err
			}
		}
		return migrateEvents(tx)
	})
	if err != nil {
		db.Close()
		return nil, fmt.Errorf("open store %s: create buckets: %w", path, err)
	}
	return &Bolt{db: db, maxEvents: DefaultMaxEvents}, nil
}

// SetMaxEvents changes the bound of the event log.
func (s *Bolt) SetMaxEvents(n int) { s.maxEvents = n }

// Close closes the file.
func (s *Bolt) Close() error { return s.db.Close() }

// PutNode stores n under its registration name.
func (s *Bolt) PutNode(n *api.NodeStatus) error {
	return s.Update(func(tx Tx) error { return tx.PutNode(n) })
}

// Node returns the node called name.
func (s *Bolt) Node(name string) (*api.NodeStatus, error) {
	var n *api.NodeStatus
	err := s.db.View(func(tx *bolt.Tx) error {
		v := tx.Bucket(bucketNodes).Get([]byte(name))
		if v == nil {
			return fmt.Errorf("node %s: %w", name, ErrNotFound)
		}
		n = &api.NodeStatus{}
		return proto.Unmarshal(v, n)
	})
	return n, err
}

// Nodes returns every node sorted by name (bbolt keeps keys sorted).
func (s *Bolt) Nodes() ([]*api.NodeStatus, error) {
	var out []*api.NodeStatus
	err := s.db.View(func(tx *bolt.Tx) error {
		return tx.Bucket(bucketNodes).ForEach(func(k, v []byte) error {
			n := &api.NodeStatus{}
			if err := proto.Unmarshal(v, n); err != nil {
				return fmt.Errorf("decode node %s: %w", k, err)
			}
			out = append(out, n)
			return nil
		})
	})
	if err != nil {
		return nil, fmt.Errorf("list nodes: %w", err)
	}
	return out, nil
}

// AppendNodeEvents persists events from one node, deduplicating by seq.
func (s *Bolt) AppendNodeEvents(node string, events []*api.Event) (uint64, error) {
	var last uint64
	err := s.db.Update(func(tx *bolt.Tx) error {
		seqs := tx.Bucket(bucketEventSeqs)
		if v := seqs.Get([]byte(node)); len(v) == 8 {
			last = binary.BigEndian.Uint64(v)
		}
		w := &boltTx{s: s, tx: tx}
		for _, e := range events {
			if e.GetSeq() <= last {
				continue
			}
			if err := w.AppendEvent(e); err != nil {
				return err
			}
			last = e.GetSeq()
		}
		var v [8]byte
		binary.BigEndian.PutUint64(v[:], last)
		return seqs.Put([]byte(node), v[:])
	})
	if err != nil {
		return 0, fmt.Errorf("append events of %s: %w", node, err)
	}
	return last, nil
}

// LastNodeEventSeq returns the highest persisted seq of node's events.
func (s *Bolt) LastNodeEventSeq(node string) (uint64, error) {
	var last uint64
	err := s.db.View(func(tx *bolt.Tx) error {
		if v := tx.Bucket(bucketEventSeqs).Get([]byte(node)); len(v) == 8 {
			last = binary.BigEndian.Uint64(v)
		}
		return nil
	})
	if err != nil {
		return 0, fmt.Errorf("last event seq of %s: %w", node, err)
	}
	return last, nil
}

// AppendEvent persists one server-raised event.
func (s *Bolt) AppendEvent(e *api.Event) error {
	if err := s.Update(func(tx Tx) error { return tx.AppendEvent(e) }); err != nil {
		return fmt.Errorf("append event: %w", err)
	}
	return nil
}

// Update runs fn in one bbolt transaction.
func (s *Bolt) Update(fn func(Tx) error) error {
	return s.db.Update(func(tx *bolt.Tx) error { return fn(&boltTx{s: s, tx: tx}) })
}

// boltTx is the Tx of one bbolt read-write transaction.
type boltTx struct {
	s  *Bolt
	tx *bolt.Tx
}

func (w *boltTx) PutNode(n *api.NodeStatus) error {
	name := n.GetRegistration().GetName()
	if name == "" {
		return fmt.Errorf("put node: record has no name")
	}
	b, err := proto.Marshal(n)
	if err != nil {
		return fmt.Errorf("put node %s: %w", name, err)
	}
	if err := w.tx.Bucket(bucketNodes).Put([]byte(name), b); err != nil {
		return fmt.Errorf("put node %s: %w", name, err)
	}
	return nil
}

func (w *boltTx) PutJob(j *api.Job) error {
	id := j.GetId()
	if id == "" {
		return fmt.Errorf("put job: record has no id")
	}
	b, err := proto.Marshal(j)
	if err != nil {
		return fmt.Errorf("put job %s: %w", id, err)
	}
	// Created here rather than at open so a store written before jobs
	// existed opens unchanged.
	bk, err := w.tx.CreateBucketIfNotExists(bucketJobs)
	if err != nil {
		return fmt.Errorf("put job %s: %w", id, err)
	}
	if err := bk.Put([]byte(id), b); err != nil {
		return fmt.Errorf("put job %s: %w", id, err)
	}
	return nil
}

// AppendEvent stores e under its time, then a sequence number that keeps
// events of the same nanosecond in arrival order, and prunes the oldest
// past the bound.
func (w *boltTx) AppendEvent(e *api.Event) error {
	b := w.tx.Bucket(bucketEvents)
	id, err := b.NextSequence()
	if err != nil {
		return err
	}
	v, err := proto.Marshal(e)
	if err != nil {
		return err
	}
	if err := b.Put(eventKey(e.GetTimeUnixNano(), id), v); err != nil {
		return err
	}
	return w.s.prune(w.tx, b, 1)
}

// eventKey orders the event log by time: the event's time (negative times
// as 0), then the bucket's sequence.
func eventKey(unixNano int64, id uint64) []byte {
	var k [16]byte
	binary.BigEndian.PutUint64(k[:8], uint64(max(unixNano, 0)))
	binary.BigEndian.PutUint64(k[8:], id)
	return k[:]
}

var keyEventCount = []byte("event_count")

// prune counts added new events and drops the oldest past maxEvents.
func (s *Bolt) prune(tx *bolt.Tx, b *bolt.Bucket, added int64) error {
	meta := tx.Bucket(bucketMeta)
	var n int64
	if v := meta.Get(keyEventCount); len(v) == 8 {
		n = int64(binary.BigEndian.Uint64(v))
	}
	n += added
	if s.maxEvents > 0 && n > int64(s.maxEvents) {
		c := b.Cursor()
		for k, _ := c.First(); k != nil && n > int64(s.maxEvents); k, _ = c.First() {
			if err := c.Delete(); err != nil {
				return err
			}
			n--
		}
	}
	var v [8]byte
	binary.BigEndian.PutUint64(v[:], uint64(n))
	return meta.Put(keyEventCount, v[:])
}

// migrateEvents rekeys an event log written before it was kept in time
// order (8-byte arrival keys) and counts it.
func migrateEvents(tx *bolt.Tx) error {
	meta := tx.Bucket(bucketMeta)
	if meta.Get(keyEventCount) != nil {
		return nil
	}
	old := tx.Bucket(bucketEvents)
	type kv struct{ k, v []byte }
	var all []kv
	if err := old.ForEach(func(k, v []byte) error {
		e := &api.Event{}
		if err := proto.Unmarshal(v, e); err != nil {
			return fmt.Errorf("decode event %x: %w", k, err)
		}
		id := uint64(len(all) + 1)
		if len(k) == 8 {
			id = binary.BigEndian.Uint64(k)
		}
		all = append(all, kv{eventKey(e.GetTimeUnixNano(), id), slices.Clone(v)})
		return nil
	}); err != nil {
		return err
	}
	seq := old.Sequence()
	if err := tx.DeleteBucket(bucketEvents); err != nil {
		return err
	}
	b, err := tx.CreateBucket(bucketEvents)
	if err != nil {
		return err
	}
	for _, e := range all {
		if err := b.Put(e.k, e.v); err != nil {
			return err
		}
	}
	if err := b.SetSequence(seq); err != nil {
		return err
	}
	var v [8]byte
	binary.BigEndian.PutUint64(v[:], uint64(len(all)))
	return meta.Put(keyEventCount, v[:])
}

// Events returns matching events in time order, oldest first.
func (s *Bolt) Events(f EventFilter) ([]*api.Event, error) {
	var out []*api.Event
	err := s.db.View(func(tx *bolt.Tx) error {
		c := tx.Bucket(bucketEvents).Cursor()
		// Walk newest first so Limit stops early, then reverse.
		for k, v := c.Last(); k != nil; k, v = c.Prev() {
			if f.SinceUnixNano != 0 && int64(binary.BigEndian.Uint64(k[:8])) < f.SinceUnixNano {
				break
			}
			e := &api.Event{}
			if err := proto.Unmarshal(v, e); err != nil {
				return fmt.Errorf("decode event %x: %w", k, err)
			}
			if f.Node != "" && e.GetNode() != f.Node || f.Job != "" && e.GetJob() != f.Job {
				continue
			}
			out = append(out, e)
			if f.Limit > 0 && len(out) >= f.Limit {
				break
			}
		}
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("list events: %w", err)
	}
	slices.Reverse(out)
	return out, nil
}

var _ Store = (*Bolt)(nil)
