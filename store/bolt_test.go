package store

import (
	"encoding/binary"
	"errors"
	"fmt"
	"path/filepath"
	"slices"
	"testing"

	bolt "go.etcd.io/bbolt"
	"google.golang.org/protobuf/proto"

	"github.com/gpuctl/gpuctl/api"
)

func openTest(t *testing.T) (*Bolt, string) {
	t.Helper()
	path := filepath.Join(t.TempDir(), "state.db")
	s, err := OpenBolt(path)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	return s, path
}

func node(name string, state api.NodeState) *api.NodeStatus {
	return &api.NodeStatus{Registration: &api.NodeRegistration{Name: name}, State: state}
}

func TestNodesSurviveReopen(t *testing.T) {
	s, path := openTest(t)
	for _, n := range []*api.NodeStatus{node("b", api.NodeState_NODE_STATE_READY), node("a", api.NodeState_NODE_STATE_CORDONED)} {
		if err := s.PutNode(n); err != nil {
			t.Fatal(err)
		}
	}
	s.Close()
	s2, err := OpenBolt(path)
	if err != nil {
		t.Fatal(err)
	}
	defer s2.Close()
	nodes, err := s2.Nodes()
	if err != nil {
		t.Fatal(err)
	}
	if len(nodes) != 2 || nodes[0].GetRegistration().GetName() != "a" || nodes[0].GetState() != api.NodeState_NODE_STATE_CORDONED {
		t.Fatalf("nodes after reopen = %v", nodes)
	}
	if _, err := s2.Node("zz"); !errors.Is(err, ErrNotFound) {
		t.Fatalf("Node(zz) err = %v, want ErrNotFound", err)
	}
	if err := s2.PutNode(&api.NodeStatus{}); err == nil {
		t.Fatal("PutNode without a name succeeded")
	}
}

func TestSecondOpenIsRefusedClearly(t *testing.T) {
	_, path := openTest(t)
	if _, err := OpenBolt(path); err == nil {
		t.Fatal("second open of a locked store succeeded")
	}
}

func TestAppendNodeEventsDeduplicatesResends(t *testing.T) {
	s, _ := openTest(t)
	ev := func(seq uint64) *api.Event { return &api.Event{Seq: seq, Node: "n1", TimeUnixNano: int64(seq)} }
	tests := []struct {
		name    string
		batch   []*api.Event
		wantTop uint64
		wantLen int
	}{
		{"first batch", []*api.Event{ev(1), ev(2), ev(3)}, 3, 3},
		{"resend overlapping", []*api.Event{ev(2), ev(3), ev(4)}, 4, 4},
		{"pure resend", []*api.Event{ev(1), ev(4)}, 4, 4},
		{"empty", nil, 4, 4},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			top, err := s.AppendNodeEvents("n1", tc.batch)
			if err != nil {
				t.Fatal(err)
			}
			if top != tc.wantTop {
				t.Errorf("top = %d, want %d", top, tc.wantTop)
			}
			if last, err := s.LastNodeEventSeq("n1"); err != nil || last != tc.wantTop {
				t.Errorf("LastNodeEventSeq = %d, %v; want %d", last, err, tc.wantTop)
			}
			got, err := s.Events(EventFilter{})
			if err != nil {
				t.Fatal(err)
			}
			if len(got) != tc.wantLen {
				t.Errorf("len = %d, want %d", len(got), tc.wantLen)
			}
		})
	}
}

func TestEventsFilterLimitAndPrune(t *testing.T) {
	s, _ := openTest(t)
	s.SetMaxEvents(5)
	for i := 1; i <= 8; i++ {
		n := "a"
		if i%2 == 0 {
			n = "b"
		}
		if err := s.AppendEvent(&api.Event{Node: n, TimeUnixNano: int64(i)}); err != nil {
			t.Fatal(err)
		}
	}
	all, _ := s.Events(EventFilter{})
	if len(all) != 5 || all[0].GetTimeUnixNano() != 4 || all[4].GetTimeUnixNano() != 8 {
		t.Fatalf("after prune: %v", all)
	}
	tests := []struct {
		name string
		f    EventFilter
		want []int64
	}{
		{"node b", EventFilter{Node: "b"}, []int64{4, 6, 8}},
		{"since 6", EventFilter{SinceUnixNano: 6}, []int64{6, 7, 8}},
		{"newest 2", EventFilter{Limit: 2}, []int64{7, 8}},
		{"node a newest 1", EventFilter{Node: "a", Limit: 1}, []int64{7}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got, err := s.Events(tc.f)
			if err != nil {
				t.Fatal(err)
			}
			var times []int64
			for _, e := range got {
				times = append(times, e.GetTimeUnixNano())
			}
			if len(times) != len(tc.want) {
				t.Fatalf("got %v, want %v", times, tc.want)
			}
			for i := range times {
				if times[i] != tc.want[i] {
					t.Fatalf("got %v, want %v", times, tc.want)
				}
			}
		})
	}
}

func TestEventsInTimeOrderAcrossNodes(t *testing.T) {
	s, _ := openTest(t)
	// node-b delivers late (a resend after a reconnect): its events are
	// older than node-a's but arrive after them.
	if _, err := s.AppendNodeEvents("node-a", []*api.Event{{Seq: 1, Node: "node-a", TimeUnixNano: 30}, {Seq: 2, Node: "node-a", TimeUnixNano: 50}}); err != nil {
		t.Fatal(err)
	}
	if _, err := s.AppendNodeEvents("node-b", []*api.Event{{Seq: 1, Node: "node-b", TimeUnixNano: 10}, {Seq: 2, Node: "node-b", TimeUnixNano: 40}}); err != nil {
		t.Fatal(err)
	}
	if err := s.AppendEvent(&api.Event{Job: "j-1", TimeUnixNano: 20}); err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name string
		f    EventFilter
		want []int64
	}{
		{"all", EventFilter{}, []int64{10, 20, 30, 40, 50}},
		{"newest two", EventFilter{Limit: 2}, []int64{40, 50}},
		{"since", EventFilter{SinceUnixNano: 25}, []int64{30, 40, 50}},
		{"one node", EventFilter{Node: "node-b"}, []int64{10, 40}},
		{"one job", EventFilter{Job: "j-1"}, []int64{20}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			evs, err := s.Events(tc.f)
			if err != nil {
				t.Fatal(err)
			}
			var got []int64
			for _, e := range evs {
				got = append(got, e.GetTimeUnixNano())
			}
			if !slices.Equal(got, tc.want) {
				t.Fatalf("times %v, want %v", got, tc.want)
			}
		})
	}
}

func TestUpdateCommitsAllOrNothing(t *testing.T) {
	s, _ := openTest(t)
	boom := errors.New("boom")
	err := s.Update(func(tx Tx) error {
		if err := tx.PutJob(&api.Job{Id: "j-1"}); err != nil {
			return err
		}
		if err := tx.AppendEvent(&api.Event{Job: "j-1", TimeUnixNano: 1}); err != nil {
			return err
		}
		return boom
	})
	if !errors.Is(err, boom) {
		t.Fatalf("Update err = %v, want boom", err)
	}
	if _, err := s.Job("j-1"); !errors.Is(err, ErrNotFound) {
		t.Fatalf("a failed transaction's job was kept: %v", err)
	}
	if evs, _ := s.Events(EventFilter{}); len(evs) != 0 {
		t.Fatalf("a failed transaction's event was kept: %v", evs)
	}
	if err := s.Update(func(tx Tx) error {
		if err := tx.PutJob(&api.Job{Id: "j-2"}); err != nil {
			return err
		}
		return tx.PutNode(node("n1", api.NodeState_NODE_STATE_READY))
	}); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Job("j-2"); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Node("n1"); err != nil {
		t.Fatal(err)
	}
}

// TestOldEventLogIsRekeyed opens a store whose event log predates time
// order (8-byte arrival keys) and finds its events in time order.
func TestOldEventLogIsRekeyed(t *testing.T) {
	path := filepath.Join(t.TempDir(), "state.db")
	db, err := bolt.Open(path, 0o600, nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := db.Update(func(tx *bolt.Tx) error {
		b, err := tx.CreateBucket(bucketEvents)
		if err != nil {
			return err
		}
		for i, ts := range []int64{30, 10, 20} {
			v, _ := proto.Marshal(&api.Event{TimeUnixNano: ts, Message: fmt.Sprint(i)})
			var k [8]byte
			binary.BigEndian.PutUint64(k[:], uint64(i+1))
			if err := b.Put(k[:], v); err != nil {
				return err
			}
		}
		return b.SetSequence(3)
	}); err != nil {
		t.Fatal(err)
	}
	db.Close()
	s, err := OpenBolt(path)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	s.SetMaxEvents(3)
	if err := s.AppendEvent(&api.Event{TimeUnixNano: 40}); err != nil {
		t.Fatal(err)
	}
	evs, err := s.Events(EventFilter{})
	if err != nil {
		t.Fatal(err)
	}
	var got []int64
	for _, e := range evs {
		got = append(got, e.GetTimeUnixNano())
	}
	if want := []int64{20, 30, 40}; !slices.Equal(got, want) {
		t.Fatalf("times after migration and prune %v, want %v", got, want)
	}
}
