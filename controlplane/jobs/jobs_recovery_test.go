package jobs

import (
	"context"
	"math"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/gpuctl/gpuctl/api"
	"github.com/gpuctl/gpuctl/controlplane/nodes"
	"github.com/gpuctl/gpuctl/scheduler"
	"github.com/gpuctl/gpuctl/store"
)

// withRecovery gives the owner a validation command; the fake nodes
// record the cordons recovery makes and mark the nodes cordoned.
func withRecovery(h *harness) {
	h.t.Helper()
	h.m.cfg.ValidateCommand = []string{"/bin/true", "--validate"}
}

// validationGang returns the validation launches among cmds, by node.
func validationGang(cmds []sentCmd) map[string]*api.LaunchRanks {
	out := map[string]*api.LaunchRanks{}
	for _, c := range cmds {
		if l := c.cmd.GetLaunch(); l != nil && strings.Contains(l.GetJob(), "-validate-") {
			out[c.node] = l
		}
	}
	return out
}

// finishGang reports a start and an exit with code for every rank, node by
// node in name order.
func (h *harness) finishGang(gang map[string]*api.LaunchRanks, codes map[string]int32) {
	h.t.Helper()
	names := make([]string, 0, len(gang))
	for node := range gang {
		names = append(names, node)
	}
	slices.Sort(names)
	for _, node := range names {
		l := gang[node]
		pid := uint32(5000 + l.GetRanks()[0].GetRank())
		h.event(node, &api.Event{Kind: api.EventKind_EVENT_KIND_JOB, Job: l.GetJob(), Rank: l.GetRanks()[0].GetRank(), Pid: pid})
		h.event(node, &api.Event{Kind: api.EventKind_EVENT_KIND_PROCESS_EXIT, Job: l.GetJob(), Rank: l.GetRanks()[0].GetRank(), Pid: pid, ExitCode: codes[node]})
	}
}

func (h *harness) recoveryEvents(id string) []string {
	var out []string
	for _, e := range h.jobEvents(id, api.EventKind_EVENT_KIND_RECOVERY) {
		out = append(out, e.GetMessage())
	}
	return out
}

// jobEvents lists the stored events of a kind about the job.
func (h *harness) jobEvents(id string, kind api.EventKind) []*api.Event {
	h.t.Helper()
	evs, err := h.st.Events(store.EventFilter{})
	if err != nil {
		h.t.Fatal(err)
	}
	var out []*api.Event
	for _, e := range evs {
		if e.GetKind() == kind && e.GetJob() == id {
			out = append(out, e)
		}
	}
	return out
}

// rankReports are the rank statuses nodemons report for job's placement.
func rankReports(j *api.Job, step, ckpt int64) []nodes.NodeRanks {
	var out []nodes.NodeRanks
	for _, jn := range j.GetPlacement() {
		nr := nodes.NodeRanks{Node: jn.GetNode()}
		for _, r := range jn.GetRanks() {
			nr.Ranks = append(nr.Ranks, &api.RankStatus{Job: j.GetId(), Attempt: j.GetAttempt(), Rank: r.GetRank(), Pid: r.GetPid(), Step: step, LastCheckpointStep: ckpt})
		}
		out = append(out, nr)
	}
	return out
}

// TestRecoveryReplacesDownNode walks a node failure through every step:
// recovering, survivors stopped, node cordoned, spare validated while its
// GPUs stay held, relaunch from the latest checkpoint with the counters.
func TestRecoveryReplacesDownNode(t *testing.T) {
	h := newHarness(t, "fifo", readyNode("n0", 4, "r0", "s0"), readyNode("n1", 4, "r0", "s0"), readyNode("n2", 4, "r0", "s0"))
	withRecovery(h)
	ckpt := filepath.Join(h.ckpt, "ring")
	id := h.submit(ringSpec("ring", 2, 4, "restart_policy: replace-node\ncheckpoint: {dir: "+ckpt+", interval: 1h}\n"), false)
	h.reconcile()
	h.started(id)
	if got := nodesOf(h.job(id)); !slices.Equal(got, []string{"n0", "n1"}) {
		t.Fatalf("placed on %v", got)
	}
	// Ranks report step 13 with checkpoint 10 complete on every rank.
	h.nodes.setRanks(rankReports(h.job(id), 13, 10))
	h.reconcile()
	h.nodes.setRanks(nil)
	if j := h.job(id); j.GetStep() != 13 || j.GetLastCheckpointStep() != 10 || !slices.Equal(j.GetCheckpointSteps(), []int64{10}) {
		t.Fatalf("step %d checkpoint %d (%v), want 13 and 10 from rank status", j.GetStep(), j.GetLastCheckpointStep(), j.GetCheckpointSteps())
	}
	h.nodes.take()
	failedAt := h.clock.now()

	h.nodes.update("n1", func(n *api.NodeStatus) {
		n.State, n.Connected, n.Stale = api.NodeState_NODE_STATE_DOWN, false, true
	})
	h.nodeDown("n1", "no heartbeat for 2.1s")
	j := h.job(id)
	// The lost node is avoided by this recovery and left to its
	// suspicion, not excluded from the job for good.
	if j.GetState() != api.JobState_JOB_STATE_RECOVERING || len(j.GetExclude()) != 0 {
		t.Fatalf("state %s exclude %v (%s)", stateName(j.GetState()), j.GetExclude(), j.GetReason())
	}
	// A job waiting for GPUs must not get the spare while it is checked.
	other := h.submit(ringSpec("other", 1, 4, ""), false)

	h.reconcile()
	cmds := h.nodes.take()
	if got := signals(cmds); !slices.Equal(got, []string{"n0:SIGTERM"}) {
		t.Errorf("signals %v, want SIGTERM to the survivors on n0 only", got)
	}
	if len(launches(cmds)) != 0 {
		t.Fatalf("launched %v before the old ranks exited", launches(cmds))
	}
	if got := h.nodes.cordoned(); !slices.Equal(got, []string{"n1"}) {
		t.Errorf("cordoned %v, want n1", got)
	}
	h.clock.add(2 * time.Second)
	for _, r := range findNode(h.job(id), "n0").GetRanks() {
		h.exit(id, "n0", r.GetRank(), -1, "SIGTERM")
	}
	h.reconcile()
	cmds = h.nodes.take()
	gang := validationGang(cmds)
	if len(gang) != 2 || gang["n0"] == nil || gang["n2"] == nil {
		t.Fatalf("validation gang %v, want one rank on n0 and n2", gang)
	}
	for _, l := range gang {
		if l.GetJob() != id+"-validate-2" || l.GetWorldSize() != 2 || !slices.Equal(l.GetCommand(), []string{"/bin/true", "--validate"}) {
			t.Errorf("validation launch %v", l)
		}
	}
	if h.job(id).GetState() != api.JobState_JOB_STATE_RECOVERING || h.job(other).GetState() != api.JobState_JOB_STATE_PENDING {
		t.Fatalf("while validating: job %s, other %s", stateName(h.job(id).GetState()), stateName(h.job(other).GetState()))
	}
	h.clock.add(time.Second)
	h.finishGang(gang, nil)
	h.reconcile()
	cmds = launches(h.nodes.take())
	if len(cmds) != 2 || cmds[0].node != "n0" || cmds[1].node != "n2" {
		t.Fatalf("relaunch on %v", cmds)
	}
	for _, c := range cmds {
		l := c.cmd.GetLaunch()
		if l.GetAttempt() != 2 || l.GetResumeStep() != 10 {
			t.Errorf("launch on %s: attempt %d resume %d, want 2 from step 10", c.node, l.GetAttempt(), l.GetResumeStep())
		}
		// Persisted before it went out, with every old rank gone.
		if c.stored.GetAttempt() != 2 || c.stored.GetState() != api.JobState_JOB_STATE_RUNNING {
			t.Errorf("store held attempt %d %s at launch", c.stored.GetAttempt(), stateName(c.stored.GetState()))
		}
	}
	j = h.job(id)
	if j.GetRestarts() != 1 || j.GetLostSteps() != 3 || j.GetStep() != 10 {
		t.Errorf("restarts %d lost %d step %d, want 1, 3, 10", j.GetRestarts(), j.GetLostSteps(), j.GetStep())
	}
	if want := h.clock.now().Sub(failedAt).Seconds(); math.Abs(j.GetDowntimeSeconds()-want) > 0.01 {
		t.Errorf("downtime %.2fs, want %.2fs", j.GetDowntimeSeconds(), want)
	}
	if n := len(j.GetAttempts()); n != 2 || j.GetAttempts()[0].GetLostSteps() != 3 || j.GetAttempts()[0].GetEndUnixNano() == 0 ||
		!slices.Equal(j.GetAttempts()[1].GetNodes(), []string{"n0", "n2"}) {
		t.Errorf("attempts %v, want the first ended with 3 steps lost and the second on n0,n2", j.GetAttempts())
	}
	evs := strings.Join(h.recoveryEvents(id), "\n")
	for _, want := range []string{"failure detected (last reported step 13): node n1 went down", "cordoned n1", "every rank of attempt 1 has exited",
		"decided to replace nodes", "validation " + id + "-validate-2 passed", "attempt 2 running on n0,n2 from step 10 (3 steps lost"} {
		if !strings.Contains(evs, want) {
			t.Errorf("no recovery event says %q in:\n%s", want, evs)
		}
	}
}

func findNode(j *api.Job, node string) *api.JobNode {
	for _, jn := range j.GetPlacement() {
		if jn.GetNode() == node {
			return jn
		}
	}
	return nil
}

// TestRecoveryFailedValidationCordonsSpare: a spare whose validation rank
// fails is cordoned and the next one is tried.
func TestRecoveryFailedValidationCordonsSpare(t *testing.T) {
	h := newHarness(t, "fifo", readyNode("n0", 4, "r0", "s0"), readyNode("n1", 4, "r0", "s0"),
		readyNode("n2", 4, "r0", "s0"), readyNode("n3", 4, "r1", "s0"))
	withRecovery(h)
	id := h.submit(ringSpec("ring", 2, 4, "restart_policy: replace-node\n"), false)
	h.reconcile()
	h.started(id)
	h.event("n1", &api.Event{Kind: api.EventKind_EVENT_KIND_XID, Xid: 79, XidClass: api.XIDClass_XID_CLASS_REBOOT_NODE, GpuIndex: 2, Message: "XID 79"})
	if j := h.job(id); j.GetState() != api.JobState_JOB_STATE_RECOVERING || !strings.Contains(j.GetReason(), "GPU 2 of n1 faulted") {
		t.Fatalf("after XID 79: %s (%s)", stateName(j.GetState()), j.GetReason())
	}
	h.reconcile()
	h.nodes.take()
	h.exitAll(id, -1)
	h.reconcile()
	gang := validationGang(h.nodes.take())
	if gang["n2"] == nil {
		t.Fatalf("first validation on %v, want n2", gang)
	}
	h.finishGang(gang, map[string]int32{"n2": 1, "n0": 1})
	h.reconcile()
	cmds := h.nodes.take()
	if got := h.nodes.cordoned(); !slices.Equal(got, []string{"n1", "n2"}) {
		t.Errorf("cordoned %v, want the faulted n1 then the failing spare n2", got)
	}
	if got := signals(cmds); !slices.Contains(got, "n2:SIGKILL") {
		t.Errorf("signals %v: the failed gang must be killed", got)
	}
	h.reconcile()
	gang = validationGang(append(cmds, h.nodes.take()...))
	if gang["n3"] == nil || gang["n3"].GetJob() != id+"-validate-2.2" {
		t.Fatalf("second validation %v, want n3 as %s-validate-2.2", gang, id)
	}
	h.finishGang(gang, nil)
	h.reconcile()
	if j := h.job(id); j.GetState() != api.JobState_JOB_STATE_RUNNING || !slices.Equal(nodesOf(j), []string{"n0", "n3"}) {
		t.Fatalf("after the second validation: %s on %v (%s)", stateName(j.GetState()), nodesOf(j), j.GetReason())
	}
}

// TestRecoveryInPlaceThenMaxRestarts: a crash on healthy nodes restarts
// on the same GPUs without validation; the restart bound ends it.
func TestRecoveryInPlaceThenMaxRestarts(t *testing.T) {
	h := newHarness(t, "fifo", threeNodes()...)
	withRecovery(h)
	id := h.submit(ringSpec("ring", 2, 2, "max_restarts: 1\n"), false)
	h.reconcile()
	h.started(id)
	before := h.job(id).GetPlacement()
	h.exit(id, "n1", 3, 1, "")
	h.reconcile()
	h.nodes.take()
	// The last exit's own pass relaunches: no periodic pass is needed.
	h.exitAll(id, -1)
	h.reconcile()
	cmds := h.nodes.take()
	if len(validationGang(cmds)) != 0 {
		t.Errorf("validated nodes the job already ran on")
	}
	j := h.job(id)
	if j.GetState() != api.JobState_JOB_STATE_RUNNING || j.GetAttempt() != 2 || j.GetRestarts() != 1 || len(launches(cmds)) != 2 {
		t.Fatalf("after the crash: %s attempt %d restarts %d, %d launches", stateName(j.GetState()), j.GetAttempt(), j.GetRestarts(), len(launches(cmds)))
	}
	for i, jn := range j.GetPlacement() {
		if !slices.Equal(jn.GetGpus(), before[i].GetGpus()) || jn.GetNode() != before[i].GetNode() {
			t.Errorf("moved: %v → %v", before[i], jn)
		}
	}
	h.started(id)
	h.exit(id, "n0", 0, 1, "")
	j = h.job(id)
	if j.GetState() != api.JobState_JOB_STATE_FAILED || !strings.Contains(j.GetReason(), "max_restarts 1 reached") {
		t.Fatalf("second crash: %s (%s)", stateName(j.GetState()), j.GetReason())
	}
}

// TestServerRestartKeepsRunningJobs: a restarted owner keeps running jobs
// running while their nodes reconnect, and only a node that stays away
// past its grace counts as down.
func TestServerRestartKeepsRunningJobs(t *testing.T) {
	for _, back := range []bool{true, false} {
		name := map[bool]string{true: "node returns", false: "node never returns"}[back]
		t.Run(name, func(t *testing.T) {
			h := newHarness(t, "fifo", threeNodes()...)
			id := h.submit(ringSpec("ring", 2, 2, "restart_policy: none\n"), false)
			h.reconcile()
			h.started(id)
			// A restarted registry starts every node down and stale until
			// it reconnects.
			for _, name := range []string{"n0", "n1", "n2"} {
				h.nodes.update(name, func(n *api.NodeStatus) {
					n.Connected, n.State, n.Stale = false, api.NodeState_NODE_STATE_DOWN, true
					n.DownReason = "not reconnected since the server started"
					n.Registration.HeartbeatIntervalMs = 500
				})
			}
			h.restart("fifo")
			h.nodes.take()
			// A nodemon whose attempt stalled with the old server and whose
			// pause is the longest comes back just inside the bound.
			bound := ReconnectBound(500*time.Millisecond, DefaultReconnectGrace)
			h.clock.add(bound - time.Second)
			h.reconcile()
			if j := h.job(id); j.GetState() != api.JobState_JOB_STATE_RUNNING || liveRanks(j) != 4 {
				t.Fatalf("within the grace: %s, %d live ranks", stateName(j.GetState()), liveRanks(j))
			}
			if back {
				// Each node registers again, reporting the ranks it runs.
				for _, jn := range h.job(id).GetPlacement() {
					h.nodes.update(jn.GetNode(), func(n *api.NodeStatus) {
						n.Connected, n.State, n.Stale, n.DownReason = true, api.NodeState_NODE_STATE_READY, false, ""
					})
					reg := &api.NodeRegistration{Name: jn.GetNode(), HeartbeatIntervalMs: 500}
					for _, r := range jn.GetRanks() {
						reg.Running = append(reg.Running, &api.RankStatus{Job: id, Attempt: 1, Rank: r.GetRank(), Pid: r.GetPid()})
					}
					h.nodeUp(jn.GetNode(), reg)
				}
				h.nodes.update("n2", func(n *api.NodeStatus) {
					n.Connected, n.State, n.Stale, n.DownReason = true, api.NodeState_NODE_STATE_READY, false, ""
				})
			}
			h.clock.add(2 * time.Second)
			h.reconcile()
			j := h.job(id)
			if back {
				if j.GetState() != api.JobState_JOB_STATE_RUNNING || liveRanks(j) != 4 || len(h.nodes.take()) != 0 {
					t.Fatalf("after reconnecting: %s (%s)", stateName(j.GetState()), j.GetReason())
				}
				return
			}
			if j.GetState() != api.JobState_JOB_STATE_FAILED || !strings.Contains(j.GetReason(), "not reconnected within 16s") {
				t.Fatalf("past the bound (2 × 500ms + 15s): %s (%s)", stateName(j.GetState()), j.GetReason())
			}
		})
	}
}

// TestDisconnectedButUpIsNotLost: a node the registry holds up while it
// reconnects (its connection closed under a server that stood still for
// minutes) is not failed by the owner's reconnect clock, however long ago
// it was last seen: the registry's detector judges it.
func TestDisconnectedButUpIsNotLost(t *testing.T) {
	h := newHarness(t, "fifo", threeNodes()...)
	id := h.submit(ringSpec("ring", 2, 2, "restart_policy: none\n"), false)
	h.reconcile()
	h.started(id)
	h.clock.add(10 * time.Minute)
	for _, jn := range h.job(id).GetPlacement() {
		h.nodes.update(jn.GetNode(), func(n *api.NodeStatus) {
			n.Connected = false
			n.Registration.HeartbeatIntervalMs = 500
		})
	}
	h.reconcile()
	if j := h.job(id); j.GetState() != api.JobState_JOB_STATE_RUNNING || liveRanks(j) != 4 {
		t.Fatalf("up but disconnected for a moment after a long pause: %s (%s)", stateName(j.GetState()), j.GetReason())
	}
}

// TestOperatorRestartAndCheckpoint: gpuctl checkpoint signals every rank;
// gpuctl restart --exclude --from-checkpoint relaunches elsewhere from a
// step the nodes reported, even past max_restarts, and the job's
// checkpoints then continue from that step.
func TestOperatorRestartAndCheckpoint(t *testing.T) {
	h := newHarness(t, "fifo", threeNodes()...)
	ckpt := filepath.Join(h.ckpt, "ring")
	id := h.submit(ringSpec("ring", 1, 4, "restart_policy: none\ncheckpoint: {dir: "+ckpt+"}\n"), false)
	h.reconcile()
	h.started(id)
	h.nodes.take()
	on := nodesOf(h.job(id))[0]
	if _, err := h.checkpointJob(id); err != nil {
		t.Fatal(err)
	}
	if got := signals(h.nodes.take()); !slices.Equal(got, []string{on + ":SIGUSR1"}) {
		t.Errorf("checkpoint sent %v", got)
	}
	// Only a checkpoint the nodes reported can be restarted from.
	if _, err := h.restartJob(id, "7", []string{on}, "ops"); err == nil || !strings.Contains(err.Error(), "no checkpoint of step 7 was reported") ||
		!strings.Contains(err.Error(), "reported: none yet") {
		t.Fatalf("restart from a step never reported: %v", err)
	}
	h.checkpointed(id, 7)
	h.checkpointed(id, 20)
	if j := h.job(id); j.GetLastCheckpointStep() != 20 || !slices.Equal(j.GetCheckpointSteps(), []int64{7, 20}) {
		t.Fatalf("reported checkpoints: latest %d, steps %v; want 20 and [7 20]", j.GetLastCheckpointStep(), j.GetCheckpointSteps())
	}
	for _, bad := range []struct{ from, exclude, want string }{
		{"9", "", "no checkpoint of step 9 was reported for job " + id + " (reported: 7, 20)"},
		{"sometime", "", "give latest or a step number"},
		{"latest", "n9", "--exclude n9: unknown node"},
	} {
		var ex []string
		if bad.exclude != "" {
			ex = []string{bad.exclude}
		}
		if _, err := h.restartJob(id, bad.from, ex, "ops"); err == nil || !strings.Contains(err.Error(), bad.want) {
			t.Errorf("restart %q %v: %v, want %q", bad.from, ex, err, bad.want)
		}
	}
	// A restart nowhere to go is refused before any rank is touched.
	all := []string{"n0", "n1", "n2"}
	if _, err := h.restartJob(id, "latest", all, "ops"); err == nil || !strings.Contains(err.Error(), "refused") {
		t.Fatalf("restart excluding every node: %v, want it refused", err)
	}
	if j := h.job(id); j.GetState() != api.JobState_JOB_STATE_RUNNING {
		t.Fatalf("after a refused restart the job is %s (%s), want it left running", stateName(j.GetState()), j.GetReason())
	}
	if got := signals(h.nodes.take()); len(got) != 0 {
		t.Fatalf("a refused restart signalled ranks: %v", got)
	}
	j, err := h.restartJob(id, "7", []string{on}, "ops")
	if err != nil || j.GetState() != api.JobState_JOB_STATE_RECOVERING {
		t.Fatalf("restart: %v %v", j.GetState(), err)
	}
	h.reconcile()
	h.nodes.take()
	h.exitAll(id, -1)
	h.reconcile()
	cmds := launches(h.nodes.take())
	if len(cmds) != 1 || cmds[0].node == on || cmds[0].cmd.GetLaunch().GetResumeStep() != 7 {
		t.Fatalf("relaunch %v, want one node other than %s resuming from 7", cmds, on)
	}
	// The run resumed from step 7 writes its checkpoints anew: the ones
	// after 7 belonged to the abandoned run, and the next one it reports
	// is the latest.
	if j := h.job(id); j.GetLastCheckpointStep() != 7 || !slices.Equal(j.GetCheckpointSteps(), []int64{7}) {
		t.Errorf("after resuming from 7: latest checkpoint %d, steps %v; want 7 and [7]", j.GetLastCheckpointStep(), j.GetCheckpointSteps())
	}
	h.started(id)
	h.checkpointed(id, 10)
	if j := h.job(id); j.GetLastCheckpointStep() != 10 || !slices.Equal(j.GetCheckpointSteps(), []int64{7, 10}) {
		t.Errorf("checkpoint 10 of the resumed run: latest %d, steps %v; want 10 and [7 10]", j.GetLastCheckpointStep(), j.GetCheckpointSteps())
	}
	if _, err := h.restartJob("nope", "", nil, "ops"); err == nil {
		t.Error("restart of an unknown job succeeded")
	}
}

// TestStallAutoRecovery: a stall on a job with stall_recovery auto
// restarts it without the lagging node; manual only reports.
func TestStallAutoRecovery(t *testing.T) {
	for _, mode := range []string{"auto", "manual"} {
		t.Run(mode, func(t *testing.T) {
			h := newHarness(t, "fifo", threeNodes()...)
			withRecovery(h)
			id := h.submit(ringSpec("ring", 2, 2, "restart_policy: replace-node\nstall_recovery: "+mode+"\n"), false)
			h.reconcile()
			h.started(id)
			st := &api.Stall{Job: id, Comm: 0xabc, Diagnosis: "rank 3 stopped (T)",
				LaggingRanks: []*api.StalledRank{{Rank: 3, Node: "n1", ProcState: "T"}}}
			if _, err := h.call(func(ctx context.Context) (any, error) {
				return nil, h.m.Stalls(ctx, []*api.Stall{st}, map[string]bool{id: true}, nil, nil)
			}); err != nil {
				t.Fatal(err)
			}
			j := h.job(id)
			if mode == "manual" {
				if j.GetState() != api.JobState_JOB_STATE_RUNNING || !j.GetStalled() {
					t.Fatalf("manual stall recovery: %s stalled %v, want running and marked stalled", stateName(j.GetState()), j.GetStalled())
				}
				if evs := h.recoveryEvents(id); len(evs) != 1 || !strings.Contains(evs[0], "gpuctl restart "+id+" --exclude NODE") {
					t.Errorf("events %v", evs)
				}
				return
			}
			if j.GetState() != api.JobState_JOB_STATE_RECOVERING || !slices.Equal(j.GetExclude(), []string{"n1"}) {
				t.Fatalf("auto: %s exclude %v", stateName(j.GetState()), j.GetExclude())
			}
		})
	}
}

// TestJobCounters: energy from NVML counter deltas of the job's GPUs,
// checkpoint seconds from CHECKPOINT events, useful time and goodput from
// step progress, and the advised interval.
func TestJobCounters(t *testing.T) {
	h := newHarness(t, "fifo", readyNode("n0", 2, "r0", "s0"))
	// The submit's own pass starts the job; the clock stays where it was,
	// so that no running time passes before the ranks report.
	r, err := h.submitReq(&api.SubmitJobRequest{SpecYaml: ringSpec("ring", 1, 2, ""), Source: "test.yaml"})
	if err != nil {
		t.Fatal(err)
	}
	id := r.GetJob().GetId()
	h.reconcile()
	h.started(id)
	steps := func(step int64) {
		h.nodes.setRanks([]nodes.NodeRanks{{Node: "n0", Ranks: []*api.RankStatus{
			{Job: id, Attempt: 1, Rank: 0, Step: step}, {Job: id, Attempt: 1, Rank: 1, Step: step}}}})
	}
	energy := func(mj uint64) {
		h.nodes.update("n0", func(n *api.NodeStatus) {
			for _, g := range n.Gpus {
				g.Last = &api.GPUSample{EnergyMj: mj}
			}
		})
	}
	steps(0)
	energy(1_000_000)
	h.reconcile()
	h.clock.add(10 * time.Second)
	steps(5)
	energy(3_000_000)
	h.reconcile()
	h.clock.add(10 * time.Second)
	h.reconcile() // no progress: not useful
	for r := int32(0); r < 2; r++ {
		h.event("n0", &api.Event{Kind: api.EventKind_EVENT_KIND_CHECKPOINT, Job: id, Rank: r, Pid: 1000 + uint32(r), Step: 5, Seconds: 2 + float64(r)})
	}
	j := h.job(id)
	if j.GetEnergyJoules() != 4000 {
		t.Errorf("energy %g J, want 2 GPUs × 2000 J", j.GetEnergyJoules())
	}
	if j.GetUsefulSeconds() != 10 || math.Abs(j.GetGoodput()-0.5) > 1e-9 {
		t.Errorf("useful %gs goodput %g, want 10 s and 0.5", j.GetUsefulSeconds(), j.GetGoodput())
	}
	if j.GetCheckpointSeconds() != 2.5 || j.GetCheckpoints() != 2 || j.GetLastCheckpointStep() != 5 {
		t.Errorf("checkpoint %gs × %d at step %d", j.GetCheckpointSeconds(), j.GetCheckpoints(), j.GetLastCheckpointStep())
	}
	h.reconcile()
	mtbf := float64(scheduler.PriorGPUMTBFSeconds) / 2
	if got := h.job(id).GetAdvisedCheckpointIntervalSeconds(); math.Abs(got-math.Sqrt(2*2.5*mtbf)) > 1 {
		t.Errorf("advised %gs, want sqrt(2·2.5·%g)", got, mtbf)
	}
}
