package controlplane

import (
	"context"
	"log/slog"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/gpuctl/gpuctl/api"
	"github.com/gpuctl/gpuctl/store"
	"github.com/gpuctl/gpuctl/transport"
)

func cordonEvents(t *testing.T, st store.Store, kind api.EventKind) []string {
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
// change nothing; a lost node uncordoned stays down.
func TestCordonActions(t *testing.T) {
	h := newHarness(t, "fifo", threeNodes()...)
	s := stallServer(t, h, "up")
	if err := s.st.register(&api.NodeRegistration{Name: "lost"}, "127.0.0.1:2", nil, h.clock.now()); err != nil {
		t.Fatal(err)
	}
	s.st.disconnected("lost", nil, "test", h.clock.now())
	steps := []struct {
		node, action, reason string
		wantState            api.NodeState
		wantReason           string
		wantEvent            string // "" = no event
		wantErr              string
	}{
		{"up", "cordon", "bad DIMM", api.NodeState_NODE_STATE_CORDONED, "bad DIMM", "up: cordoned: takes no new work (bad DIMM)", ""},
		{"up", "cordon", "", api.NodeState_NODE_STATE_CORDONED, "bad DIMM", "", ""},
		{"up", "drain", "", api.NodeState_NODE_STATE_DRAINING, "bad DIMM", "up: draining: takes no new work; its jobs move elsewhere (bad DIMM)", ""},
		{"up", "uncordon", "", api.NodeState_NODE_STATE_READY, "", "up: uncordoned: takes new work", ""},
		{"up", "uncordon", "", api.NodeState_NODE_STATE_READY, "", "", ""},
		{"lost", "cordon", "", api.NodeState_NODE_STATE_CORDONED, "", "lost: cordoned: takes no new work", ""},
		{"lost", "uncordon", "", api.NodeState_NODE_STATE_DOWN, "", "lost: uncordoned: takes new work once it reconnects", ""},
		{"nope", "cordon", "", 0, "", "", `unknown node "nope"`},
		{"up", "evict", "", 0, "", "", `unknown node action "evict": use cordon, uncordon or drain`},
	}
	for i, st := range steps {
		before := cordonEvents(t, h.st, api.EventKind_EVENT_KIND_CORDON)
		r, err := s.cordon(&api.CordonRequest{Node: st.node, Action: st.action, Reason: st.reason})
		if st.wantErr != "" {
			if err == nil || !strings.Contains(err.Error(), st.wantErr) {
				t.Fatalf("step %d: error %v, want %q", i, err, st.wantErr)
			}
			continue
		}
		if err != nil {
			t.Fatalf("step %d: %v", i, err)
		}
		if r.GetNode().GetState() != st.wantState || r.GetNode().GetCordonReason() != st.wantReason {
			t.Errorf("step %d: answered %s %q, want %s %q", i, r.GetNode().GetState(), r.GetNode().GetCordonReason(), st.wantState, st.wantReason)
		}
		stored, err := h.st.Node(st.node)
		if err != nil {
			t.Fatal(err)
		}
		if stored.GetState() != st.wantState || stored.GetCordonReason() != st.wantReason {
			t.Errorf("step %d: stored %s %q, want %s %q", i, stored.GetState(), stored.GetCordonReason(), st.wantState, st.wantReason)
		}
		after := cordonEvents(t, h.st, api.EventKind_EVENT_KIND_CORDON)
		var fresh []string
		if len(after) > len(before) {
			fresh = after[len(before):]
		}
		want := []string{}
		if st.wantEvent != "" {
			want = []string{st.wantEvent}
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
	h := newHarness(t, "fifo", threeNodes()...)
	s := stallServer(t, h, "a")
	s.st.nodes["a"].heartbeat = time.Second
	if err := s.Cordon("a", "flaky NIC"); err != nil {
		t.Fatal(err)
	}
	now := h.clock.now()
	for i := range 5 {
		if down := s.st.checkHeartbeats(now.Add(time.Duration(3+i) * time.Second)); i == 0 && !slices.Equal(down, []string{"a"}) {
			t.Fatalf("first silent pass marked %v down", down)
		}
	}
	if got := cordonEvents(t, h.st, api.EventKind_EVENT_KIND_NODE_DOWN); len(got) != 1 {
		t.Errorf("node_down events %q, want one", got)
	}
	n := s.st.listNodes()[0]
	if n.GetState() != api.NodeState_NODE_STATE_CORDONED || n.GetCordonReason() != "flaky NIC" {
		t.Errorf("while silent: %s %q", n.GetState(), n.GetCordonReason())
	}
	s.st.heartbeat("a", now.Add(10*time.Second))
	if got := cordonEvents(t, h.st, api.EventKind_EVENT_KIND_NODE_UP); len(got) != 1 {
		t.Errorf("node_up events %q, want one for its return", got)
	}
	if n := s.st.listNodes()[0]; n.GetState() != api.NodeState_NODE_STATE_CORDONED {
		t.Errorf("after it returned: %s", n.GetState())
	}
	again, err := newState(slog.New(slog.DiscardHandler), h.st, 10, 10)
	if err != nil {
		t.Fatal(err)
	}
	if n := again.listNodes()[0]; n.GetState() != api.NodeState_NODE_STATE_CORDONED || n.GetCordonReason() != "flaky NIC" {
		t.Errorf("after a restart: %s %q", n.GetState(), n.GetCordonReason())
	}
}

// TestDrain: draining a node queues a move of its checkpointing job onto
// other nodes (which then begins with a checkpoint request), leaves a job
// that does not checkpoint in place saying why, says so for a job that
// fits nowhere else, and does not queue a move twice.
func TestDrain(t *testing.T) {
	nodes := []*api.NodeStatus{readyNode("n0", 4, "r0", "s0"), readyNode("n1", 4, "r0", "s0"), readyNode("n2", 2, "r1", "s1")}
	h := newHarness(t, "fifo", nodes...)
	ckpt := "checkpoint:\n  dir: " + t.TempDir() + "\n"
	movable := h.submit(ringSpec("movable", 1, 2, ckpt), true)
	plain := h.submit(ringSpec("plain", 1, 1, ""), true)
	for _, id := range []string{movable, plain} {
		if _, err := h.m.assign(context.Background(), id, []string{"n0"}); err != nil {
			t.Fatal(err)
		}
		h.started(id)
	}
	// n1 is filled by a job that needs a whole 4-GPU node: with n0
	// draining it would fit nowhere.
	big := h.submit(ringSpec("big", 1, 4, ckpt), true)
	if _, err := h.m.assign(context.Background(), big, []string{"n1"}); err != nil {
		t.Fatal(err)
	}
	h.started(big)
	h.nodes.take()

	nodes[0].State = api.NodeState_NODE_STATE_DRAINING
	got := h.m.drain("n0")
	byJob := map[string]*api.DrainedJob{}
	for _, d := range got {
		byJob[d.GetJob()] = d
	}
	if len(got) != 2 {
		t.Fatalf("drain reported %v, want the two jobs on n0", got)
	}
	if d := byJob[movable]; !d.GetMoving() || !slices.Equal(d.GetTo(), []string{"n2"}) {
		t.Errorf("movable: %v, want moving to n2", d)
	}
	if d := byJob[plain]; d.GetMoving() || !strings.Contains(d.GetReason(), "no checkpoint dir") {
		t.Errorf("plain: %v, want it to stay for lack of a checkpoint dir", d)
	}
	if again := h.m.drain("n0"); len(again) != 2 || len(h.m.moves) != 1 {
		t.Errorf("second drain: %v with %d moves queued, want the same answer and one move", again, len(h.m.moves))
	}
	h.reconcile()
	if sigs := signals(h.nodes.take()); !slices.Equal(sigs, []string{"n0:SIGUSR1"}) {
		t.Errorf("after the drain the pass sent %v, want a checkpoint request to the movable job on n0", sigs)
	}
	if j := h.job(movable); j.GetStopping() != api.JobStop_JOB_STOP_MOVE || nodesOfTarget(j) != "n2" {
		t.Errorf("movable job: stopping %s target %s", j.GetStopping(), nodesOfTarget(j))
	}

	nodes[0].State = api.NodeState_NODE_STATE_READY
	nodes[1].State = api.NodeState_NODE_STATE_DRAINING
	got = h.m.drain("n1")
	if len(got) != 1 || got[0].GetJob() != big || got[0].GetMoving() || !strings.HasPrefix(got[0].GetReason(), "no room elsewhere: ") {
		t.Errorf("draining n1: %v, want the big job to stay for lack of room", got)
	}
}

func nodesOfTarget(j *api.Job) string {
	var out []string
	for _, jn := range j.GetMoveTarget() {
		out = append(out, jn.GetNode())
	}
	return strings.Join(out, ",")
}

func TestRankNode(t *testing.T) {
	running := &api.Job{Id: "j-1", State: api.JobState_JOB_STATE_RUNNING, Placement: []*api.JobNode{
		{Node: "n0", Ranks: []*api.JobRank{{Rank: 0}, {Rank: 1}}}, {Node: "n1", Ranks: []*api.JobRank{{Rank: 2}, {Rank: 3}}}}}
	pending := &api.Job{Id: "j-2", State: api.JobState_JOB_STATE_PENDING}
	cases := []struct {
		name    string
		job     *api.Job
		rank    int32
		want    string
		wantErr string
	}{
		{"first node", running, 0, "n0", ""},
		{"second node", running, 3, "n1", ""},
		{"no such rank", running, 4, "", "job j-1 has no rank 4: its ranks are 0..3"},
		{"pending", pending, 0, "", "job j-2 is pending and placed nowhere: it has no logs until it starts"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			got, err := rankNode(tc.job, tc.rank)
			if tc.wantErr != "" {
				if err == nil || err.Error() != tc.wantErr {
					t.Fatalf("error %v, want %q", err, tc.wantErr)
				}
				return
			}
			if err != nil || got != tc.want {
				t.Fatalf("got %q, %v; want %q", got, err, tc.want)
			}
		})
	}
}

func TestOpsRoles(t *testing.T) {
	cases := []struct {
		req  *api.ClientRequest
		want transport.Role
	}{
		{&api.ClientRequest{Body: &api.ClientRequest_ListStalls{ListStalls: &api.ListStallsRequest{}}}, transport.RoleViewer},
		{&api.ClientRequest{Body: &api.ClientRequest_Logs{Logs: &api.LogsRequest{}}}, transport.RoleViewer},
		{&api.ClientRequest{Body: &api.ClientRequest_Cordon{Cordon: &api.CordonRequest{Action: "cordon"}}}, transport.RoleOperator},
	}
	for _, tc := range cases {
		if got := minRole(tc.req); got != tc.want {
			t.Errorf("%T needs %s, want %s", tc.req.Body, got, tc.want)
		}
	}
}
