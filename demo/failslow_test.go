package demo

import (
	"context"
	"errors"
	"fmt"
	"os"
	"strings"
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
	_, cl, job := healthyDemo(t, 150, 60*time.Second)
	ctx := context.Background()
	// The victim: rank 3, on the second node.
	node, gpu := rankGPU(t, job, 3)
	injected := time.Now()
	if err := cl.InjectFault(ctx, node, &api.InjectFault{GpuIndex: int32(gpu), Kind: api.FaultKind_FAULT_KIND_SLOW, Factor: 0.7}); err != nil {
		t.Fatal(err)
	}
	found, err := awaitSlow(t, cl, job.GetId(), injected, api.Severity_SEVERITY_WARNING, "", 30*time.Second)
	if err != nil {
		t.Fatalf("a compute-slow finding naming rank 3: %v", err)
	}
	named := time.Since(injected)
	if found.GetAttrs()["class"] != "compute-slow" || found.GetRank() != 3 || found.GetNode() != node {
		t.Errorf("finding %s rank %d on %s (%s), want compute-slow rank 3 on %s", found.GetAttrs()["class"], found.GetRank(), found.GetNode(), found.GetMessage(), node)
	}
	t.Logf("slow --gpu %d --factor 0.7 on %s: named after %.1fs: %s", gpu, node, named.Seconds(), found.GetMessage())
	// `gpuctl stalls` lists it while it stands.
	r, err := cl.ListFindings(ctx, job.GetId())
	if err != nil {
		t.Fatal(err)
	}
	if sl := r.GetSlow(); len(sl) != 1 || sl[0].GetClass() != "compute-slow" || sl[0].GetRank() != 3 || sl[0].GetNode() != node {
		t.Errorf("listed slow findings %v, want compute-slow rank 3 on %s", sl, node)
	}

	cleared := time.Now()
	if err := cl.InjectFault(ctx, node, &api.InjectFault{GpuIndex: int32(gpu), Kind: api.FaultKind_FAULT_KIND_CLEAR}); err != nil {
		t.Fatal(err)
	}
	if _, err := awaitSlow(t, cl, job.GetId(), cleared, api.Severity_SEVERITY_INFO, "compute-slow", 30*time.Second); err != nil {
		t.Fatalf("the finding cleared: %v", err)
	}
	t.Logf("cleared after %.1fs", time.Since(cleared).Seconds())
}

// awaitSlow waits for the job's first fail-slow event since a time of the
// severity (and class, unless ""), up to limit.
func awaitSlow(t *testing.T, cl *client.Client, job string, since time.Time, sev api.Severity, class string, limit time.Duration) (*api.Event, error) {
	t.Helper()
	return awaitSlowEvent(t, cl, job, since, limit, func(e *api.Event) bool {
		return e.GetSeverity() == sev && (class == "" || e.GetAttrs()["class"] == class)
	})
}

// awaitSlowEvent waits for the job's first fail-slow event since a time
// that matches, up to limit.
func awaitSlowEvent(t *testing.T, cl *client.Client, job string, since time.Time, limit time.Duration, match func(*api.Event) bool) (*api.Event, error) {
	t.Helper()
	var found *api.Event
	err := waitUntil(limit, func() error {
		for _, e := range slowEvents(t, cl, job, since) {
			if match(e) {
				found = e
				return nil
			}
		}
		return errors.New("none yet")
	})
	return found, err
}

// healthyDemo starts the demo cluster (2 nodes × 2 ranks traced with eBPF),
// waits for its job's calls to be traced, then for steps healthy steps, and
// fails if they raised a fail-slow finding.
func healthyDemo(t *testing.T, steps int64, limit time.Duration) (*Cluster, *client.Client, *api.Job) {
	t.Helper()
	opts := DefaultOptions()
	opts.Nodes, opts.EBPF = 2, ebpfMode()
	c, cl := startCluster(t, opts)
	start := time.Now()
	job := waitFor(t, cl, c.JobID, 30*time.Second, "demo job running", func(j *api.Job) error { return runningWith(j, 1, 4) })
	requireTraced(t, cl, job.GetId(), 15*time.Second, "the fail-slow analysis")
	from := maxStep(t, c, job)
	poll(t, limit, fmt.Sprintf("%d healthy steps", steps), func() error {
		if s := maxStep(t, c, job); s < from+steps {
			return fmt.Errorf("step %d", s)
		}
		return nil
	})
	if evs := slowEvents(t, cl, job.GetId(), start); len(evs) > 0 {
		t.Fatalf("%s of a healthy run raised fail-slow findings: %v", time.Since(start).Round(time.Second), evs)
	}
	return c, cl, job
}

// rankGPU is where rank r of job runs: its node and GPU.
func rankGPU(t *testing.T, job *api.Job, r int32) (string, uint32) {
	t.Helper()
	for _, jn := range job.GetPlacement() {
		for _, rk := range jn.GetRanks() {
			if rk.GetRank() == r {
				return jn.GetNode(), rk.GetGpu()
			}
		}
	}
	t.Fatalf("rank %d not in the placement %v", r, job.GetPlacement())
	return "", 0
}

// TestFailSlowBench (GPUCTL_BENCH_FAILSLOW=1, `make bench-failslow`) prints
// how long each fault takes from injection to its event in the demo: a
// 0.7× GPU, a 0.5× link, every GPU at 1/1.15 (a 15% step-time shift),
// after GPUCTL_BENCH_HEALTHY (default 2m) of healthy running that must
// raise nothing.
func TestFailSlowBench(t *testing.T) {
	if os.Getenv("GPUCTL_BENCH_FAILSLOW") == "" {
		t.Skip("a benchmark: set GPUCTL_BENCH_FAILSLOW=1 (make bench-failslow)")
	}
	healthy := envDuration(t, "GPUCTL_BENCH_HEALTHY", 2*time.Minute)
	// About 8 steps a second.
	c, cl, job := healthyDemo(t, int64(healthy.Seconds()*8), healthy+time.Minute)
	ctx := context.Background()
	node3, gpu3 := rankGPU(t, job, 3)
	type fault struct {
		name, class, want string
		inject            func() error
		clear             func() error
	}
	clearNodes := func(nodes ...string) func() error {
		return func() error {
			for _, n := range nodes {
				for g := range int32(8) {
					if err := cl.InjectFault(ctx, n, &api.InjectFault{GpuIndex: g, Kind: api.FaultKind_FAULT_KIND_CLEAR}); err != nil {
						return err
					}
				}
			}
			return nil
		}
	}
	var jobNodes []string
	for _, jn := range job.GetPlacement() {
		jobNodes = append(jobNodes, jn.GetNode())
	}
	faults := []fault{
		{name: "0.7× GPU (rank 3)", class: "compute-slow", want: "rank 3 on " + node3, inject: func() error {
			return cl.InjectFault(ctx, node3, &api.InjectFault{GpuIndex: int32(gpu3), Kind: api.FaultKind_FAULT_KIND_SLOW, Factor: 0.7})
		}, clear: clearNodes(node3)},
		{name: "0.5× link (" + node3 + ")", class: "communication-slow", want: node3, inject: func() error {
			return cl.InjectFault(ctx, node3, &api.InjectFault{Kind: api.FaultKind_FAULT_KIND_LINK_SLOW, Factor: 0.5})
		}, clear: clearNodes(node3)},
		{name: "15% step-time shift (every GPU at 1/1.15)", class: "job-wide", want: "every rank", inject: func() error {
			for _, jn := range job.GetPlacement() {
				for _, r := range jn.GetRanks() {
					if err := cl.InjectFault(ctx, jn.GetNode(), &api.InjectFault{GpuIndex: int32(r.GetGpu()), Kind: api.FaultKind_FAULT_KIND_SLOW, Factor: 1 / 1.15}); err != nil {
						return err
					}
				}
			}
			return nil
		}, clear: clearNodes(jobNodes...)},
	}
	rows := []string{fmt.Sprintf("%-42s  %-20s  %-10s  %s", "fault", "class found", "seconds", "names")}
	for _, f := range faults {
		at := time.Now()
		if err := f.inject(); err != nil {
			t.Fatal(err)
		}
		e, err := awaitSlow(t, cl, job.GetId(), at, api.Severity_SEVERITY_WARNING, "", 60*time.Second)
		took := time.Since(at)
		row := fmt.Sprintf("%-42s  %-20s  %-10s  %s", f.name, "none", "> 60", "")
		if err == nil {
			row = fmt.Sprintf("%-42s  %-20s  %-10.1f  %s", f.name, e.GetAttrs()["class"], took.Seconds(), e.GetMessage())
			if e.GetAttrs()["class"] != f.class || !strings.Contains(e.GetMessage(), f.want) {
				t.Errorf("%s: found %s (%s), want %s naming %s", f.name, e.GetAttrs()["class"], e.GetMessage(), f.class, f.want)
			}
		} else {
			t.Errorf("%s: no finding within 60s", f.name)
		}
		rows = append(rows, row)
		cleared := time.Now()
		if err := f.clear(); err != nil {
			t.Fatal(err)
		}
		if err == nil {
			if _, err := awaitSlow(t, cl, job.GetId(), cleared, api.Severity_SEVERITY_INFO, "", 60*time.Second); err != nil {
				t.Errorf("%s: not cleared within 60s of the fault's end", f.name)
			}
		}
		// The next fault starts from a steady job: one analysis window and
		// a baseline's worth of steps.
		step := maxStep(t, c, job)
		poll(t, time.Minute, "steady again", func() error {
			if s := maxStep(t, c, job); s < step+40 {
				return fmt.Errorf("step %d", s)
			}
			return nil
		})
	}
	t.Logf("healthy %s: no finding\n%s", healthy, strings.Join(rows, "\n"))
	fmt.Println(strings.Join(rows, "\n"))
}
