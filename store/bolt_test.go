package store

import (
	"errors"
	"path/filepath"
	"testing"

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
