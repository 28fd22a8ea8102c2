package demo

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/gpuctl/gpuctl/api"
)

// TestElasticShrinkAndGrow runs ringtrain on 4 nodes with no spare and
// restart_policy shrink: killing one node makes the job run on 3 with
// WORLD_SIZE 3 from its checkpoint; once the node is back (restarted and
// uncordoned, the operator vouching for it) the job grows back to 4 at its
// next checkpoint. Each change of size is an elastic event with its reason.
func TestElasticShrinkAndGrow(t *testing.T) {
	c, cl := recoveryCluster(t, 4)
	ctx := context.Background()
	spec := fmt.Sprintf(`name: elastic
nodes: 4
gpus_per_node: 1
command: [%q, --steps, "0", --compute-ms, "30", --bytes, 64K, --ckpt-interval, "5"]
checkpoint: {dir: %q, interval: 1h}
restart_policy: shrink
elastic: {data_parallel: [2, 3, 4]}
`, c.opts.Ringtrain, filepath.Join(c.opts.DataDir, "ckpt", "elastic"))
	r, err := cl.SubmitJob(ctx, &api.SubmitJobRequest{SpecYaml: spec, Source: "elastic test"})
	if err != nil {
		t.Fatal(err)
	}
	id := r.GetJob().GetId()
	old := waitFor(t, cl, id, 20*time.Second, "attempt 1 on 4 nodes", func(j *api.Job) error { return runningWith(j, 1, 4) })
	poll(t, 15*time.Second, "10 steps trained", func() error {
		if s := maxStep(t, c, old); s < 10 {
			return fmt.Errorf("step %d", s)
		}
		return nil
	})
	victim := rankPIDs(old)[3]
	killed := time.Now()
	syscall.Kill(c.NodemonPID(victim.node), syscall.SIGKILL)
	syscall.Kill(-int(victim.pid), syscall.SIGKILL)
	syscall.Kill(int(victim.pid), syscall.SIGKILL)

	shrunk := waitFor(t, cl, id, 40*time.Second, "attempt 2 on 3 nodes", func(j *api.Job) error { return runningWith(j, 2, 3) })
	shrankIn := time.Since(killed)
	if dp := shrunk.GetPlan().GetDp(); dp != 3 || shrunk.GetFullGpus() != 4 {
		t.Fatalf("after the shrink dp %d full %d, want 3 of 4", dp, shrunk.GetFullGpus())
	}
	if slices.Contains(nodeSet(shrunk), victim.node) {
		t.Fatalf("the shrunk attempt runs on the lost node %s", victim.node)
	}
	failedAt := maxStep(t, c, old)
	resume := shrunk.GetResumeStep()
	if resume <= 0 || failedAt-resume > 5 {
		t.Errorf("resumed from step %d after reaching %d", resume, failedAt)
	}
	for rank, at := range rankPIDs(shrunk) {
		poll(t, 10*time.Second, fmt.Sprintf("rank %d of 3 resumed", rank), func() error {
			_, rs := rankLog(t, c, at.node, id, rank)
			if len(rs) == 0 || rs[len(rs)-1] != fmt.Sprintf("%d GPUCTL_RESUME_STEP", resume) {
				return fmt.Errorf("resume lines %v", rs)
			}
			return nil
		})
		if w := worldSize(t, c, at.node, at.pid); w != "3" {
			t.Errorf("rank %d runs with WORLD_SIZE=%s, want 3", rank, w)
		}
	}
	poll(t, 10*time.Second, "the shrunk job trains", func() error {
		if s := maxStep(t, c, shrunk); s <= resume+6 {
			return fmt.Errorf("step %d", s)
		}
		return nil
	})

	// The node comes back; recovery cordoned it when it went down, so the
	// operator uncordons it once it is healthy again.
	if err := c.StartNode(victim.node, ""); err != nil {
		t.Fatal(err)
	}
	poll(t, 15*time.Second, victim.node+" back", func() error {
		nodes, err := cl.Nodes(ctx)
		if err != nil {
			return err
		}
		for _, n := range nodes {
			if n.GetRegistration().GetName() == victim.node && n.GetConnected() {
				return nil
			}
		}
		return fmt.Errorf("%s not connected", victim.node)
	})
	back := time.Now()
	if _, err := cl.Cordon(ctx, victim.node, "uncordon", ""); err != nil {
		t.Fatal(err)
	}
	grown := waitFor(t, cl, id, 60*time.Second, "attempt 3 on 4 nodes", func(j *api.Job) error { return runningWith(j, 3, 4) })
	grewIn := time.Since(back)
	if dp := grown.GetPlan().GetDp(); dp != 4 {
		t.Fatalf("after growing dp %d, want 4", dp)
	}
	if grown.GetResumeStep() <= resume {
		t.Errorf("grew back resuming from step %d, not past the shrunk attempt's start %d", grown.GetResumeStep(), resume)
	}
	for rank, at := range rankPIDs(grown) {
		if w := worldSize(t, c, at.node, at.pid); w != "4" {
			t.Errorf("rank %d runs with WORLD_SIZE=%s after growing, want 4", rank, w)
		}
	}
	poll(t, 10*time.Second, "the grown job trains", func() error {
		if s := maxStep(t, c, grown); s <= grown.GetResumeStep()+3 {
			return fmt.Errorf("step %d", s)
		}
		return nil
	})
	evs, err := cl.Events(ctx, &api.ListEventsRequest{})
	if err != nil {
		t.Fatal(err)
	}
	var elastic []string
	for _, e := range evs {
		if e.GetKind() == api.EventKind_EVENT_KIND_ELASTIC && e.GetJob() == id {
			elastic = append(elastic, e.GetMessage())
		}
	}
	shrink := slices.IndexFunc(elastic, func(m string) bool { return strings.Contains(m, "shrinks from data-parallel 4 to 3") })
	grow := slices.IndexFunc(elastic, func(m string) bool { return strings.Contains(m, "grows from data-parallel 3 to 4") })
	if shrink < 0 || !strings.Contains(elastic[shrink], victim.node) || grow < shrink {
		t.Errorf("elastic events lack the shrink naming %s, or the grow after it:\n%s", victim.node, strings.Join(elastic, "\n"))
	}
	attempts := grown.GetAttempts()
	if len(attempts) != 3 || attempts[0].GetDp() != 4 || attempts[1].GetDp() != 3 || attempts[2].GetDp() != 4 {
		t.Errorf("attempt history %v, want dp 4, 3, 4", attempts)
	}
	t.Logf("killed %s at step %d: running on 3 after %.2fs from step %d; node back and uncordoned: running on 4 after %.2fs from step %d",
		victim.node, failedAt, shrankIn.Seconds(), resume, grewIn.Seconds(), grown.GetResumeStep())
	t.Logf("elastic events:\n  %s", strings.Join(elastic, "\n  "))
}

// worldSize reads WORLD_SIZE from a rank's environment.
func worldSize(t *testing.T, c *Cluster, node string, pid uint32) string {
	t.Helper()
	env, err := readEnviron(pid)
	if err != nil {
		t.Fatalf("read the environment of %s pid %d: %v", node, pid, err)
	}
	return env["WORLD_SIZE"]
}

func readEnviron(pid uint32) (map[string]string, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/environ", pid))
	if err != nil {
		return nil, err
	}
	out := map[string]string{}
	for _, kv := range bytes.Split(b, []byte{0}) {
		if k, v, ok := strings.Cut(string(kv), "="); ok {
			if _, dup := out[k]; !dup {
				out[k] = v
			}
		}
	}
	return out, nil
}
