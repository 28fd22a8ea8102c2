package jobs

import (
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/gpuctl/gpuctl/api"
	"github.com/gpuctl/gpuctl/store"
)

// TestCompetingRecoveriesKeepSurvivingGPUs loses a node two jobs share.
// Both wait for its fence, then decide in the same pass; the job that
// decides first must not take the GPU the other's surviving rank has
// released meanwhile, and both run again.
func TestCompetingRecoveriesKeepSurvivingGPUs(t *testing.T) {
	const lease = 5 * time.Second
	h := newHarness(t, "fifo", readyNode("n0", 4, "r0", "s0"), readyNode("n1", 4, "r0", "s0"),
		readyNode("n2", 4, "r0", "s0"), readyNode("n3", 4, "r1", "s0"), readyNode("n4", 4, "r1", "s0"))
	h.lease = lease
	h.restart("fifo")
	a := h.submit(ringSpec("a", 2, 2, "restart_policy: replace-node\n"), true)
	b := h.submit(ringSpec("b", 4, 1, "restart_policy: replace-node\n"), true)
	if _, err := h.assign(a, []string{"n0", "n1"}); err != nil {
		t.Fatal(err)
	}
	if _, err := h.assign(b, []string{"n0", "n1", "n2", "n3"}); err != nil {
		t.Fatal(err)
	}
	h.settle()
	h.started(a)
	h.started(b)
	kept := findNode(h.job(b), "n2").GetRanks()[0].GetGpu()

	// n1 dies: the survivors' collectives fail first, then the node is
	// declared down, then every surviving rank is gone.
	h.exit(a, "n0", findNode(h.job(a), "n0").GetRanks()[0].GetRank(), 1, "")
	h.exit(b, "n2", findNode(h.job(b), "n2").GetRanks()[0].GetRank(), 1, "")
	h.nodes.update("n1", func(n *api.NodeStatus) {
		n.State, n.Connected, n.Stale, n.LastSeenUnixNano = api.NodeState_NODE_STATE_DOWN, false, true, h.clock.now().UnixNano()
	})
	h.nodeDown("n1", "no heartbeat for 2s")
	h.exitAll(a, -1)
	h.exitAll(b, -1)
	h.reconcile()
	h.clock.add(lease + 2*time.Second)
	h.reconcile()
	h.reconcile()
	for _, id := range []string{a, b} {
		j := h.job(id)
		if j.GetState() != api.JobState_JOB_STATE_RUNNING || j.GetAttempt() != 2 || slices.Contains(nodesOf(j), "n1") {
			t.Fatalf("job %s: %s attempt %d on %v (%s)\n%s", id, stateName(j.GetState()), j.GetAttempt(), nodesOf(j), j.GetReason(),
				strings.Join(h.recoveryEvents(id), "\n"))
		}
	}
	if got := findNode(h.job(b), "n2").GetRanks()[0].GetGpu(); got != kept {
		t.Errorf("b's rank on n2 runs on GPU %d, want its own GPU %d kept for it while it recovered", got, kept)
	}
	seen := map[string]string{}
	for _, id := range []string{a, b} {
		for _, jn := range h.job(id).GetPlacement() {
			for _, r := range jn.GetRanks() {
				at := jn.GetNode() + "/" + string(rune('0'+r.GetGpu()))
				if other, ok := seen[at]; ok {
					t.Errorf("GPU %s holds a rank of %s and of %s", at, other, id)
				}
				seen[at] = id
			}
		}
	}
}

// TestRecoveriesGoByPriority: two jobs lose a node each and one spare is
// left. The lower-priority job failed first and reserved the spare ahead
// of its decision; the higher one still recovers, and the lower one gives
// up only because the capacity is really not there.
func TestRecoveriesGoByPriority(t *testing.T) {
	h := newHarness(t, "fifo", readyNode("n0", 1, "r0", "s0"), readyNode("n1", 1, "r0", "s0"),
		readyNode("n2", 1, "r0", "s0"), readyNode("n3", 1, "r0", "s0"), readyNode("n4", 1, "r0", "s0"))
	low := h.submit(ringSpec("low", 2, 1, "restart_policy: replace-node\n"), false)
	h.reconcile()
	high := h.submit(ringSpec("high", 2, 1, "restart_policy: replace-node\npriority: 5\n"), false)
	h.reconcile()
	h.started(low)
	h.started(high)
	lowLost, highLost := nodesOf(h.job(low))[1], nodesOf(h.job(high))[1]
	for _, n := range []string{lowLost, highLost} {
		h.nodes.update(n, func(s *api.NodeStatus) { s.State, s.Connected, s.Stale = api.NodeState_NODE_STATE_DOWN, false, true })
		h.nodeDown(n, "no heartbeat for 2s")
	}
	h.exitAll(low, -1)
	h.exitAll(high, -1)
	h.reconcile()
	h.reconcile()
	j := h.job(high)
	if j.GetState() != api.JobState_JOB_STATE_RUNNING || j.GetAttempt() != 2 || slices.Contains(nodesOf(j), highLost) {
		t.Fatalf("high: %s attempt %d on %v (%s), want running again\n%s", stateName(j.GetState()), j.GetAttempt(), nodesOf(j), j.GetReason(),
			strings.Join(h.recoveryEvents(high), "\n"))
	}
	// Three nodes are left for two jobs of two: the lower priority fails,
	// saying why.
	if j := h.job(low); j.GetState() != api.JobState_JOB_STATE_FAILED || !strings.Contains(j.GetReason(), "no free node can replace it") {
		t.Errorf("low: %s (%s), want failed for want of a node", stateName(j.GetState()), j.GetReason())
	}
}

// TestNodePolicyRefusalRunsElsewhere: a node that refuses a launch by its
// own policy (root ranks not allowed there) is excluded for the job and
// flagged with an event; the job runs on other nodes, and no node is
// cordoned.
func TestNodePolicyRefusalRunsElsewhere(t *testing.T) {
	h := newHarness(t, "fifo", threeNodes()...)
	h.nodes.mu.Lock()
	h.nodes.nodePolicy = map[string]string{"n0": "launch root: its ranks would run as root: start nodemon with --allow-root-ranks"}
	h.nodes.mu.Unlock()
	id := h.submit(ringSpec("root", 2, 4, "restart_policy: replace-node\n"), false)
	h.reconcile()
	if j := h.job(id); j.GetState() != api.JobState_JOB_STATE_RECOVERING || !slices.Contains(j.GetExclude(), "n0") {
		t.Fatalf("after the refusal: %s exclude %v (%s)", stateName(j.GetState()), j.GetExclude(), j.GetReason())
	}
	h.started(id)
	h.exitAll(id, -1)
	h.reconcile()
	j := h.job(id)
	if j.GetState() != api.JobState_JOB_STATE_RUNNING || j.GetAttempt() != 2 || slices.Contains(nodesOf(j), "n0") {
		t.Fatalf("%s attempt %d on %v (%s), want running again without n0", stateName(j.GetState()), j.GetAttempt(), nodesOf(j), j.GetReason())
	}
	if got := h.nodes.cordoned(); len(got) != 0 {
		t.Errorf("cordoned %v for a node's policy", got)
	}
	evs, err := h.st.Events(store.EventFilter{})
	if err != nil {
		t.Fatal(err)
	}
	flagged := false
	for _, e := range evs {
		flagged = flagged || e.GetNode() == "n0" && e.GetJob() == id && strings.Contains(e.GetMessage(), "n0 refused job "+id+" by its own policy")
	}
	if !flagged {
		t.Errorf("no event flags n0 for refusing %s", id)
	}
}
