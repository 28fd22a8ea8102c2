package demo

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/gpuctl/gpuctl/api"
	"github.com/gpuctl/gpuctl/client"
)

// attemptProc is a live process of a job's attempt (a rank or its shim),
// found in /proc by the environment nodemon gives it.
type attemptProc struct {
	pid     int
	node    string
	attempt string
}

// attemptProcs lists every live process (zombies aside) whose environment
// names job id, with its checkpoint dir under dataDir (this test's
// cluster), of attempt when it is not "".
func attemptProcs(t *testing.T, dataDir, id, attempt string) []attemptProc {
	t.Helper()
	return jobProcsWhere(t, func(vars map[string]string) bool {
		return vars["GPUCTL_JOB"] == id && strings.HasPrefix(vars["GPUCTL_CHECKPOINT_DIR"], dataDir) &&
			(attempt == "" || vars["GPUCTL_ATTEMPT"] == attempt)
	})
}

// jobProcs lists every live process (zombies aside) whose environment
// names job id.
func jobProcs(t *testing.T, id string) []attemptProc {
	t.Helper()
	return jobProcsWhere(t, func(vars map[string]string) bool { return vars["GPUCTL_JOB"] == id })
}

// jobProcsWhere lists every live process (zombies aside) whose
// environment keep takes.
func jobProcsWhere(t *testing.T, keep func(vars map[string]string) bool) []attemptProc {
	t.Helper()
	ents, err := os.ReadDir("/proc")
	if err != nil {
		t.Fatal(err)
	}
	var out []attemptProc
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		vars, err := readEnviron(uint32(pid))
		if err != nil || !keep(vars) || !running(pid) {
			continue
		}
		out = append(out, attemptProc{pid: pid, node: vars["GPUCTL_NODE"], attempt: vars["GPUCTL_ATTEMPT"]})
	}
	return out
}

// submitOneNode submits ringtrain with both its ranks on one node,
// checkpointing every 5 steps, and waits until they report pids.
func submitOneNode(t *testing.T, c *Cluster, cl *client.Client, name string) *api.Job {
	t.Helper()
	spec := fmt.Sprintf(`name: %s
nodes: 1
gpus_per_node: 2
command: [%q, --steps, "0", --compute-ms, "30", --bytes, 64K, --ckpt-interval, "5"]
checkpoint: {dir: %q, interval: 1h}
restart_policy: replace-node
`, name, c.opts.Ringtrain, filepath.Join(c.opts.DataDir, "ckpt", name))
	r, err := cl.SubmitJob(context.Background(), &api.SubmitJobRequest{SpecYaml: spec, Source: "fencing test"})
	if err != nil {
		t.Fatal(err)
	}
	waitFor(t, cl, r.GetJob().GetId(), 20*time.Second, "attempt 1 running", func(j *api.Job) error {
		return runningWith(j, 1, 2)
	})
	// A checkpoint the server knows of, so the next attempt resumes from it.
	return waitFor(t, cl, r.GetJob().GetId(), 20*time.Second, "the server sees a checkpoint", func(j *api.Job) error {
		if j.GetLastCheckpointStep() < 5 || j.GetStep() < 8 {
			return fmt.Errorf("step %d, checkpoint %d", j.GetStep(), j.GetLastCheckpointStep())
		}
		return nil
	})
}

// stopProcess stops pid with SIGSTOP; resume continues it, as the test's
// cleanup does if the test ends first.
func stopProcess(t *testing.T, pid int) (stopped time.Time, resume func()) {
	t.Helper()
	if err := syscall.Kill(pid, syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	var once sync.Once
	resume = func() { once.Do(func() { syscall.Kill(pid, syscall.SIGCONT) }) }
	t.Cleanup(resume)
	return time.Now(), resume
}

// TestSIGSTOPPartitionFencesOldAttempt stops a job's nodemon with SIGSTOP
// for 10 s: the node is declared down, the job restarts on the spare once
// the old attempt is fenced (its ranks' shims stop them when the lease
// passes, whatever nodemon does), and when the node comes back no rank of
// attempt 1 is alive 5 s later; a cancel then leaves no rank of any
// attempt. Today's main fails it: the old ranks train on beside attempt 2,
// into the same checkpoint dir, and survive the cancel.
func TestSIGSTOPPartitionFencesOldAttempt(t *testing.T) {
	c, cl := recoveryCluster(t, 2)
	ctx := context.Background()
	lease := c.opts.Lease
	old := submitOneNode(t, c, cl, "fence")
	id := old.GetId()
	victim := nodeSet(old)[0]
	if n := len(attemptProcs(t, c.opts.DataDir, id, "1")); n != 4 {
		t.Fatalf("%d processes of attempt 1 (2 ranks and their shims), want 4", n)
	}
	nodemon := c.NodemonPID(victim)
	stopped, sigcont := stopProcess(t, nodemon)

	// While nodemon is stopped: the node goes down, the old ranks stop when
	// the lease runs out, and attempt 2 runs on the spare only after.
	var fencedAt, downAt, relaunchedAt time.Duration
	var now *api.Job
	for time.Since(stopped) < 30*time.Second && (relaunchedAt == 0 || fencedAt == 0 && time.Since(stopped) < 10*time.Second) {
		if fencedAt == 0 && !slices.ContainsFunc(attemptProcs(t, c.opts.DataDir, id, "1"), func(p attemptProc) bool { return p.node == victim }) {
			fencedAt = time.Since(stopped)
		}
		if relaunchedAt == 0 {
			if js, err := cl.Jobs(ctx, id); err == nil && len(js) == 1 && runningWith(js[0], 2, 2) == nil {
				relaunchedAt, now = time.Since(stopped), js[0]
				if fencedAt == 0 {
					t.Errorf("attempt 2 runs %.2fs after the SIGSTOP while attempt 1's ranks still run on %s", relaunchedAt.Seconds(), victim)
				}
			}
		}
		time.Sleep(20 * time.Millisecond)
	}
	if relaunchedAt == 0 {
		js, _ := cl.Jobs(ctx, id)
		t.Fatalf("attempt 2 not running 30 s after the SIGSTOP: %v", js)
	}
	if fencedAt == 0 {
		t.Errorf("attempt 1 still runs on %s %.1fs after the SIGSTOP (lease %s)", victim, time.Since(stopped).Seconds(), lease)
	}
	evs, err := cl.Events(ctx, &api.ListEventsRequest{Node: victim, SinceUnixNano: stopped.UnixNano()})
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range evs {
		if e.GetKind() == api.EventKind_EVENT_KIND_NODE_DOWN && downAt == 0 {
			downAt = time.Unix(0, e.GetTimeUnixNano()).Sub(stopped)
		}
	}
	if fencedAt > lease+time.Second+time.Second/2 {
		t.Errorf("attempt 1 stopped %.2fs after the SIGSTOP, more than the %s lease plus its kill grace", fencedAt.Seconds(), lease)
	}
	if slices.Contains(nodeSet(now), victim) {
		t.Errorf("attempt 2 on %v, want the spare, not %s", nodeSet(now), victim)
	}
	if rest := 10*time.Second - time.Since(stopped); rest > 0 {
		time.Sleep(rest)
	}
	sigcont()
	back := time.Now()
	stoppedFor := back.Sub(stopped)

	// 5 s after the node returns, nothing of attempt 1 lives anywhere.
	deadline := back.Add(5 * time.Second)
	for time.Now().Before(deadline) {
		time.Sleep(100 * time.Millisecond)
	}
	if left := attemptProcs(t, c.opts.DataDir, id, "1"); len(left) > 0 {
		t.Errorf("5 s after %s returned, attempt 1 still runs: %v", victim, left)
	}
	var readyAfter time.Duration
	poll(t, 20*time.Second, victim+" reconnected", func() error {
		for _, n := range c.Server.Nodes() {
			if n.GetRegistration().GetName() == victim && n.GetConnected() {
				readyAfter = time.Since(back)
				return nil
			}
		}
		return errors.New("not connected")
	})
	// Attempt 2 owns the checkpoint dir: its commits carry its epoch.
	resume := now.GetResumeStep()
	var latest []byte
	for end := time.Now().Add(15 * time.Second); time.Now().Before(end); time.Sleep(100 * time.Millisecond) {
		if latest, _ = os.ReadFile(filepath.Join(c.opts.DataDir, "ckpt", "fence", "latest")); strings.HasSuffix(string(latest), " attempt=2") {
			break
		}
	}
	if !strings.HasSuffix(string(latest), " attempt=2") {
		t.Errorf("latest is %q 15 s after attempt 2 started, want a commit of attempt 2", latest)
	}
	if n := len(attemptProcs(t, c.opts.DataDir, id, "2")); n != 4 {
		t.Errorf("%d processes of attempt 2, want 4", n)
	}

	if _, err := cl.CancelJob(ctx, id); err != nil {
		t.Fatal(err)
	}
	cancelled := time.Now()
	poll(t, 15*time.Second, "no rank of any attempt after cancel", func() error {
		if left := attemptProcs(t, c.opts.DataDir, id, ""); len(left) > 0 {
			return fmt.Errorf("still running: %v", left)
		}
		return nil
	})
	goneAfter := time.Since(cancelled)
	fences := recoveryEvents(t, cl, id)
	t.Logf("SIGSTOP of %s's nodemon for %.1fs (lease %s): down after %.2fs, attempt 1 stopped by its shims after %.2fs, attempt 2 on %v (from step %d) after %.2fs; node reconnected %.2fs after SIGCONT; cancel left nothing after %.2fs",
		victim, stoppedFor.Seconds(), lease, downAt.Seconds(), fencedAt.Seconds(), nodeSet(now), resume, relaunchedAt.Seconds(),
		readyAfter.Seconds(), goneAfter.Seconds())
	t.Logf("recovery events:\n  %s", strings.Join(fences, "\n  "))
}

// TestNodeFencesItselfAfterLease cuts the only node of a cluster off from
// the server (the server stops; nodemon runs on and keeps trying) for
// longer than the lease: with no other node to vouch for it, its ranks are
// stopped once the lease from its last answered heartbeat has passed, not
// before. (With other nodes to witness for it, a node whose server is away
// keeps its ranks: TestControlPlaneAwayStopsNoRank.)
func TestNodeFencesItselfAfterLease(t *testing.T) {
	if testing.Short() {
		t.Skip("starts real nodemon and ringtrain processes")
	}
	opts := DefaultOptions()
	opts.Nodes, opts.JobNodes, opts.EBPF, opts.Lease = 1, 0, "off", 3*time.Second
	c, cl := startCluster(t, opts)
	j := submitOneNode(t, c, cl, "cut")
	cl.Close()
	c.StopServer()
	cut := time.Now()
	var gone time.Duration
	for time.Since(cut) < 3*opts.Lease {
		if len(attemptProcs(t, c.opts.DataDir, j.GetId(), "")) == 0 {
			gone = time.Since(cut)
			break
		}
		time.Sleep(20 * time.Millisecond)
	}
	if gone == 0 {
		t.Fatalf("ranks still run %s after the node was cut off (lease %s)", 3*opts.Lease, opts.Lease)
	}
	// The last renewal answered a heartbeat at most one interval before the
	// cut; the shims check every 100 ms and SIGKILL 500 ms after SIGTERM.
	if lo, hi := opts.Lease-opts.Heartbeat-500*time.Millisecond, opts.Lease+time.Second; gone < lo || gone > hi {
		t.Errorf("ranks stopped %.2fs after the cut, want between %s and %s", gone.Seconds(), lo, hi)
	}
	if err := syscall.Kill(c.NodemonPID(c.NodeNames[0]), 0); err != nil {
		t.Fatalf("nodemon is gone (%v): the test wants it cut off, not dead", err)
	}
	for rank := range 2 {
		b, err := os.ReadFile(filepath.Join(c.opts.DataDir, "nodes", c.NodeNames[0], "logs", j.GetId(), fmt.Sprintf("rank-%d.log", rank)))
		if err != nil {
			t.Fatal(err)
		}
		if !strings.Contains(string(b), "stopped by its shim: lease expired") {
			t.Errorf("rank %d's log does not say its lease stopped it:\n%s", rank, b)
		}
	}
	t.Logf("cut off from the server (lease %s, heartbeat %s): ranks stopped %.2fs after the cut", opts.Lease, opts.Heartbeat, gone.Seconds())
}

// TestReturningNodeFencesBeforeReady stops a job's nodemon for less than
// the lease: the old ranks still run when the node comes back, so the
// relaunch waits for the node, whose old ranks are killed before it is
// ready again (by the server, or by the node once its witness said the
// attempt is superseded);
// attempt 2 starts only once they are gone: on the spare, or on the
// returned node once a validation gang passed there (it is suspect).
func TestReturningNodeFencesBeforeReady(t *testing.T) {
	if testing.Short() {
		t.Skip("starts real nodemon and ringtrain processes")
	}
	opts := DefaultOptions()
	opts.Nodes, opts.JobNodes, opts.EBPF, opts.Lease = 2, 0, "off", 60*time.Second
	c, cl := startCluster(t, opts)
	ctx := context.Background()
	old := submitOneNode(t, c, cl, "back")
	id, victim := old.GetId(), nodeSet(old)[0]
	nodemon := c.NodemonPID(victim)
	stopped, sigcont := stopProcess(t, nodemon)
	poll(t, 5*time.Second, victim+" down", func() error {
		for _, n := range c.Server.Nodes() {
			if n.GetRegistration().GetName() == victim && n.GetState() == api.NodeState_NODE_STATE_DOWN {
				return nil
			}
		}
		return errors.New("not down")
	})
	for time.Since(stopped) < 5*time.Second {
		if js, err := cl.Jobs(ctx, id); err == nil && len(js) == 1 && js[0].GetAttempt() > 1 {
			t.Fatalf("attempt %d started %.2fs after the SIGSTOP, while attempt 1 runs on under its lease", js[0].GetAttempt(), time.Since(stopped).Seconds())
		}
		time.Sleep(50 * time.Millisecond)
	}
	if n := len(attemptProcs(t, c.opts.DataDir, id, "1")); n != 4 {
		t.Fatalf("%d processes of attempt 1 under a 60 s lease, want 4 still running", n)
	}
	sigcont()
	back := time.Now()
	var fencedAfter time.Duration
	now := waitFor(t, cl, id, 30*time.Second, "attempt 2 running", func(j *api.Job) error {
		if fencedAfter == 0 && len(attemptProcs(t, c.opts.DataDir, id, "1")) == 0 {
			fencedAfter = time.Since(back)
		}
		return runningWith(j, 2, 2)
	})
	relaunched := time.Since(back)
	if left := attemptProcs(t, c.opts.DataDir, id, "1"); len(left) > 0 {
		t.Errorf("attempt 2 runs beside attempt 1: %v", left)
	}
	evs := recoveryEvents(t, cl, id)
	if slices.Contains(nodeSet(now), victim) && !slices.ContainsFunc(evs, func(e string) bool { return strings.Contains(e, "passed on "+victim) }) {
		t.Errorf("attempt 2 on %v, the returned suspect node, with no validation passed there:\n%s", nodeSet(now), strings.Join(evs, "\n"))
	}
	// The returning node's old ranks are killed either by the server before
	// the node is ready, or already by the node itself: its witness (the
	// spare) told it on its first round of vouches that attempt 1 is
	// superseded, and it came back without them.
	if !slices.ContainsFunc(evs, func(e string) bool {
		return strings.Contains(e, "fenced on "+victim+" before it was ready: killed attempt 1 rank 0") ||
			strings.Contains(e, "attempt 1 fenced on "+victim+": the node came back without any of its ranks")
	}) || !slices.ContainsFunc(evs, func(e string) bool { return strings.Contains(e, "attempt 1 fenced on "+victim+": the node came back") }) {
		t.Errorf("no recovery event says attempt 1 was fenced on %s when it came back:\n%s", victim, strings.Join(evs, "\n"))
	}
	t.Logf("SIGSTOP of %s for %.1fs under a %s lease: attempt 1 killed %.2fs after SIGCONT, attempt 2 on %v %.2fs after SIGCONT",
		victim, back.Sub(stopped).Seconds(), opts.Lease, fencedAfter.Seconds(), nodeSet(now), relaunched.Seconds())
	t.Logf("recovery events:\n  %s", strings.Join(evs, "\n  "))
}
