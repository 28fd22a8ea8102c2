package demo

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/gpuctl/gpuctl/api"
	"github.com/gpuctl/gpuctl/client"
	"github.com/gpuctl/gpuctl/scheduler"
)

// TestSlowAutoRecovery runs a job with slow_recovery auto on 2 of 4 nodes
// (2 ranks each, traced with eBPF) and slows one rank's GPU (`gpuctl fault
// NODE slow --factor 0.7`): once the compute-slow finding has stood for
// the hold, the job is asked to checkpoint, then restarts from that
// checkpoint without that node, on a spare. Then another of its GPUs is slowed while a spare is still free:
// the bound (one automatic slow exclusion an hour here) keeps it to an
// alert, and the job stays on its attempt.
func TestSlowAutoRecovery(t *testing.T) {
	if testing.Short() {
		t.Skip("starts real nodemon and ringtrain processes")
	}
	opts := DefaultOptions()
	opts.Nodes, opts.JobNodes, opts.EBPF = 4, 0, ebpfMode()
	opts.SlowRule = scheduler.SlowRule{Hold: 5 * time.Second, Max: 1, Window: time.Hour}
	c, cl := startCluster(t, opts)
	ctx := context.Background()
	spec := fmt.Sprintf(`name: slowauto
nodes: 2
gpus_per_node: 2
command: [%q, --steps, "0", --compute-ms, "100", --bytes, 4M, --ckpt-interval, "20"]
checkpoint: {dir: %q, interval: 1h}
restart_policy: replace-node
slow_recovery: auto
`, c.opts.Ringtrain, filepath.Join(c.opts.DataDir, "ckpt", "slowauto"))
	r, err := cl.SubmitJob(ctx, &api.SubmitJobRequest{SpecYaml: spec, Source: "slow test"})
	if err != nil {
		t.Fatal(err)
	}
	id := r.GetJob().GetId()
	old := waitFor(t, cl, id, 30*time.Second, "attempt 1 running", func(j *api.Job) error { return runningWith(j, 1, 4) })
	requireTraced(t, cl, id, 15*time.Second, "the fail-slow analysis")
	waitFor(t, cl, id, 60*time.Second, "a first checkpoint", func(j *api.Job) error {
		if j.GetLastCheckpointStep() <= 0 {
			return errors.New("none reported yet")
		}
		return nil
	})
	node, gpu := rankGPU(t, old, 3)
	injected := time.Now()
	if err := cl.InjectFault(ctx, node, &api.InjectFault{GpuIndex: int32(gpu), Kind: api.FaultKind_FAULT_KIND_SLOW, Factor: 0.7}); err != nil {
		t.Fatal(err)
	}
	acted, err := awaitSlowAction(t, cl, id, injected, "exclude", 60*time.Second)
	if err != nil {
		t.Fatalf("an automatic exclusion of %s: %v", node, err)
	}
	if acted.GetNode() != node {
		t.Errorf("excluded %s (%s), want %s", acted.GetNode(), acted.GetMessage(), node)
	}
	evs, err := cl.Events(ctx, &api.ListEventsRequest{SinceUnixNano: injected.UnixNano()})
	if err != nil {
		t.Fatal(err)
	}
	asked := slices.ContainsFunc(evs, func(e *api.Event) bool {
		return e.GetJob() == id && e.GetKind() == api.EventKind_EVENT_KIND_CHECKPOINT && strings.Contains(e.GetMessage(), "before restarting without "+node)
	})
	if !asked {
		t.Errorf("no checkpoint was asked for before the restart: %v", evs)
	}
	now := waitFor(t, cl, id, 60*time.Second, "attempt 2 running", func(j *api.Job) error { return runningWith(j, 2, 4) })
	back := time.Since(injected)
	if slices.Contains(nodeSet(now), node) || !slices.Contains(now.GetExclude(), node) || now.GetResumeStep() <= 0 {
		t.Fatalf("attempt 2 on %v excluding %v resuming from step %d; want it off %s, from a checkpoint", nodeSet(now), now.GetExclude(), now.GetResumeStep(), node)
	}
	t.Logf("slow --gpu %d --factor 0.7 on %s: excluded after %.1fs (%s); attempt 2 on %v from step %d after %.1fs",
		gpu, node, time.Unix(0, acted.GetTimeUnixNano()).Sub(injected).Seconds(), acted.GetMessage(), nodeSet(now), now.GetResumeStep(), back.Seconds())

	// A second slow GPU, with a spare still free: the bound holds.
	node2, gpu2 := rankGPU(t, now, 0)
	injected = time.Now()
	if err := cl.InjectFault(ctx, node2, &api.InjectFault{GpuIndex: int32(gpu2), Kind: api.FaultKind_FAULT_KIND_SLOW, Factor: 0.7}); err != nil {
		t.Fatal(err)
	}
	bound, err := awaitSlowAction(t, cl, id, injected, "bound", 60*time.Second)
	if err != nil {
		t.Fatalf("the bound named for the slow GPU on %s: %v", node2, err)
	}
	t.Logf("second slow GPU on %s: %s", node2, bound.GetMessage())
	js, err := cl.Jobs(ctx, id)
	if err != nil || len(js) != 1 || js[0].GetAttempt() != 2 || js[0].GetState() != api.JobState_JOB_STATE_RUNNING {
		t.Fatalf("after the bound: %v %v; want attempt 2 still running", js, err)
	}
}

// awaitSlowAction waits for the job's fail-slow event since a time saying
// what was done (attrs.action), up to limit.
func awaitSlowAction(t *testing.T, cl *client.Client, job string, since time.Time, action string, limit time.Duration) (*api.Event, error) {
	t.Helper()
	return awaitSlowEvent(t, cl, job, since, limit, func(e *api.Event) bool { return e.GetAttrs()["action"] == action })
}
