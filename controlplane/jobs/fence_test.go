package jobs

import (
	"context"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/gpuctl/gpuctl/api"
	"github.com/gpuctl/gpuctl/controlplane/nodes"
)

func TestSupersededRanks(t *testing.T) {
	// Attempt 3 of job a runs ranks 0-1 on n1 and rank 2 on n2, which was
	// lost (its rank given up); job b is cancelled and all its ranks gone.
	a := &api.Job{Id: "a", Attempt: 3, Placement: []*api.JobNode{
		{Node: "n1", Ranks: []*api.JobRank{{Rank: 0, Pid: 100}, {Rank: 1}}},
		{Node: "n2", Ranks: []*api.JobRank{{Rank: 2, Pid: 300, Exited: true, Signal: lostRank}}},
	}}
	b := &api.Job{Id: "b", Attempt: 1, State: api.JobState_JOB_STATE_CANCELLED, Placement: []*api.JobNode{
		{Node: "n1", Ranks: []*api.JobRank{{Rank: 0, Pid: 500, Exited: true}}},
	}}
	jobs := map[string]*api.Job{"a": a, "b": b}
	lookup := func(id string) *api.Job { return jobs[id] }
	tests := []struct {
		name string
		node string
		rk   *api.RankStatus
		want bool
	}{
		{"current rank", "n1", &api.RankStatus{Job: "a", Attempt: 3, Rank: 0, Pid: 100}, false},
		{"current rank whose start the server has not seen", "n1", &api.RankStatus{Job: "a", Attempt: 3, Rank: 1, Pid: 101}, false},
		{"older attempt", "n1", &api.RankStatus{Job: "a", Attempt: 2, Rank: 0, Pid: 90}, true},
		{"older attempt on a node the job left", "n3", &api.RankStatus{Job: "a", Attempt: 1, Rank: 3, Pid: 7}, true},
		{"current attempt, rank given up with its node", "n2", &api.RankStatus{Job: "a", Attempt: 3, Rank: 2, Pid: 300}, true},
		{"current attempt, another pid", "n1", &api.RankStatus{Job: "a", Attempt: 3, Rank: 0, Pid: 999}, true},
		{"current attempt, a rank it has not got there", "n2", &api.RankStatus{Job: "a", Attempt: 3, Rank: 0, Pid: 100}, true},
		{"an attempt the server never made", "n1", &api.RankStatus{Job: "a", Attempt: 4, Rank: 0, Pid: 100}, true},
		{"cancelled job's rank still running", "n1", &api.RankStatus{Job: "b", Attempt: 1, Rank: 0, Pid: 500}, true},
		{"unknown job (a validation gang)", "n1", &api.RankStatus{Job: "a-validate-4", Attempt: 1, Rank: 0, Pid: 1}, false},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got := len(superseded(lookup, tc.node, []*api.RankStatus{tc.rk})) == 1
			if got != tc.want {
				t.Errorf("superseded = %v, want %v", got, tc.want)
			}
		})
	}
}

// TestRelaunchWaitsForTheLostNodesFence loses a node of a running job:
// the next attempt waits until the lost node is fenced, by its lease
// passing (counted from its last contact), by the node coming back without
// the old ranks, or by the node killing the ranks it still had; a cancel
// then kills a superseded attempt's ranks wherever a node reports them.
func TestRelaunchWaitsForTheLostNodesFence(t *testing.T) {
	const lease = 5 * time.Second
	tests := []struct {
		name string
		// back, when set, is what n1 reports when it registers 3 s after
		// it was lost; nil: it stays away.
		back []*api.RankStatus
		// wait is how long after the loss attempt 2 launches.
		wait      time.Duration
		fenceCmd  bool
		eventWant string
	}{
		{"lease passes", nil, lease + fenceMargin, false, "its lease has passed"},
		{"node returns without the ranks", []*api.RankStatus{}, 3 * time.Second, false, "came back without any of its ranks"},
		{"node returns still running them", []*api.RankStatus{{Attempt: 1, Rank: 4, Pid: 1004}}, 3 * time.Second, true, "the node killed"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			h := newHarness(t, "fifo", readyNode("n0", 4, "r0", "s0"), readyNode("n1", 4, "r0", "s0"), readyNode("n2", 4, "r0", "s0"))
			h.lease = lease
			h.restart("fifo")
			id := h.submit(ringSpec("ring", 2, 4, "restart_policy: replace-node\n"), false)
			h.reconcile()
			h.started(id)
			h.nodes.take()
			lost := h.clock.now()
			h.nodes.update("n1", func(n *api.NodeStatus) {
				n.State, n.Connected, n.Stale, n.LastSeenUnixNano = api.NodeState_NODE_STATE_DOWN, false, true, lost.UnixNano()
			})
			h.clock.add(2 * time.Second) // the detector's 2 heartbeats
			h.nodeDown("n1", "no heartbeat for 2s")
			h.reconcile()
			for _, r := range findNode(h.job(id), "n0").GetRanks() {
				h.exit(id, "n0", r.GetRank(), -1, "SIGTERM")
			}
			if l := launches(h.nodes.take()); len(l) > 0 {
				t.Fatalf("attempt 2 launched on %v as soon as the survivors exited, before n1 was fenced", l)
			}
			relaunched := func() bool {
				h.reconcile()
				return len(launches(h.nodes.take())) > 0
			}
			for h.clock.now().Sub(lost) < tc.wait-100*time.Millisecond {
				if tc.back != nil && h.clock.now().Sub(lost) >= 3*time.Second-100*time.Millisecond {
					break
				}
				if relaunched() {
					t.Fatalf("attempt 2 launched %s after n1 was lost, before it was fenced", h.clock.now().Sub(lost))
				}
				h.clock.add(250 * time.Millisecond)
			}
			if tc.back != nil {
				for _, rk := range tc.back {
					rk.Job = id
				}
				h.nodes.update("n1", func(n *api.NodeStatus) { n.State, n.Connected, n.Stale = api.NodeState_NODE_STATE_READY, true, false })
				h.nodeUp("n1", &api.NodeRegistration{Name: "n1", Running: tc.back})
			} else {
				h.clock.add(200 * time.Millisecond)
			}
			cmds := h.nodes.take()
			var fenced bool
			for _, c := range cmds {
				if s := c.cmd.GetSignal(); s != nil && c.node == "n1" && s.GetFence() && s.GetAttempt() == 1 && s.GetJob() == id {
					fenced = true
				}
			}
			if fenced != tc.fenceCmd {
				t.Errorf("fence command to n1: %v, want %v (%v)", fenced, tc.fenceCmd, cmds)
			}
			if len(launches(cmds)) == 0 && !relaunched() {
				t.Fatalf("attempt 2 not launched %s after the loss (%s)", h.clock.now().Sub(lost), h.job(id).GetReason())
			}
			evs := strings.Join(h.recoveryEvents(id), "\n")
			for _, want := range []string{"waiting until attempt 1 is fenced on n1", tc.eventWant} {
				if !strings.Contains(evs, want) {
					t.Errorf("no recovery event says %q:\n%s", want, evs)
				}
			}
			if tc.back == nil {
				return
			}
			// n1 (excluded now) still reports a rank of attempt 1: a
			// cancel kills it there too, not only attempt 2's ranks.
			h.started(id)
			h.nodes.setRanks([]nodes.NodeRanks{{Node: "n1", Ranks: []*api.RankStatus{{Job: id, Attempt: 1, Rank: 4, Pid: 1004}}}})
			if _, err := h.cancel(id, "test"); err != nil {
				t.Fatal(err)
			}
			h.reconcile()
			var swept bool
			for _, c := range h.nodes.take() {
				if s := c.cmd.GetSignal(); s != nil && c.node == "n1" && s.GetFence() && s.GetAttempt() == 1 {
					swept = true
				}
			}
			if !swept {
				t.Error("cancel did not kill attempt 1's rank on n1")
			}
		})
	}
}

// TestRestartKeepsTheFence restarts the server while a recovering job
// waits for a lost node's fence: the wait is in memory only, so the new
// owner waits a lease from its own start (the old server renewed nothing
// later than that) before the next attempt runs.
func TestRestartKeepsTheFence(t *testing.T) {
	const lease = 5 * time.Second
	h := newHarness(t, "fifo", readyNode("n0", 4, "r0", "s0"), readyNode("n1", 4, "r0", "s0"), readyNode("n2", 4, "r0", "s0"))
	h.lease = lease
	h.restart("fifo")
	id := h.submit(ringSpec("ring", 2, 4, "restart_policy: replace-node\n"), false)
	h.reconcile()
	h.started(id)
	h.lose("n1")
	for _, r := range findNode(h.job(id), "n0").GetRanks() {
		h.exit(id, "n0", r.GetRank(), -1, "SIGTERM")
	}
	h.clock.add(3 * time.Second)
	h.restart("fifo")
	h.nodes.take()
	h.launchesOnlyAfter(id, h.clock.now().Add(lease+fenceMargin))
}

// TestRestartKeepsTheFenceOfAStoppingJob restarts the server while a job
// is being moved or preempted and its node is lost: the job starts again
// (on the move's target, or from the queue with room for it at once), and
// after the restart it still waits a lease for the lost node's fence, as
// a recovery does (TestRestartKeepsTheFence).
func TestRestartKeepsTheFenceOfAStoppingJob(t *testing.T) {
	const lease = 5 * time.Second
	tests := []struct {
		name, policy string
		stop         api.JobStop
		// begin starts the stop of job id on n1; what it returns runs
		// after the restart.
		begin func(t *testing.T, h *harness, id string) func()
	}{
		{"move", "fifo", api.JobStop_JOB_STOP_MOVE, func(t *testing.T, h *harness, id string) func() {
			if _, err := h.nodes.SetCordon("n1", "drain", ""); err != nil {
				t.Fatal(err)
			}
			if got := byTo(h.drain("n1"))[id]; len(got) != 1 {
				t.Fatalf("drain of n1 moves the job to %v, want one node", got)
			}
			return func() {}
		}},
		{"preemption", "priority", api.JobStop_JOB_STOP_PREEMPT, func(t *testing.T, h *harness, id string) func() {
			high := h.submit(ringSpec("high", 2, 4, "priority: 500\n"), false)
			return func() {
				// The job it was preempted for goes: n0 is free at once.
				if _, err := h.cancel(high, "test"); err != nil {
					t.Fatal(err)
				}
			}
		}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			h := newHarness(t, tc.policy, readyNode("n0", 4, "r0", "s0"), readyNode("n1", 4, "r0", "s0"))
			h.lease = lease
			h.restart(tc.policy)
			id := h.submit(ringSpec("ring", 1, 4, "checkpoint:\n  dir: "+t.TempDir()+"\n"), true)
			if _, err := h.assign(id, []string{"n1"}); err != nil {
				t.Fatal(err)
			}
			h.started(id)
			h.checkpointed(id, 10)
			then := tc.begin(t, h, id)
			h.reconcile()
			if j := h.job(id); j.GetStopping() != tc.stop {
				t.Fatalf("job stopping %s, want %s", j.GetStopping(), tc.stop)
			}
			h.lose("n1")
			h.clock.add(time.Second)
			h.restart(tc.policy)
			h.nodes.take()
			fenced := h.clock.now().Add(lease + fenceMargin)
			then()
			h.launchesOnlyAfter(id, fenced)
			if j := h.job(id); j.GetState() != api.JobState_JOB_STATE_RUNNING || j.GetAttempt() != 2 {
				t.Errorf("not running again a lease after the restart: %s attempt %d %s", stateName(j.GetState()), j.GetAttempt(), j.GetReason())
			}
			if evs := strings.Join(h.recoveryEvents(id), "\n"); !strings.Contains(evs, "attempt 1 fenced on n1: its lease has passed") {
				t.Errorf("no event says n1 was fenced:\n%s", evs)
			}
		})
	}
}

// lose takes node down as the heartbeat detector does.
func (h *harness) lose(node string) {
	h.t.Helper()
	h.nodes.update(node, func(n *api.NodeStatus) {
		n.State, n.Connected, n.Stale, n.LastSeenUnixNano = api.NodeState_NODE_STATE_DOWN, false, true, h.clock.now().UnixNano()
	})
	h.nodeDown(node, "no heartbeat for 2s")
}

// launchesOnlyAfter runs the owner's passes, 250 ms apart, until fenced:
// job id must not launch before, and must launch right after.
func (h *harness) launchesOnlyAfter(id string, fenced time.Time) {
	h.t.Helper()
	launched := func() bool {
		h.reconcile()
		return slices.ContainsFunc(launches(h.nodes.take()), func(c sentCmd) bool { return c.cmd.GetLaunch().GetJob() == id })
	}
	for h.clock.now().Before(fenced.Add(-100 * time.Millisecond)) {
		if launched() {
			h.t.Fatalf("%s launched %s before its lost node's lease passed", id, fenced.Sub(h.clock.now()))
		}
		h.clock.add(250 * time.Millisecond)
	}
	h.clock.add(200 * time.Millisecond)
	if !launched() {
		h.t.Fatalf("%s not launched once its lost node's lease passed: %s %s", id, stateName(h.job(id).GetState()), h.job(id).GetReason())
	}
}

// TestConfirmFencedByTheOperator: a lost node whose witnesses are gone
// too (they answer no Supersede) holds its job's next attempt back for
// good, long past the lease; the operator's confirmation (gpuctl node
// remove --confirm-fenced) lifts the fence, with a warning event, and the
// job relaunches. It is refused for a node that is connected, or that no
// job waits for.
func TestConfirmFencedByTheOperator(t *testing.T) {
	const lease = 5 * time.Second
	witness := func(name string) *api.NodeStatus {
		n := readyNode(name, 4, "r0", "s0")
		n.Registration.PeerAddr = "127.0.0.1:7" + name[1:]
		return n
	}
	// n0..n3 can witness; n4 (no peer listener) is the spare.
	h := newHarness(t, "fifo", witness("n0"), witness("n1"), witness("n2"), witness("n3"), readyNode("n4", 4, "r0", "s0"))
	h.lease = lease
	h.restart("fifo")
	id := h.submit(ringSpec("ring", 2, 4, "restart_policy: replace-node\n"), false)
	h.reconcile()
	h.started(id)
	if got := h.job(id).GetWitnesses(); !slices.Equal(got, []string{"n0", "n1", "n2", "n3"}) {
		t.Fatalf("witness pool %v, want the job's nodes n0, n1 and the others n2, n3", got)
	}
	h.nodes.take()
	h.nodes.mu.Lock()
	h.nodes.deaf = map[string]bool{"n2": true, "n3": true}
	h.nodes.mu.Unlock()
	h.lose("n2")
	h.lose("n3")
	h.lose("n1") // witnessed by n2, n3 and n0: one acknowledgement of the two needed
	for _, r := range findNode(h.job(id), "n0").GetRanks() {
		h.exit(id, "n0", r.GetRank(), -1, "SIGTERM")
	}
	for end := h.clock.now().Add(10 * lease); h.clock.now().Before(end); h.clock.add(250 * time.Millisecond) {
		h.reconcile()
		if l := launches(h.nodes.take()); len(l) > 0 {
			t.Fatalf("attempt 2 launched on %v while n1's witnesses cannot say it is fenced", l)
		}
	}

	if evs := strings.Join(h.recoveryEvents(id), "\n"); !strings.Contains(evs, "attempt 1 still waits on n1: 1 of its 3 witnesses acknowledged it superseded, 2 are needed; if n1 and its ranks are down for good, run `gpuctl node remove n1 --confirm-fenced`") {
		t.Errorf("no event tells the operator what holds the job back:\n%s", evs)
	}
	confirm := func(node string) ([]string, error) {
		v, err := h.call(func(ctx context.Context) (any, error) { return h.m.ConfirmFenced(ctx, node, "alice") })
		jobs, _ := v.([]string)
		return jobs, err
	}
	if _, err := confirm("n0"); err == nil || !strings.Contains(err.Error(), "node n0 is connected") {
		t.Errorf("confirming a connected node: %v", err)
	}
	if _, err := confirm("n2"); err == nil || !strings.Contains(err.Error(), "no job waits for node n2") {
		t.Errorf("confirming a node no job waits for: %v", err)
	}
	jobs, err := confirm("n1")
	if err != nil || !slices.Equal(jobs, []string{id}) {
		t.Fatalf("confirm n1: %v %v, want [%s]", jobs, err, id)
	}
	if f := h.job(id).GetFencedNodes(); len(f) != 0 {
		t.Errorf("the stored job still waits for %v", f)
	}
	h.reconcile()
	if l := launches(h.nodes.take()); len(l) == 0 {
		t.Fatalf("attempt 2 not launched once the operator confirmed n1 fenced: %s", h.job(id).GetReason())
	}
	var warned bool
	for _, e := range h.jobEvents(id, api.EventKind_EVENT_KIND_RECOVERY) {
		if strings.Contains(e.GetMessage(), "fenced on n1: alice confirmed that the node and its ranks are down") &&
			e.GetSeverity() == api.Severity_SEVERITY_WARNING {
			warned = true
		}
	}
	if !warned {
		t.Errorf("no warning event names alice's confirmation:\n%s", strings.Join(h.recoveryEvents(id), "\n"))
	}
	if _, err := confirm("n1"); err == nil {
		t.Error("confirming n1 again: no fence waits, yet it was taken")
	}
}
