package demo

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/gpuctl/gpuctl/api"
)

// TestConfirmFencedPastDeadWitnesses: real server and five nodemons,
// ringtrain on two nodes. One of its nodes dies with the two other nodes
// of its witness pool (SIGKILL to their nodemons): only one of the lost
// node's three witnesses is left to acknowledge the Supersede, two are
// needed, so the job waits for the fence even after the lost node's ranks
// have stopped on their lease. `gpuctl node remove --confirm-fenced` lifts
// it and attempt 2 runs on the survivor and the spare.
func TestConfirmFencedPastDeadWitnesses(t *testing.T) {
	const lease = 3 * time.Second
	c := newProcCluster(t, 5, "--lease", lease.String())
	cl := c.dial(10 * time.Second)
	defer cl.Close()
	ctx := context.Background()
	r, err := cl.SubmitJob(ctx, &api.SubmitJobRequest{SpecYaml: c.ringSpec("lost", 2) + "restart_policy: replace-node\n", Source: "confirm-fenced test"})
	if err != nil {
		t.Fatal(err)
	}
	id := r.GetJob().GetId()
	running := waitFor(t, cl, id, 20*time.Second, "attempt 1 running", func(j *api.Job) error { return runningWith(j, 1, 2) })
	var placed []string
	for _, jn := range running.GetPlacement() {
		placed = append(placed, jn.GetNode())
	}
	pool := running.GetWitnesses()
	if len(pool) != 4 {
		t.Fatalf("witness pool %v, want the job's two nodes and two others", pool)
	}
	lost := placed[1]
	dead := []string{lost}
	for _, n := range pool {
		if !slices.Contains(placed, n) {
			dead = append(dead, n)
		}
	}
	for _, n := range dead {
		p := c.nodes[n]
		if err := p.Process.Signal(syscall.SIGKILL); err != nil {
			t.Fatal(err)
		}
		<-p.done
	}
	killed := time.Now()
	t.Logf("killed the nodemons of %v; %s ran ranks of the job", dead, lost)

	// Past the lost node's lease its ranks are stopped (no server, one
	// witness of three), yet the server cannot know it: it still waits,
	// and says what would free it.
	jobEvents := func() string {
		evs, err := cl.Events(ctx, &api.ListEventsRequest{})
		if err != nil {
			t.Fatal(err)
		}
		var msgs []string
		for _, e := range evs {
			if e.GetJob() == id {
				msgs = append(msgs, e.GetMessage())
			}
		}
		return strings.Join(msgs, "\n")
	}
	hint := fmt.Sprintf("run `gpuctl node remove %s --confirm-fenced`", lost)
	poll(t, 2*lease+10*time.Second, "an event that the job waits on "+lost+" past its lease", func() error {
		if !strings.Contains(jobEvents(), hint) {
			return fmt.Errorf("no event says %q", hint)
		}
		return nil
	})
	for _, rk := range c.clusterRanks() {
		if rk.job == id && rk.node == lost {
			t.Errorf("past its lease rank %d (pid %d) still runs on %s", rk.rank, rk.pid, lost)
		}
	}
	if js, err := cl.Jobs(ctx, id); err != nil || js[0].GetAttempt() != 1 || !slices.Contains(js[0].GetFencedNodes(), lost) {
		t.Fatalf("%s after the loss: %v %v", time.Since(killed).Round(time.Millisecond), js, err)
	}

	resp, err := cl.RemoveLostNode(ctx, lost, "host dead")
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(resp.GetFencedJobs(), []string{id}) {
		t.Errorf("fences lifted for %v, want [%s]", resp.GetFencedJobs(), id)
	}
	confirmed := time.Now()
	j := waitFor(t, cl, id, 30*time.Second, "attempt 2 running", func(j *api.Job) error { return runningWith(j, 2, 2) })
	for _, jn := range j.GetPlacement() {
		if slices.Contains(dead, jn.GetNode()) {
			t.Errorf("attempt 2 placed on dead node %s", jn.GetNode())
		}
	}
	if all := jobEvents(); !strings.Contains(all, "confirmed that the node and its ranks are down") {
		t.Errorf("no event of the job records the confirmation:\n%s", all)
	}
	t.Logf("stuck %s after the loss; attempt 2 running %s after the confirmation",
		confirmed.Sub(killed).Round(time.Millisecond), time.Since(confirmed).Round(time.Millisecond))
}
