package demo

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/gpuctl/gpuctl/api"
	"github.com/gpuctl/gpuctl/client"
	"github.com/gpuctl/gpuctl/internal/needs"
	"github.com/gpuctl/gpuctl/internal/testbin"
	wl "github.com/gpuctl/gpuctl/workload"
)

// stallRig is the demo job with its ranks traced, where faults are
// injected one at a time and the stall detector's findings timed.
type stallRig struct {
	t   *testing.T
	c   *Cluster
	cl  *client.Client
	job *api.Job
	// victim is the rank faults are injected into, and gpu its GPU.
	victim rankAt
	rank   int32
	gpu    uint32
}

// stallFault is one row of the stall benchmark: a fault injected into the
// victim rank and the finding that names it. A row for another kind of
// finding brings its own found, which reads wherever that finding shows.
type stallFault struct {
	name string
	// inject starts the fault and returns what ends it.
	inject func(r *stallRig) (undo func())
	// found returns the finding's text once one names the fault, ok false
	// until then.
	found func(r *stallRig) (finding string, ok bool, err error)
	// word must be in the finding ("" any).
	word string
	// gone returns nil once the finding cleared after undo.
	gone func(r *stallRig) error
}

// hangFaults are the hangs: the rank stops inside a collective, between
// collectives (both by `gpuctl fault NODE hang`), or by SIGSTOP.
var hangFaults = []stallFault{
	{name: "hang inside (gpuctl fault hang --where inside)", inject: faultHang("inside"), found: namesVictim("inside"), word: "is hung", gone: noStalls},
	{name: "hang outside (gpuctl fault hang --where outside)", inject: faultHang("outside"), found: namesVictim("after"), word: "is hung", gone: noStalls},
	// SIGSTOP lands wherever the rank is.
	{name: "SIGSTOP", inject: sigstop, found: namesVictim(""), word: "is stopped", gone: noStalls},
}

func faultHang(where string) func(r *stallRig) func() {
	return func(r *stallRig) func() {
		kind := api.FaultKind_FAULT_KIND_HANG_INSIDE
		if where == "outside" {
			kind = api.FaultKind_FAULT_KIND_HANG_OUTSIDE
		}
		if err := r.cl.InjectFault(context.Background(), r.victim.node, &api.InjectFault{GpuIndex: int32(r.gpu), Kind: kind}); err != nil {
			r.t.Fatalf("inject hang %s on %s GPU %d: %v", where, r.victim.node, r.gpu, err)
		}
		return func() {
			if err := r.cl.InjectFault(context.Background(), r.victim.node, &api.InjectFault{GpuIndex: int32(r.gpu), Kind: api.FaultKind_FAULT_KIND_CLEAR}); err != nil {
				r.t.Errorf("clear the hang on %s GPU %d: %v", r.victim.node, r.gpu, err)
			}
		}
	}
}

func sigstop(r *stallRig) func() {
	pid := int(r.victim.pid)
	syscall.Kill(pid, syscall.SIGSTOP)
	return func() { syscall.Kill(pid, syscall.SIGCONT) }
}

// namesVictim finds a stall whose lagging ranks are the victim alone,
// where it is ("inside" a collective, "after" one, "" either) on at least
// one communicator; every listed stall must blame the victim.
func namesVictim(where string) func(r *stallRig) (string, bool, error) {
	return func(r *stallRig) (string, bool, error) {
		stalls, err := r.cl.ListStalls(context.Background(), r.job.GetId())
		if err != nil {
			return "", false, err
		}
		found := ""
		for _, s := range stalls {
			lr := s.GetLaggingRanks()
			if len(lr) != 1 || lr[0].GetRank() != r.rank {
				return "", false, fmt.Errorf("a stall blames another rank: %s", s.GetDiagnosis())
			}
			if where == "" || lr[0].GetInCall() == (where == "inside") {
				found = s.GetDiagnosis()
			}
		}
		if found == "" && len(stalls) > 0 {
			return "", false, fmt.Errorf("the stalls name rank %d elsewhere: %s", r.rank, stalls[0].GetDiagnosis())
		}
		return found, found != "", nil
	}
}

// noStalls returns nil once the job has no stall listed.
func noStalls(r *stallRig) error {
	stalls, err := r.cl.ListStalls(context.Background(), r.job.GetId())
	if err == nil && len(stalls) > 0 {
		err = fmt.Errorf("still listed: %v", stalls)
	}
	return err
}

// newStallRig starts the default demo (its job and the stall rule at their
// defaults) and waits until the job's collectives are traced.
func newStallRig(t *testing.T) *stallRig {
	t.Helper()
	return newStallRigWith(t, DefaultOptions())
}

// newStallRigWith is newStallRig on the demo opts describes.
func newStallRigWith(t *testing.T, opts Options) *stallRig {
	t.Helper()
	opts.EBPF = ebpfMode()
	c, cl := startCluster(t, opts)
	job := waitFor(t, cl, c.JobID, 20*time.Second, "the demo job running", func(j *api.Job) error { return runningWith(j, 1, 4) })
	if err := waitUntil(15*time.Second, func() error {
		cs, err := cl.Collectives(context.Background(), job.GetId(), "")
		if err == nil && len(cs) == 0 {
			err = errors.New("no aggregates")
		}
		return err
	}); err != nil {
		needs.EBPF.Skip(t, "no NCCL calls traced within 15s (%v): the stall detector has nothing to read", err)
	}
	r := &stallRig{t: t, c: c, cl: cl, job: job, rank: 2}
	r.victim = rankPIDs(job)[r.rank]
	for _, jn := range job.GetPlacement() {
		for _, rk := range jn.GetRanks() {
			if rk.GetRank() == r.rank {
				r.gpu = rk.GetGpu()
			}
		}
	}
	t.Cleanup(func() { syscall.Kill(int(r.victim.pid), syscall.SIGCONT) })
	return r
}

// stallEvents counts the stall events declared for the job since t0.
func (r *stallRig) stallEvents(t0 time.Time) (declared []string) {
	r.t.Helper()
	es, err := r.cl.Events(context.Background(), &api.ListEventsRequest{SinceUnixNano: t0.UnixNano(), Limit: 10000})
	if err != nil {
		r.t.Fatal(err)
	}
	for _, e := range es {
		if e.GetKind() == api.EventKind_EVENT_KIND_STALL && e.GetJob() == r.job.GetId() && e.GetSeverity() == api.Severity_SEVERITY_CRITICAL {
			declared = append(declared, e.GetMessage())
		}
	}
	return declared
}

// healthy lets the job run for d and returns the stalls declared meanwhile
// (none, for a healthy job).
func (r *stallRig) healthy(d time.Duration) []string {
	r.t.Helper()
	t0 := time.Now()
	step0 := maxStep(r.t, r.c, r.job)
	deadline := t0.Add(d)
	for time.Now().Before(deadline) {
		time.Sleep(min(time.Until(deadline), time.Second))
	}
	if s := maxStep(r.t, r.c, r.job); s <= step0 {
		r.t.Fatalf("the job made no step in %s (step %d)", d, s)
	}
	return r.stallEvents(t0)
}

// timeFault injects f and returns how long until a finding named it, then
// ends the fault and waits until the finding clears.
func (r *stallRig) timeFault(f stallFault, limit time.Duration) (time.Duration, string) {
	r.t.Helper()
	start := time.Now()
	undo := f.inject(r)
	var took time.Duration
	var finding string
	err := waitUntil(limit, func() error {
		text, ok, err := f.found(r)
		if err != nil || !ok {
			return cmp.Or(err, errors.New("not yet"))
		}
		took, finding = time.Since(start), text
		return nil
	})
	undo()
	if err != nil {
		r.t.Fatalf("%s on rank %d (%s pid %d): not named within %s: %v", f.name, r.rank, r.victim.node, r.victim.pid, limit, err)
	}
	if f.word != "" && !strings.Contains(finding, f.word) {
		r.t.Errorf("%s: finding %q does not say %q", f.name, finding, f.word)
	}
	poll(r.t, 20*time.Second, f.name+" cleared", func() error { return f.gone(r) })
	return took, finding
}

// TestHangNamedInSeconds: in the default demo, with the stall rule at its
// defaults, a healthy stretch declares nothing, and a rank hung inside a
// collective, between collectives, or stopped by SIGSTOP is named (the
// rank, and where it stopped) within 5 s.
func TestHangNamedInSeconds(t *testing.T) {
	if testing.Short() {
		t.Skip("starts real nodemon and ringtrain processes")
	}
	r := newStallRig(t)
	if got := r.healthy(20 * time.Second); len(got) > 0 {
		t.Errorf("a healthy demo job declared %d stalls: %q", len(got), got)
	}
	for _, f := range hangFaults {
		took, diagnosis := r.timeFault(f, 5*time.Second)
		t.Logf("%s: named after %.2fs: %s", f.name, took.Seconds(), diagnosis)
	}
}

// TestHangNamedOnAsyncGPU: with the reference library completing its
// collectives asynchronously, as NCCL does on a GPU, a rank returns from
// a collective its hung GPU never completes; the profiler plugin's
// completions show it inside that collective, and it is named as fast as
// when the call itself hangs.
func TestHangNamedOnAsyncGPU(t *testing.T) {
	if testing.Short() {
		t.Skip("starts real nodemon and ringtrain processes")
	}
	opts := DefaultOptions()
	opts.JobEnv = map[string]string{"REFNCCL_ASYNC": "1"}
	opts.NCCLProfiler = filepath.Join(filepath.Dir(testbin.Ringtrain(t)), wl.ProfilerName)
	r := newStallRigWith(t, opts)
	// The stall rule learns the job's waits first; the GPU running behind
	// the host must not look like a stall meanwhile.
	if got := r.healthy(10 * time.Second); len(got) > 0 {
		t.Errorf("a healthy asynchronous job declared %d stalls: %q", len(got), got)
	}
	f := hangFaults[0]
	took, diagnosis := r.timeFault(f, 5*time.Second)
	t.Logf("%s on an asynchronous library: named after %.2fs: %s", f.name, took.Seconds(), diagnosis)
	cs, err := r.cl.Collectives(context.Background(), r.job.GetId(), "")
	if err != nil {
		t.Fatal(err)
	}
	completions := uint64(0)
	for _, c := range cs {
		completions += c.GetCompletions()
	}
	if completions == 0 {
		t.Errorf("no completion traced: the stall was found from the calls alone")
	}
}

// TestStallBench prints, for each fault of the table, the time from its
// injection to the finding that names it, and the stalls declared in a
// healthy run first (GPUCTL_STALL_BENCH_HEALTHY, default 30s; the long run
// is 10m). `make bench-stalls` runs it.
func TestStallBench(t *testing.T) {
	if os.Getenv("GPUCTL_STALL_BENCH") == "" {
		t.Skip("a benchmark: make bench-stalls (GPUCTL_STALL_BENCH=1)")
	}
	healthy := envDuration(t, "GPUCTL_STALL_BENCH_HEALTHY", 30*time.Second)
	rounds := 3
	if s := os.Getenv("GPUCTL_STALL_BENCH_ROUNDS"); s != "" {
		n, err := strconv.Atoi(s)
		if err != nil || n < 1 {
			t.Fatalf("GPUCTL_STALL_BENCH_ROUNDS=%q: want a count of at least 1", s)
		}
		rounds = n
	}
	r := newStallRig(t)
	false0 := r.healthy(healthy)
	rows := [][]string{{"fault", "time from injection to the finding"}}
	for _, f := range hangFaults {
		var times []string
		for range rounds {
			took, _ := r.timeFault(f, 60*time.Second)
			times = append(times, fmt.Sprintf("%.2fs", took.Seconds()))
			r.healthy(3 * time.Second)
		}
		rows = append(rows, []string{f.name, strings.Join(times, " ")})
	}
	rows = append(rows, []string{fmt.Sprintf("false findings in %s healthy", healthy), fmt.Sprint(len(false0))})
	var b strings.Builder
	for _, row := range rows {
		fmt.Fprintf(&b, "| %-52s | %s |\n", row[0], row[1])
	}
	t.Logf("stall benchmark (demo job at default settings, %d rounds each):\n%s", rounds, b.String())
	if len(false0) > 0 {
		t.Errorf("a healthy run declared %d stalls: %q", len(false0), false0)
	}
}
