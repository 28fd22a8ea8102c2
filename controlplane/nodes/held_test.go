package nodes

import (
	"context"
	"errors"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/gpuctl/gpuctl/api"
	"github.com/gpuctl/gpuctl/store"
	"github.com/gpuctl/gpuctl/transport"
)

// awayStore is a store that refuses node events while away is set, as
// the etcd store does while etcd is unreachable.
type awayStore struct {
	store.Store
	away    atomic.Bool
	refused atomic.Int64
}

var errAway = errors.New("etcd unreachable")

func (s *awayStore) LastNodeEventSeq(node string) (uint64, error) {
	if s.away.Load() {
		s.refused.Add(1)
		return 0, errAway
	}
	return s.Store.LastNodeEventSeq(node)
}

func (s *awayStore) AppendEvent(e *api.Event) error {
	if s.away.Load() {
		return errAway
	}
	return s.Store.AppendEvent(e)
}

func (s *awayStore) PutNode(n *api.NodeStatus) error {
	if s.away.Load() {
		return errAway
	}
	return s.Store.PutNode(n)
}

func (s *awayStore) AppendNodeEvents(node string, events []*api.Event) (uint64, error) {
	if s.away.Load() {
		return 0, errAway
	}
	return s.Store.AppendNodeEvents(node, events)
}

// TestEventsHeldWhileStoreAway: a node's events that the store refuses
// (etcd away) are held by its session, which stays up, and stored,
// acknowledged and handed to the job owner in order once the store takes
// them, without the node sending them again.
func TestEventsHeldWhileStoreAway(t *testing.T) {
	st := &awayStore{Store: newStore(t)}
	sink := &recSink{}
	r := newRegistry(t, st, &clock{t: time.Unix(1, 0)}, sink)
	l := newLoopback(t, r)
	nc := l.connect(reg("a", 2, 1000))
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	events, err := nc.conn.OpenStream(ctx, transport.StreamEvents)
	if err != nil {
		t.Fatal(err)
	}
	acks := make(chan uint64, 8)
	go func() {
		for {
			var m api.ServerMessage
			if err := events.Recv(&m); err != nil {
				return
			}
			acks <- m.GetEventAck().GetSeq()
		}
	}()

	st.away.Store(true)
	for seq := uint64(1); seq <= 2; seq++ {
		e := &api.Event{Seq: seq, Kind: api.EventKind_EVENT_KIND_PROCESS_EXIT, Message: "rank exited"}
		if err := events.Send(&api.AgentMessage{Body: &api.AgentMessage_Event{Event: e}}); err != nil {
			t.Fatal(err)
		}
	}
	// Both are read and refused, then tried again (paced): nothing
	// acknowledged, nothing told to the job owner.
	waitFor(t, "the held events tried again", func() bool { return st.refused.Load() >= 3 })
	select {
	case seq := <-acks:
		t.Fatalf("event %d acknowledged while the store refuses it", seq)
	default:
	}
	if slices.Contains(sink.lines(), "events a 1") || slices.Contains(sink.lines(), "events a 2") {
		t.Fatalf("the job owner heard events the store refused: %q", sink.lines())
	}

	st.away.Store(false)
	select {
	case seq := <-acks:
		if seq != 2 {
			t.Fatalf("acknowledged up to %d, want 2", seq)
		}
	case <-ctx.Done():
		t.Fatal("the held events were not stored and acknowledged once the store was back")
	}
	if got := sink.lines(); !slices.Contains(got, "events a 2") {
		t.Errorf("the job owner heard %q, want both events in one batch once stored", got)
	}
	last, err := st.LastNodeEventSeq("a")
	if err != nil || last != 2 {
		t.Errorf("stored up to seq %d (%v), want 2", last, err)
	}
	select {
	case <-nc.conn.Context().Done():
		t.Fatal("the session ended while the store was away")
	default:
	}
}

// TestNodeDownHeldWhileStoreAway: a node lost while the store refuses
// writes is declared down all the same (the job owner hears it), and its
// down event, announced at once, is stored once the store takes it.
func TestNodeDownHeldWhileStoreAway(t *testing.T) {
	t0 := time.Unix(1000, 0)
	c := &clock{t: t0}
	st := &awayStore{Store: newStore(t)}
	sink := &recSink{}
	r := newRegistry(t, st, c, sink)
	l := newLoopback(t, r)
	l.connect(reg("a", 2, 1000))
	st.away.Store(true)
	c.set(t0.Add(3 * time.Second))
	if down := r.CheckHeartbeats(); !slices.Equal(down, []string{"a"}) {
		t.Fatalf("down %v, want a", down)
	}
	if !slices.Contains(sink.lines(), "down a: no heartbeat for 3s") {
		t.Fatalf("the job owner heard %q, want a's loss", sink.lines())
	}
	if got := eventsOf(t, st.Store, api.EventKind_EVENT_KIND_NODE_DOWN); len(got) != 0 {
		t.Fatalf("stored while the store refuses writes: %q", got)
	}
	st.away.Store(false)
	r.detect(100 * time.Millisecond)
	if got := eventsOf(t, st.Store, api.EventKind_EVENT_KIND_NODE_DOWN); len(got) != 1 || !strings.Contains(got[0], "a: ") {
		t.Fatalf("down events stored once the store is back: %q, want a's", got)
	}
}
