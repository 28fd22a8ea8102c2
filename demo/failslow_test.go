package demo

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/gpuctl/gpuctl/api"
	"github.com/gpuctl/gpuctl/client"
	"github.com/gpuctl/gpuctl/internal/needs"
)

// requireTraced waits until the job's NCCL calls are traced, and skips
// (fails where eBPF is required) when they are not within limit: reader,
// the part under test, has nothing to read then.
func requireTraced(t *testing.T, cl *client.Client, job string, limit time.Duration, reader string) {
	t.Helper()
	if err := waitUntil(limit, func() error {
		cs, err := cl.Collectives(context.Background(), job, "")
		if err == nil && len(cs) == 0 {
			err = errors.New("no aggregates")
		}
		return err
	}); err != nil {
		needs.EBPF.Skip(t, "no NCCL calls traced within %s (%v): %s has nothing to read", limit, err, reader)
	}
}

// slowEvents returns the job's fail-slow events since a time.
func slowEvents(t *testing.T, cl *client.Client, job string, since time.Time) []*api.Event {
	t.Helper()
	evs, err := cl.Events(context.Background(), &api.ListEventsRequest{SinceUnixNano: since.UnixNano()})
	if err != nil {
		t.Fatal(err)
	}
	var out []*api.Event
	for _, e := range evs {
		if e.GetKind() == api.EventKind_EVENT_KIND_SLOW && e.GetJob() == job {
			out = append(out, e)
		}
	}
	return out
}

// TestSlowGPUNamed runs the demo job (2 nodes × 2 ranks, real ranks traced
// with eBPF): a healthy run raises no fail-slow finding; `gpuctl fault
// NODE slow --gpu N --factor 0.7` on one rank's GPU is named as a
// compute-slow rank, the right one, within 30 s, with its GPU's clock as
// evidence; clearing the fault clears the finding.
func TestSlowGPUNamed(t *testing.T) {
	if testing.Short() {
		t.Skip("starts real nodemon and ringtrain processes")
	}
	opts := DefaultOptions()
	opts.Nodes, opts.EBPF = 2, ebpfMode()
	c, cl := startCluster(t, opts)
	ctx := context.Background()
	start := time.Now()
	job := waitFor(t, cl, c.JobID, 30*time.Second, "demo job running", func(j *api.Job) error { return runningWith(j, 1, 4) })
	requireTraced(t, cl, job.GetId(), 15*time.Second, "the fail-slow analysis")

	// Healthy: 150 steps (several analysis windows and baselines, a
	// checkpoint) flag nothing.
	from := maxStep(t, c, job)
	poll(t, 60*time.Second, "150 healthy steps", func() error {
		if s := maxStep(t, c, job); s < from+150 {
			return fmt.Errorf("step %d", s)
		}
		return nil
	})
	if evs := slowEvents(t, cl, job.GetId(), start); len(evs) > 0 {
		t.Fatalf("a healthy run raised fail-slow findings: %v", evs)
	}

	// The victim: rank 3, on the second node.
	var node string
	var gpu uint32
	for _, jn := range job.GetPlacement() {
		for _, r := range jn.GetRanks() {
			if r.GetRank() == 3 {
				node, gpu = jn.GetNode(), r.GetGpu()
			}
		}
	}
	if node == "" {
		t.Fatalf("rank 3 not in the placement %v", job.GetPlacement())
	}
	injected := time.Now()
	if err := cl.InjectFault(ctx, node, &api.InjectFault{GpuIndex: int32(gpu), Kind: api.FaultKind_FAULT_KIND_SLOW, Factor: 0.7}); err != nil {
		t.Fatal(err)
	}
	var found *api.Event
	poll(t, 30*time.Second, "a compute-slow finding naming rank 3", func() error {
		for _, e := range slowEvents(t, cl, job.GetId(), injected) {
			if e.GetSeverity() == api.Severity_SEVERITY_WARNING {
				found = e
				return nil
			}
		}
		return errors.New("none yet")
	})
	named := time.Since(injected)
	if found.GetAttrs()["class"] != "compute-slow" || found.GetRank() != 3 || found.GetNode() != node {
		t.Errorf("finding %s rank %d on %s (%s), want compute-slow rank 3 on %s", found.GetAttrs()["class"], found.GetRank(), found.GetNode(), found.GetMessage(), node)
	}
	t.Logf("slow --gpu %d --factor 0.7 on %s: named after %.1fs: %s", gpu, node, named.Seconds(), found.GetMessage())

	cleared := time.Now()
	if err := cl.InjectFault(ctx, node, &api.InjectFault{GpuIndex: int32(gpu), Kind: api.FaultKind_FAULT_KIND_CLEAR}); err != nil {
		t.Fatal(err)
	}
	poll(t, 30*time.Second, "the finding cleared", func() error {
		for _, e := range slowEvents(t, cl, job.GetId(), cleared) {
			if e.GetSeverity() == api.Severity_SEVERITY_INFO && e.GetAttrs()["class"] == "compute-slow" {
				return nil
			}
		}
		return errors.New("not yet")
	})
	t.Logf("cleared after %.1fs", time.Since(cleared).Seconds())
}
