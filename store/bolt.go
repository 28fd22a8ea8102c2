package store

import (
	"encoding/binary"
	"fmt"
	"os"
	"path/filepath"
	"time"

	bolt "go.etcd.io/bbolt"
	"google.golang.org/protobuf/proto"

	"github.com/gpuctl/gpuctl/api"
)

var (
	bucketNodes     = []byte("nodes")
	bucketEvents    = []byte("events")
	bucketEventSeqs = []byte("event_seqs")
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
		for _, b := range [][]byte{bucketNodes, bucketEvents, bucketEventSeqs} {
			if _, err := tx.CreateBucketIfNotExists(b); err != nil {
				return err
			}
		}
		return nil
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
	name := n.GetRegistration().GetName()
	if name == "" {
		return fmt.Errorf("put node: record has no name")
	}
	b, err := proto.Marshal(n)
	if err != nil {
		return fmt.Errorf("put node %s: %w", name, err)
	}
	if err := s.db.Update(func(tx *bolt.Tx) error {
		return tx.Bucket(bucketNodes).Put([]byte(name), b)
	}); err != nil {
		return fmt.Errorf("put node %s: %w", name, err)
	}
	return nil
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
		evb := tx.Bucket(bucketEvents)
		for _, e := range events {
			if e.GetSeq() <= last {
				continue
			}
			if err := putEvent(evb, e); err != nil {
				return err
			}
			last = e.GetSeq()
		}
		var v [8]byte
		binary.BigEndian.PutUint64(v[:], last)
		if err := seqs.Put([]byte(node), v[:]); err != nil {
			return err
		}
		return s.prune(evb)
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
	err := s.db.Update(func(tx *bolt.Tx) error {
		evb := tx.Bucket(bucketEvents)
		if err := putEvent(evb, e); err != nil {
			return err
		}
		return s.prune(evb)
	})
	if err != nil {
		return fmt.Errorf("append event: %w", err)
	}
	return nil
}

func putEvent(b *bolt.Bucket, e *api.Event) error {
	id, err := b.NextSequence()
	if err != nil {
		return err
	}
	v, err := proto.Marshal(e)
	if err != nil {
		return err
	}
	var k [8]byte
	binary.BigEndian.PutUint64(k[:], id)
	return b.Put(k[:], v)
}

// prune drops the oldest events beyond maxEvents. Keys are the bucket's
// own sequence, so the count is the last id minus the first.
func (s *Bolt) prune(b *bolt.Bucket) error {
	if s.maxEvents <= 0 {
		return nil
	}
	c := b.Cursor()
	first, _ := c.First()
	lastKey, _ := c.Last()
	if first == nil {
		return nil
	}
	excess := int64(binary.BigEndian.Uint64(lastKey)) - int64(binary.BigEndian.Uint64(first)) + 1 - int64(s.maxEvents)
	for k, _ := c.First(); k != nil && excess > 0; k, _ = c.First() {
		if err := c.Delete(); err != nil {
			return err
		}
		excess--
	}
	return nil
}

// Events returns matching events, oldest first.
func (s *Bolt) Events(f EventFilter) ([]*api.Event, error) {
	var out []*api.Event
	err := s.db.View(func(tx *bolt.Tx) error {
		c := tx.Bucket(bucketEvents).Cursor()
		// Walk newest first so Limit stops early, then reverse.
		for k, v := c.Last(); k != nil; k, v = c.Prev() {
			e := &api.Event{}
			if err := proto.Unmarshal(v, e); err != nil {
				return fmt.Errorf("decode event %x: %w", k, err)
			}
			if f.SinceUnixNano != 0 && e.GetTimeUnixNano() < f.SinceUnixNano {
				continue
			}
			if f.Node != "" && e.GetNode() != f.Node {
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
	for i, j := 0, len(out)-1; i < j; i, j = i+1, j-1 {
		out[i], out[j] = out[j], out[i]
	}
	return out, nil
}

var _ Store = (*Bolt)(nil)
