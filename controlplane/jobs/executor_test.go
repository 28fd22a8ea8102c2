package jobs

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"

	"google.golang.org/protobuf/proto"

	"github.com/gpuctl/gpuctl/api"
	"github.com/gpuctl/gpuctl/scheduler"
)

// fakeExecutor records what the owner asks of an executor (Slurm).
type fakeExecutor struct {
	mu       sync.Mutex
	launched []AttemptLaunch
	signals  []string
	refuse   error
	// refuseOn, when set, refuses on one node and not-starts the others.
	refuseOn string
}

func (f *fakeExecutor) Launch(_ context.Context, a AttemptLaunch) map[string]error {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.launched = append(f.launched, a)
	if f.refuse != nil && (f.refuseOn == "" || slices.Contains(a.Nodes, f.refuseOn)) {
		errs := map[string]error{}
		for _, n := range a.Nodes {
			errs[n] = f.refuse
			if f.refuseOn != "" && n != f.refuseOn {
				errs[n] = ErrNotStarted
			}
		}
		return errs
	}
	return nil
}

func (f *fakeExecutor) Signal(_ context.Context, job string, attempt uint32, nodes []string, sig string) map[string]error {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.signals = append(f.signals, sig)
	return nil
}

func withExecutor(h *harness) *fakeExecutor {
	fx := &fakeExecutor{}
	h.m.cfg.Executor, h.m.disp.exec = fx, fx
	return fx
}

// TestExecutorRunsTheOwnersPlan: with an executor, the owner's placement
// goes to it whole (nodes in rank order, each node's ranks), nodemon gets
// no launch or signal, a checkpoint is a signal to the executor, and a
// failure the executor reports makes the job recover without the node.
func TestExecutorRunsTheOwnersPlan(t *testing.T) {
	h := newHarness(t, scheduler.DefaultPolicy, threeNodes()...)
	fx := withExecutor(h)
	// nodemon would launch a validation gang outside Slurm's allocation.
	h.m.cfg.ValidateCommand = []string{"/bin/true"}
	id := h.submit(ringSpec("ring", 2, 2, "checkpoint: {dir: /tmp/ck, interval: 1h}\nrestart_policy: replace-node\n"), false)
	h.reconcile()
	j := h.job(id)
	if len(fx.launched) != 1 {
		t.Fatalf("%d executor launches, want 1", len(fx.launched))
	}
	a := fx.launched[0]
	if a.Job != id || a.Attempt != 1 || !slices.Equal(a.Nodes, nodesOf(j)) || len(a.Ranks) != 2 {
		t.Fatalf("launch %+v for placement %v", a, nodesOf(j))
	}
	for i, n := range a.Nodes {
		if l := a.Ranks[n]; l.GetNodeRank() != int32(i) || len(l.GetRanks()) != 2 || l.GetRanks()[0].GetRank() != int32(2*i) {
			t.Errorf("node %s (rank order %d): launch %v", n, i, l)
		}
	}
	if cmds := h.nodes.take(); len(launches(cmds)) != 0 || len(signals(cmds)) != 0 {
		t.Fatalf("nodemon got commands: %v", cmds)
	}
	h.started(id)
	if _, err := h.checkpointJob(id); err != nil {
		t.Fatal(err)
	}
	h.settle()
	if !slices.Equal(fx.signals, []string{"SIGUSR1"}) {
		t.Fatalf("executor signals %v, want SIGUSR1", fx.signals)
	}
	lost := a.Nodes[1]
	h.m.ExecutorFailed(id, 1, []string{lost}, "Slurm: "+lost+" is down (test)")
	h.settle()
	j = h.job(id)
	if j.GetState() != api.JobState_JOB_STATE_RECOVERING || !strings.Contains(j.GetReason(), "Slurm: "+lost) || !slices.Contains(j.GetExclude(), lost) {
		t.Fatalf("after the executor's failure: %s %q exclude %v", stateName(j.GetState()), j.GetReason(), j.GetExclude())
	}
	if !slices.Contains(fx.signals, "SIGTERM") {
		t.Errorf("survivors not stopped through the executor: %v", fx.signals)
	}
	for _, jn := range j.GetPlacement() {
		for _, r := range jn.GetRanks() {
			h.exit(id, jn.GetNode(), r.GetRank(), 0, "SIGTERM")
		}
	}
	h.reconcile()
	j = h.job(id)
	if j.GetState() != api.JobState_JOB_STATE_RUNNING || j.GetAttempt() != 2 || len(fx.launched) != 2 || slices.Contains(fx.launched[1].Nodes, lost) ||
		!slices.Contains(fx.launched[1].Exclude, lost) {
		t.Fatalf("after recovery: %s attempt %d, launches %+v", stateName(j.GetState()), j.GetAttempt(), fx.launched)
	}
	if cmds := h.nodes.take(); len(launches(cmds)) != 0 {
		t.Fatalf("nodemon got launches (a validation gang?): %v", launches(cmds))
	}
	// A report for an attempt that is no longer current changes nothing.
	h.m.ExecutorFailed(id, 1, []string{a.Nodes[0]}, "stale")
	h.settle()
	if j2 := h.job(id); slices.Contains(j2.GetExclude(), a.Nodes[0]) {
		t.Errorf("a stale report excluded %s", a.Nodes[0])
	}
}

// TestExecutorEarlyEnd: a batch that ended before any rank started (no
// nodes to blame) fails the job with the executor's reason.
func TestExecutorEarlyEnd(t *testing.T) {
	h := newHarness(t, scheduler.DefaultPolicy, threeNodes()...)
	withExecutor(h)
	id := h.submit(ringSpec("ring", 1, 2, ""), false)
	h.reconcile()
	h.m.ExecutorFailed(id, 1, nil, "Slurm job 6 ended (FAILED) before any rank started")
	h.settle()
	if j := h.job(id); j.GetState() != api.JobState_JOB_STATE_FAILED || !strings.Contains(j.GetReason(), "Slurm job 6 ended") {
		t.Fatalf("%s %q", stateName(j.GetState()), j.GetReason())
	}
	if c := h.nodes.cordoned(); len(c) != 0 {
		t.Errorf("nodes cordoned for the job's own fault: %v", c)
	}
}

// TestExternalJobsListed: the executor's own jobs (plain sbatch) are
// listed and found like the owner's, never scheduled, and replaced as a
// whole on each report.
func TestExternalJobsListed(t *testing.T) {
	h := newHarness(t, scheduler.DefaultPolicy, threeNodes()...)
	withExecutor(h)
	ext := &api.Job{Id: "slurm-7", Name: "plain", State: api.JobState_JOB_STATE_RUNNING,
		Placement: []*api.JobNode{{Node: "n2", Gpus: []uint32{0, 1}, Ranks: []*api.JobRank{{Rank: 0, Pid: 99}}}}}
	h.m.ExternalJobs([]*api.Job{ext})
	h.reconcile()
	busy := func() []int {
		var out []int
		for _, n := range h.m.placer.snapshot(h.clock.now()).Nodes {
			for _, g := range n.GPUs {
				if n.Name == "n2" && g.Job == "slurm-7" {
					out = append(out, g.Index)
				}
			}
		}
		return out
	}
	if got := busy(); !slices.Equal(got, []int{0, 1}) {
		t.Errorf("GPUs of n2 Slurm gave the plain job, as the scheduler sees them: %v, want 0, 1", got)
	}
	done := proto.Clone(ext).(*api.Job)
	done.State = api.JobState_JOB_STATE_SUCCEEDED
	h.m.ExternalJobs([]*api.Job{done})
	h.settle()
	if got := busy(); len(got) != 0 {
		t.Errorf("an ended plain job still holds GPUs %v", got)
	}
	h.m.ExternalJobs([]*api.Job{ext})
	h.settle()
	if j, err := h.m.Lookup("plain"); err != nil || j.GetId() != "slurm-7" || j.GetState() != api.JobState_JOB_STATE_RUNNING {
		t.Fatalf("lookup plain: %v %v", j, err)
	}
	if all, _ := h.m.List(""); len(all) != 1 {
		t.Fatalf("%d jobs listed, want 1", len(all))
	}
	h.m.ExternalJobs(nil)
	h.settle()
	if _, err := h.m.Lookup("slurm-7"); err == nil {
		t.Fatal("an external job Slurm no longer lists is still listed")
	}
}

// TestExecutorUnavailableRequeues: a launch the executor could not make
// (Slurm's controller down) blames neither nodes nor job: the attempt goes
// back to the queue with why, and starts once the executor answers.
func TestExecutorUnavailableRequeues(t *testing.T) {
	h := newHarness(t, scheduler.DefaultPolicy, threeNodes()...)
	fx := withExecutor(h)
	fx.refuse = fmt.Errorf("sbatch: slurmctld is not answering (%w)", ErrExecutorUnavailable)
	id := h.submit(ringSpec("ring", 2, 2, ""), false)
	h.reconcile()
	j := h.job(id)
	if j.GetState() != api.JobState_JOB_STATE_PENDING || !strings.Contains(j.GetReason(), "slurmctld is not answering") || j.GetPreemptions() != 0 {
		t.Fatalf("after an unavailable executor: %s %q preemptions %d", stateName(j.GetState()), j.GetReason(), j.GetPreemptions())
	}
	if c := h.nodes.cordoned(); len(c) != 0 {
		t.Fatalf("nodes cordoned for the executor's outage: %v", c)
	}
	if j.GetPendingReason() == "" || !strings.Contains(j.GetPendingReason(), "tried again at") {
		t.Errorf("pending reason %q", j.GetPendingReason())
	}
	fx.mu.Lock()
	fx.refuse = nil
	fx.mu.Unlock()
	h.reconcile()
	if j := h.job(id); j.GetState() != api.JobState_JOB_STATE_PENDING {
		t.Fatalf("tried again before its backoff: %s", stateName(j.GetState()))
	}
	h.clock.add(ExecutorRetry)
	h.reconcile()
	if j := h.job(id); j.GetState() != api.JobState_JOB_STATE_RUNNING || j.GetAttempt() != 2 || len(fx.launched) != 2 {
		t.Fatalf("once the executor answers: %s attempt %d, %d launches", stateName(j.GetState()), j.GetAttempt(), len(fx.launched))
	}
}

// TestExecutorRefusesOneNode: an attempt the executor refuses because one
// node is down (Slurm has it down) blames that node only.
func TestExecutorRefusesOneNode(t *testing.T) {
	h := newHarness(t, scheduler.DefaultPolicy, threeNodes()...)
	fx := withExecutor(h)
	fx.refuse, fx.refuseOn = fmt.Errorf("not submitted to Slurm: Slurm: n1 is down (test)"), "n1"
	id := h.submit(ringSpec("ring", 2, 2, "restart_policy: replace-node\n"), false)
	h.reconcile()
	// Refused on n0,n1 for n1 alone, then started on n0,n2.
	j := h.job(id)
	if j.GetState() != api.JobState_JOB_STATE_RUNNING || j.GetAttempt() != 2 || !slices.Equal(j.GetExclude(), []string{"n1"}) || !slices.Equal(nodesOf(j), []string{"n0", "n2"}) {
		t.Fatalf("%s attempt %d on %v, %q exclude %v", stateName(j.GetState()), j.GetAttempt(), nodesOf(j), j.GetReason(), j.GetExclude())
	}
	if c := h.nodes.cordoned(); !slices.Equal(c, []string{"n1"}) {
		t.Errorf("cordoned %v, want n1 only", c)
	}
}
