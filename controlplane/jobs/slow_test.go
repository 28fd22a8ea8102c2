package jobs

import (
	"context"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/gpuctl/gpuctl/api"
	"github.com/gpuctl/gpuctl/scheduler"
	"github.com/gpuctl/gpuctl/scheduler/failslow"
)

// slowPass hands the owner a detector pass whose only news is the
// fail-slow findings standing now.
func (h *harness) slowPass(fs ...failslow.Finding) {
	h.t.Helper()
	if _, err := h.call(func(ctx context.Context) (any, error) {
		return nil, h.m.Stalls(ctx, nil, map[string]bool{}, nil, fs)
	}); err != nil {
		h.t.Fatal(err)
	}
}

// slowActions lists the actions the owner announced on the job's
// fail-slow findings (attrs.action of its SLOW events).
func (h *harness) slowActions(id string) []string {
	var out []string
	for _, e := range h.jobEvents(id, api.EventKind_EVENT_KIND_SLOW) {
		if a := e.GetAttrs()["action"]; a != "" {
			out = append(out, a)
		}
	}
	return out
}

// slowRank is a compute-slow finding of the job's rank on node.
func slowRank(t *testing.T, j *api.Job, node string) failslow.Finding {
	t.Helper()
	for _, jn := range j.GetPlacement() {
		if jn.GetNode() == node {
			return failslow.Finding{Job: j.GetId(), Class: failslow.ComputeSlow, Rank: jn.GetRanks()[0].GetRank(), Node: node, Comm: 0, Evidence: "SM clock 0.70 of the median"}
		}
	}
	t.Fatalf("job %s has no rank on %s (placement %v)", j.GetId(), node, j.GetPlacement())
	return failslow.Finding{}
}

// TestSlowAutoRecovery: a job with slow_recovery auto is restarted
// without its slow node once the finding has stood for the hold, on the
// spare; the bound then keeps a second finding to an alert, and with no
// spare a finding is never acted on. slow_recovery alert never acts.
func TestSlowAutoRecovery(t *testing.T) {
	rule := scheduler.SlowRule{Hold: time.Minute, Max: 1, Window: time.Hour}
	t.Run("auto", func(t *testing.T) {
		h := newHarness(t, "fifo", threeNodes()...)
		h.m.cfg.SlowRule = rule
		id := h.submit(ringSpec("ring", 2, 2, "restart_policy: replace-node\nslow_recovery: auto\n"), false)
		h.reconcile()
		h.started(id)
		h.nodes.take()
		old := h.job(id)
		slow := old.GetPlacement()[1].GetNode()
		f := slowRank(t, old, slow)
		h.slowPass(f)
		h.clock.add(59 * time.Second)
		h.slowPass(f)
		if j := h.job(id); j.GetState() != api.JobState_JOB_STATE_RUNNING || len(h.slowActions(id)) != 0 {
			t.Fatalf("inside the hold: %s, actions %v; want running, none", stateName(j.GetState()), h.slowActions(id))
		}
		// Past the hold it first asks for a checkpoint, and runs on.
		h.clock.add(time.Second)
		h.slowPass(f)
		if got := signals(h.nodes.take()); len(got) != 2 || !strings.HasSuffix(got[0], ":SIGUSR1") || h.job(id).GetState() != api.JobState_JOB_STATE_RUNNING {
			t.Fatalf("after the hold: signals %v, %s; want SIGUSR1 to both nodes, running", got, stateName(h.job(id).GetState()))
		}
		h.clock.add(10 * time.Second)
		h.slowPass(f)
		if j := h.job(id); j.GetState() != api.JobState_JOB_STATE_RUNNING {
			t.Fatalf("waiting for the checkpoint: %s", stateName(j.GetState()))
		}
		// The checkpoint is reported: the restart goes ahead from it.
		h.checkpointed(id, 7)
		h.slowPass(f)
		j := h.job(id)
		if j.GetState() != api.JobState_JOB_STATE_RECOVERING || !slices.Equal(j.GetExclude(), []string{slow}) ||
			len(j.GetSlowExclusionsUnixNano()) != 1 || !slices.Equal(h.slowActions(id), []string{"exclude"}) {
			t.Fatalf("after the hold: %s exclude %v, exclusions %v, actions %v; want recovering without %s",
				stateName(j.GetState()), j.GetExclude(), j.GetSlowExclusionsUnixNano(), h.slowActions(id), slow)
		}
		h.nodes.take()
		h.exitAll(id, -1)
		h.reconcile()
		cmds := launches(h.nodes.take())
		if len(cmds) == 0 || cmds[0].cmd.GetLaunch().GetResumeStep() != 7 {
			t.Fatalf("relaunch %v, want it to resume from the checkpoint of step 7", cmds)
		}
		h.started(id)
		j = h.job(id)
		if j.GetState() != api.JobState_JOB_STATE_RUNNING || slices.Contains(nodeNames(j), slow) || !slices.Contains(nodeNames(j), "n2") {
			t.Fatalf("attempt %d %s on %v (launches %v); want running on the spare n2, not %s", j.GetAttempt(), stateName(j.GetState()), nodeNames(j), cmds, slow)
		}
		// A second slow node within the window: the bound (1) is reached.
		f2 := slowRank(t, j, "n2")
		h.slowPass(f2)
		h.clock.add(2 * time.Minute)
		h.slowPass(f2)
		h.slowPass(f2)
		if j := h.job(id); j.GetState() != api.JobState_JOB_STATE_RUNNING || !slices.Equal(h.slowActions(id), []string{"exclude", "bound"}) {
			t.Fatalf("past the bound: %s, actions %v; want running, [exclude bound]", stateName(j.GetState()), h.slowActions(id))
		}
		// The bound and the exclusions are the job's stored state: a
		// restarted owner still holds it.
		h.restart("fifo")
		if j := h.job(id); len(j.GetSlowExclusionsUnixNano()) != 1 {
			t.Errorf("after a restart of the owner: exclusions %v, want 1", j.GetSlowExclusionsUnixNano())
		}
	})
	for _, tc := range []struct {
		name, spec string
		nodes      []*api.NodeStatus
		want       []string
	}{
		{"no spare", "restart_policy: replace-node\nslow_recovery: auto\n", threeNodes()[:2], []string{"no-spare"}},
		{"alert", "restart_policy: replace-node\n", threeNodes(), nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h := newHarness(t, "fifo", tc.nodes...)
			h.m.cfg.SlowRule = rule
			id := h.submit(ringSpec("ring", 2, 2, tc.spec), false)
			h.reconcile()
			h.started(id)
			j := h.job(id)
			f := slowRank(t, j, j.GetPlacement()[0].GetNode())
			h.slowPass(f)
			h.clock.add(time.Hour)
			h.slowPass(f)
			h.slowPass(f)
			if j := h.job(id); j.GetState() != api.JobState_JOB_STATE_RUNNING || len(j.GetExclude()) != 0 || !slices.Equal(h.slowActions(id), tc.want) {
				t.Fatalf("%s exclude %v, actions %v; want running, nothing excluded, %v", stateName(j.GetState()), j.GetExclude(), h.slowActions(id), tc.want)
			}
		})
	}
}

func nodeNames(j *api.Job) []string {
	var out []string
	for _, jn := range j.GetPlacement() {
		out = append(out, jn.GetNode())
	}
	return out
}

// TestSlowQuiet: an acknowledged finding is not acted on for the attempt;
// a silence holds action off until it ends; both are stored with the job,
// and bad requests say what was wrong.
func TestSlowQuiet(t *testing.T) {
	h := newHarness(t, "fifo", threeNodes()...)
	h.m.cfg.SlowRule = scheduler.SlowRule{Hold: time.Minute, Max: 2, Window: time.Hour}
	id := h.submit(ringSpec("ring", 2, 2, "restart_policy: replace-node\nslow_recovery: auto\n"), false)
	h.reconcile()
	h.started(id)
	j := h.job(id)
	slow := j.GetPlacement()[1].GetNode()
	f := slowRank(t, j, slow)
	quiet := func(r *api.QuietSlowRequest) (*api.Job, []failslow.Finding, error) {
		var cov []failslow.Finding
		v, err := h.call(func(ctx context.Context) (any, error) {
			j, c, err := h.m.QuietSlow(ctx, r, "ops")
			cov = c
			return j, err
		})
		j, _ := v.(*api.Job)
		return j, cov, err
	}
	for _, bad := range []struct {
		r    *api.QuietSlowRequest
		want string
	}{
		{&api.QuietSlowRequest{Job: id}, "has no standing fail-slow finding to acknowledge"},
		{&api.QuietSlowRequest{Job: id, HasRank: true, Rank: 9, ForNs: int64(time.Minute)}, "--rank 9: job " + id + " has no such rank"},
		{&api.QuietSlowRequest{Job: id, Node: "n9", ForNs: int64(time.Minute)}, "--node n9 runs no rank of job " + id},
		{&api.QuietSlowRequest{Job: id, ForNs: -1}, "is negative"},
		{&api.QuietSlowRequest{Job: "nope"}, "nope"},
	} {
		if _, _, err := quiet(bad.r); err == nil || !strings.Contains(err.Error(), bad.want) {
			t.Errorf("%v: %v, want %q", bad.r, err, bad.want)
		}
	}
	h.slowPass(f)
	if _, cov, err := quiet(&api.QuietSlowRequest{Job: id, Node: slow}); err != nil || len(cov) != 1 {
		t.Fatalf("ack: %v, covered %v", err, cov)
	}
	h.clock.add(2 * time.Minute)
	h.slowPass(f)
	if j := h.job(id); j.GetState() != api.JobState_JOB_STATE_RUNNING || len(h.slowActions(id)) != 1 {
		t.Fatalf("acknowledged: %s, actions %v; want running and only the ack", stateName(j.GetState()), h.slowActions(id))
	}
	if acked, _ := SlowQuieted(h.job(id), &f, h.clock.now()); !acked {
		t.Error("the acknowledged finding is not listed as acked")
	}
	// A silence of another node's findings for 10 minutes: a finding
	// there waits it out, then is acted on.
	other := j.GetPlacement()[0].GetNode()
	f2 := slowRank(t, j, other)
	if _, _, err := quiet(&api.QuietSlowRequest{Job: id, Node: other, ForNs: int64(10 * time.Minute)}); err != nil {
		t.Fatal(err)
	}
	// Both are stored: a restarted owner keeps them.
	h.restart("fifo")
	h.m.cfg.SlowRule = scheduler.SlowRule{Hold: time.Minute, Max: 2, Window: time.Hour}
	h.slowPass(f, f2)
	h.clock.add(9 * time.Minute)
	h.slowPass(f, f2)
	if j := h.job(id); j.GetState() != api.JobState_JOB_STATE_RUNNING || len(j.GetSlowQuiet()) != 2 {
		t.Fatalf("silenced: %s, quiet %v; want running, the ack and the silence kept", stateName(j.GetState()), j.GetSlowQuiet())
	}
	h.clock.add(time.Minute)
	h.slowPass(f, f2)
	// No checkpoint comes: the restart goes ahead after the wait, from
	// the last one.
	h.clock.add(slowCheckpointWait)
	h.slowPass(f, f2)
	if j := h.job(id); j.GetState() != api.JobState_JOB_STATE_RECOVERING || !slices.Equal(j.GetExclude(), []string{other}) {
		t.Fatalf("after the silence: %s exclude %v; want recovering without %s", stateName(j.GetState()), j.GetExclude(), other)
	}
}
