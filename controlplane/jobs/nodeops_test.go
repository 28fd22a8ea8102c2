package jobs

import (
	"slices"
	"strings"
	"testing"

	"github.com/gpuctl/gpuctl/api"
)

// TestDrain: draining a node queues a move of its checkpointing job onto
// other nodes (which then begins with a checkpoint request), leaves a job
// that does not checkpoint in place saying why, says so for a job that
// fits nowhere else, and does not queue a move twice.
func TestDrain(t *testing.T) {
	h := newHarness(t, "fifo", readyNode("n0", 4, "r0", "s0"), readyNode("n1", 4, "r0", "s0"), readyNode("n2", 2, "r1", "s1"))
	ckpt := "checkpoint:\n  dir: " + t.TempDir() + "\n"
	movable := h.submit(ringSpec("movable", 1, 2, ckpt), true)
	plain := h.submit(ringSpec("plain", 1, 1, ""), true)
	for _, id := range []string{movable, plain} {
		if _, err := h.assign(id, []string{"n0"}); err != nil {
			t.Fatal(err)
		}
		h.started(id)
	}
	// n1 is filled by a job that needs a whole 4-GPU node: with n0
	// draining it would fit nowhere.
	big := h.submit(ringSpec("big", 1, 4, ckpt), true)
	if _, err := h.assign(big, []string{"n1"}); err != nil {
		t.Fatal(err)
	}
	h.started(big)
	h.nodes.take()

	if _, err := h.nodes.SetCordon("n0", "drain", ""); err != nil {
		t.Fatal(err)
	}
	got := h.drain("n0")
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
	// The drain's own pass begins the move; a second drain answers the
	// same and queues nothing more.
	if again := h.drain("n0"); len(again) != 2 || len(h.m.stops.moves) != 0 || !slices.Equal(byTo(again)[movable], []string{"n2"}) {
		t.Errorf("second drain: %v with %d moves still queued, want the same answer and no second move", again, len(h.m.stops.moves))
	}
	h.reconcile()
	if sigs := signals(h.nodes.take()); !slices.Equal(sigs, []string{"n0:SIGUSR1"}) {
		t.Errorf("after the drain the passes sent %v, want one checkpoint request to the movable job on n0", sigs)
	}
	if j := h.job(movable); j.GetStopping() != api.JobStop_JOB_STOP_MOVE || nodesOfTarget(j) != "n2" {
		t.Errorf("movable job: stopping %s target %s", j.GetStopping(), nodesOfTarget(j))
	}

	if _, err := h.nodes.SetCordon("n0", "uncordon", ""); err != nil {
		t.Fatal(err)
	}
	if _, err := h.nodes.SetCordon("n1", "drain", ""); err != nil {
		t.Fatal(err)
	}
	got = h.drain("n1")
	if len(got) != 1 || got[0].GetJob() != big || got[0].GetMoving() || !strings.HasPrefix(got[0].GetReason(), "no room elsewhere: ") {
		t.Errorf("draining n1: %v, want the big job to stay for lack of room", got)
	}
}

// byTo maps each drained job that moves to where it goes.
func byTo(ds []*api.DrainedJob) map[string][]string {
	out := map[string][]string{}
	for _, d := range ds {
		if d.GetMoving() {
			out[d.GetJob()] = d.GetTo()
		}
	}
	return out
}

func nodesOfTarget(j *api.Job) string {
	var out []string
	for _, jn := range j.GetMoveTarget() {
		out = append(out, jn.GetNode())
	}
	return strings.Join(out, ",")
}
