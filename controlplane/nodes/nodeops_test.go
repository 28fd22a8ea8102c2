package nodes

import (
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/gpuctl/gpuctl/api"
	"github.com/gpuctl/gpuctl/store"
)

func eventsOf(t *testing.T, st store.Store, kind api.EventKind) []string {
	t.Helper()
	evs, err := st.Events(store.EventFilter{})
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, e := range evs {
		if e.GetKind() == kind {
			out = append(out, e.GetNode()+": "+e.GetMessage())
		}
	}
	return out
}

// TestCordonActions walks cordon, drain and uncordon over a connected node
// and a lost one: each change is persisted and raises one event; repeats
// change nothing; a lost node uncordoned stays down. Liveness and cordon
// are apart: a cordon never changes whether a node is ready or down.
func TestCordonActions(t *testing.T) {
	st := newStore(t)
	// "lost" is known from before the server started and never came back.
	if err := st.PutNode(&api.NodeStatus{Registration: &api.NodeRegistration{Name: "lost"}, State: api.NodeState_NODE_STATE_READY}); err != nil {
		t.Fatal(err)
	}
	r := newRegistry(t, st, &clock{t: time.Unix(1000, 0)}, nil)
	registerIdle(t, r, reg("up", 1, 1000))
	const (
		ready = api.NodeState_NODE_STATE_READY
		down  = api.NodeState_NODE_STATE_DOWN
	)
	steps := []struct {
		node, action, reason string
		wantState            api.NodeState
		wantCordoned         bool
		wantDraining         bool
		wantReason           string
		wantEvent            string // "" = no event
		wantErr              string
	}{
		{"up", "cordon", "bad DIMM", ready, true, false, "bad DIMM", "up: cordoned: takes no new work (bad DIMM)", ""},
		{"up", "cordon", "", ready, true, false, "bad DIMM", "", ""},
		{"up", "drain", "", ready, true, true, "bad DIMM", "up: draining: takes no new work; its jobs move elsewhere (bad DIMM)", ""},
		{"up", "uncordon", "", ready, false, false, "", "up: uncordoned: takes new work", ""},
		{"up", "uncordon", "", ready, false, false, "", "", ""},
		{"lost", "cordon", "", down, true, false, "", "lost: cordoned: takes no new work", ""},
		{"lost", "uncordon", "", down, false, false, "", "lost: uncordoned: takes new work once it reconnects", ""},
		{"nope", "cordon", "", 0, false, false, "", "", `unknown node "nope"`},
		{"up", "evict", "", 0, false, false, "", "", `unknown node action "evict": use cordon, uncordon or drain`},
	}
	for i, s := range steps {
		before := eventsOf(t, st, api.EventKind_EVENT_KIND_CORDON)
		n, err := r.SetCordon(s.node, s.action, s.reason)
		if s.wantErr != "" {
			if err == nil || !strings.Contains(err.Error(), s.wantErr) {
				t.Fatalf("step %d: error %v, want %q", i, err, s.wantErr)
			}
			continue
		}
		if err != nil {
			t.Fatalf("step %d: %v", i, err)
		}
		stored, err := st.Node(s.node)
		if err != nil {
			t.Fatal(err)
		}
		for what, got := range map[string]*api.NodeStatus{"answered": n, "listed": statusOf(t, r, s.node), "stored": stored} {
			if got.GetState() != s.wantState || got.GetCordoned() != s.wantCordoned || got.GetDraining() != s.wantDraining || got.GetCordonReason() != s.wantReason {
				t.Errorf("step %d: %s %s cordoned %v draining %v %q, want %s %v %v %q", i, what, got.GetState().Short(), got.GetCordoned(),
					got.GetDraining(), got.GetCordonReason(), s.wantState.Short(), s.wantCordoned, s.wantDraining, s.wantReason)
			}
		}
		after := eventsOf(t, st, api.EventKind_EVENT_KIND_CORDON)
		var fresh []string
		if len(after) > len(before) {
			fresh = after[len(before):]
		}
		want := []string{}
		if s.wantEvent != "" {
			want = []string{s.wantEvent}
		}
		if !slices.Equal(append([]string{}, fresh...), want) {
			t.Errorf("step %d: events %q, want %q", i, fresh, want)
		}
	}
}

// TestCordonOutlivesOutage: a cordoned node that goes silent is reported
// down once (not on every detector pass), keeps its cordon while down,
// after it returns, and across a server restart.
func TestCordonOutlivesOutage(t *testing.T) {
	t0 := time.Unix(1000, 0)
	c := &clock{t: t0}
	st := newStore(t)
	sink := &recSink{}
	r := newRegistry(t, st, c, sink)
	l := newLoopback(t, r)
	l.connect(reg("a", 1, 1000))
	if _, err := r.SetCordon("a", ActionCordon, "flaky NIC"); err != nil {
		t.Fatal(err)
	}
	for i := range 5 {
		c.set(t0.Add(time.Duration(3+i) * time.Second))
		down := r.CheckHeartbeats()
		if i == 0 && !slices.Equal(down, []string{"a"}) {
			t.Fatalf("first silent pass marked %v down", down)
		}
		if i > 0 && len(down) != 0 {
			t.Fatalf("pass %d marked %v down again", i, down)
		}
	}
	if got := eventsOf(t, st, api.EventKind_EVENT_KIND_NODE_DOWN); len(got) != 1 {
		t.Errorf("node_down events %q, want one", got)
	}
	n := statusOf(t, r, "a")
	if n.GetState() != api.NodeState_NODE_STATE_DOWN || !n.GetCordoned() || n.GetCordonReason() != "flaky NIC" {
		t.Errorf("while silent: %s cordoned %v %q", n.GetState().Short(), n.GetCordoned(), n.GetCordonReason())
	}
	c.set(t0.Add(10 * time.Second))
	l.connect(reg("a", 1, 1000))
	if got := eventsOf(t, st, api.EventKind_EVENT_KIND_NODE_UP); len(got) != 1 {
		t.Errorf("node_up events %q, want one for its return", got)
	}
	if n := statusOf(t, r, "a"); n.GetState() != api.NodeState_NODE_STATE_READY || !n.GetCordoned() || n.GetCordonReason() != "flaky NIC" {
		t.Errorf("after it returned: %s cordoned %v %q", n.GetState().Short(), n.GetCordoned(), n.GetCordonReason())
	}
	if got, want := sink.lines(), []string{"up a joined=true", "down a: no heartbeat for 3s", "up a joined=false"}; !slices.Equal(got, want) {
		t.Errorf("the sink heard %q, want %q", got, want)
	}
	again := newRegistry(t, st, c, nil)
	if n := statusOf(t, again, "a"); n.GetState() != api.NodeState_NODE_STATE_DOWN || !n.GetCordoned() || n.GetCordonReason() != "flaky NIC" {
		t.Errorf("after a restart: %s cordoned %v %q", n.GetState().Short(), n.GetCordoned(), n.GetCordonReason())
	}
}
