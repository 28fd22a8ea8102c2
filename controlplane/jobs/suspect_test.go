package jobs

import (
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/gpuctl/gpuctl/api"
	"github.com/gpuctl/gpuctl/controlplane/nodes"
)

// TestLostNodeIsSuspectNotCordoned: a node lost by a recovery is marked
// suspect, not cordoned; queued work does not land on a suspect node, but
// a recovery takes one, validates it first, and the passed validation lifts
// its suspicion.
func TestLostNodeIsSuspectNotCordoned(t *testing.T) {
	h := newHarness(t, "fifo", readyNode("n0", 4, "r0", "s0"), readyNode("n1", 4, "r0", "s0"), readyNode("n2", 4, "r0", "s0"))
	withRecovery(h)
	h.nodes.mu.Lock()
	h.nodes.suspects, h.nodes.now = true, h.clock.now
	h.nodes.mu.Unlock()
	// n2 was lost earlier and came back: suspect for another minute.
	h.nodes.update("n2", func(n *api.NodeStatus) {
		n.SuspectUntilUnixNano, n.SuspectReason = h.clock.now().Add(time.Minute).UnixNano(), "recovering job j-old: node n2 went down"
	})
	id := h.submit(ringSpec("ring", 2, 4, "restart_policy: replace-node\n"), false)
	other := h.submit(ringSpec("other", 1, 4, ""), false)
	h.reconcile()
	h.started(id)
	if got := nodesOf(h.job(id)); !slices.Equal(got, []string{"n0", "n1"}) {
		t.Fatalf("placed on %v", got)
	}
	if j := h.job(other); j.GetState() != api.JobState_JOB_STATE_PENDING {
		t.Fatalf("queued job %s on %v: a suspect node took queued work", stateName(j.GetState()), nodesOf(j))
	}
	h.nodes.take()

	h.nodes.update("n1", func(n *api.NodeStatus) {
		n.State, n.Connected, n.Stale = api.NodeState_NODE_STATE_DOWN, false, true
	})
	h.nodeDown("n1", "no heartbeat for 2.1s")
	h.reconcile()
	for _, r := range findNode(h.job(id), "n0").GetRanks() {
		h.exit(id, "n0", r.GetRank(), -1, "SIGTERM")
	}
	h.reconcile()
	gang := validationGang(h.nodes.take())
	if len(gang) != 2 || gang["n0"] == nil || gang["n2"] == nil {
		t.Fatalf("validation gang %v, want n0 and the suspect n2", gang)
	}
	h.clock.add(time.Second)
	h.finishGang(gang, nil)
	h.reconcile()
	if cmds := launches(h.nodes.take()); len(cmds) != 2 || cmds[0].node != "n0" || cmds[1].node != "n2" {
		t.Fatalf("relaunch on %v, want n0,n2", cmds)
	}
	h.nodes.mu.Lock()
	actions := slices.Clone(h.nodes.actions)
	h.nodes.mu.Unlock()
	if want := []string{nodes.ActionSuspect + " n1", nodes.ActionVouch + " n2"}; !slices.Equal(actions, want) {
		t.Errorf("node actions %q, want %q: the lost node suspect (not cordoned), the validated one vouched for", actions, want)
	}
	for _, n := range h.nodes.Nodes() {
		if n.GetCordoned() {
			t.Errorf("%s cordoned (%s)", n.GetRegistration().GetName(), n.GetCordonReason())
		}
	}
	if ex := h.job(id).GetExclude(); len(ex) != 0 {
		t.Errorf("job excludes %v for good: a lost node is left to its suspicion", ex)
	}
	evs := strings.Join(h.recoveryEvents(id), "\n")
	if !strings.Contains(evs, "n1 suspect until") {
		t.Errorf("no recovery event says n1 is suspect in:\n%s", evs)
	}
}

// TestRecoveryWaitsForRestartingNode: a recovery that finds no free node
// while a node went down only a moment ago (its nodemon, or the server,
// restarting) waits for it rather than failing the job; it runs there once
// the node is back, and gives up only once the node stayed away past its
// reconnect bound.
func TestRecoveryWaitsForRestartingNode(t *testing.T) {
	for _, back := range []bool{true, false} {
		t.Run(map[bool]string{true: "node returns", false: "node stays away"}[back], func(t *testing.T) {
			h := newHarness(t, "fifo", readyNode("n0", 4, "r0", "s0"), readyNode("n1", 4, "r0", "s0"), readyNode("n2", 4, "r0", "s0"))
			id := h.submit(ringSpec("ring", 2, 4, "restart_policy: replace-node\n"), false)
			h.reconcile()
			h.started(id)
			if got := nodesOf(h.job(id)); !slices.Equal(got, []string{"n0", "n1"}) {
				t.Fatalf("placed on %v", got)
			}
			h.setLive("n2", false)
			h.clock.add(time.Second)
			h.loseNode(id, "n1")
			if j := h.job(id); j.GetState() != api.JobState_JOB_STATE_RECOVERING {
				t.Fatalf("with n2 restarting: %s (%s), want recovering", stateName(j.GetState()), j.GetReason())
			}
			if evs := strings.Join(h.recoveryEvents(id), "\n"); !strings.Contains(evs, "waiting for n2 to reconnect") {
				t.Errorf("no recovery event says it waits for n2:\n%s", evs)
			}
			if back {
				h.clock.add(3 * time.Second)
				h.setLive("n2", true)
				h.reconcile()
				if j := h.job(id); j.GetState() != api.JobState_JOB_STATE_RUNNING || j.GetAttempt() != 2 || !slices.Equal(nodesOf(j), []string{"n0", "n2"}) {
					t.Fatalf("once n2 is back: %s attempt %d on %v (%s)", stateName(j.GetState()), j.GetAttempt(), nodesOf(j), j.GetReason())
				}
				return
			}
			h.clock.add(ReconnectBound(0, DefaultReconnectGrace))
			h.reconcile()
			if j := h.job(id); j.GetState() != api.JobState_JOB_STATE_FAILED || !strings.Contains(j.GetReason(), "no free node can replace it") {
				t.Fatalf("n2 away past its bound: %s (%s), want failed for want of nodes", stateName(j.GetState()), j.GetReason())
			}
		})
	}
}

// TestRecoveryTakesBackARestartedNode: in a cluster of exactly the job's
// nodes, a node lost and back a moment later (its nodemon restarted) runs
// the job's next attempt, where it used to be failed and excluded for
// good, failing the job for want of nodes.
func TestRecoveryTakesBackARestartedNode(t *testing.T) {
	h := newHarness(t, "fifo", readyNode("n0", 4, "r0", "s0"), readyNode("n1", 4, "r0", "s0"))
	h.nodes.mu.Lock()
	h.nodes.suspects, h.nodes.now = true, h.clock.now
	h.nodes.mu.Unlock()
	id := h.submit(ringSpec("ring", 2, 4, "restart_policy: replace-node\n"), false)
	h.reconcile()
	h.started(id)
	h.clock.add(time.Second)
	// n1's last samples list its ranks, alive while its nodemon was gone.
	samples := func(live bool) {
		h.nodes.update("n1", func(n *api.NodeStatus) {
			for _, r := range findNode(h.job(id), "n1").GetRanks() {
				var procs []*api.GPUProcess
				if live {
					procs = []*api.GPUProcess{{Pid: r.GetPid()}}
				}
				n.Gpus[r.GetGpu()].Last = &api.GPUSample{Processes: procs}
			}
		})
	}
	samples(true)
	h.loseNode(id, "n1")
	if j := h.job(id); j.GetState() != api.JobState_JOB_STATE_RECOVERING {
		t.Fatalf("with n1 just lost: %s (%s), want recovering", stateName(j.GetState()), j.GetReason())
	}
	h.clock.add(2 * time.Second)
	// Back, it fences the old ranks: its samples show them gone.
	h.setLive("n1", true)
	samples(false)
	h.reconcile()
	j := h.job(id)
	if j.GetState() != api.JobState_JOB_STATE_RUNNING || j.GetAttempt() != 2 || !slices.Equal(nodesOf(j), []string{"n0", "n1"}) || len(j.GetExclude()) != 0 {
		t.Fatalf("once n1 is back: %s attempt %d on %v exclude %v (%s)", stateName(j.GetState()), j.GetAttempt(), nodesOf(j), j.GetExclude(), j.GetReason())
	}
}

// setLive marks node ready (up) or down as of now, as the registry would.
func (h *harness) setLive(node string, up bool) {
	h.t.Helper()
	h.nodes.update(node, func(n *api.NodeStatus) {
		n.State, n.Connected, n.Stale = api.NodeState_NODE_STATE_DOWN, false, true
		if up {
			n.State, n.Connected, n.Stale = api.NodeState_NODE_STATE_READY, true, false
		}
		n.StateSinceUnixNano = h.clock.now().UnixNano()
	})
}

// loseNode takes node down under the job running on it and on n0, and
// has the survivors on n0 exit: the recovery then decides.
func (h *harness) loseNode(id, node string) {
	h.t.Helper()
	h.setLive(node, false)
	h.nodeDown(node, "no heartbeat for 2.1s")
	h.reconcile()
	for _, r := range findNode(h.job(id), "n0").GetRanks() {
		h.exit(id, "n0", r.GetRank(), -1, "SIGTERM")
	}
	h.reconcile()
}
