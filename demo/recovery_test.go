package demo

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/gpuctl/gpuctl/api"
	"github.com/gpuctl/gpuctl/client"
	"github.com/gpuctl/gpuctl/controlplane"
	"github.com/gpuctl/gpuctl/controlplane/jobs"
)

// recoveryCluster starts nodes nodemons (eBPF off: recovery needs none of
// it) with no demo job.
func recoveryCluster(t *testing.T, nodes int) (*Cluster, *client.Client) {
	t.Helper()
	if testing.Short() {
		t.Skip("starts real nodemon and ringtrain processes")
	}
	opts := DefaultOptions()
	opts.Nodes, opts.JobNodes, opts.EBPF = nodes, 0, "off"
	return startCluster(t, opts)
}

// submitRing submits ringtrain, one rank on each of n nodes, checkpointing
// every 5 steps, and waits until every rank reports a pid.
func submitRing(t *testing.T, c *Cluster, cl *client.Client, n int) *api.Job {
	t.Helper()
	spec := fmt.Sprintf(`name: rt
nodes: %d
gpus_per_node: 1
command: [%q, --steps, "0", --compute-ms, "30", --bytes, 64K, --ckpt-interval, "5"]
checkpoint: {dir: %q, interval: 1h}
restart_policy: replace-node
`, n, c.opts.Ringtrain, filepath.Join(c.opts.DataDir, "ckpt", "rt"))
	r, err := cl.SubmitJob(context.Background(), &api.SubmitJobRequest{SpecYaml: spec, Source: "recovery test"})
	if err != nil {
		t.Fatal(err)
	}
	return waitFor(t, cl, r.GetJob().GetId(), 20*time.Second, "attempt 1 running", func(j *api.Job) error {
		return runningWith(j, 1, n)
	})
}

func runningWith(j *api.Job, attempt uint32, ranks int) error {
	if j.GetState() != api.JobState_JOB_STATE_RUNNING || j.GetAttempt() != attempt {
		return fmt.Errorf("%s attempt %d: %s", j.GetState(), j.GetAttempt(), j.GetReason())
	}
	if got := len(rankPIDs(j)); got != ranks {
		return fmt.Errorf("%d of %d ranks have pids", got, ranks)
	}
	return nil
}

func waitFor(t *testing.T, cl *client.Client, id string, limit time.Duration, what string, ok func(*api.Job) error) *api.Job {
	t.Helper()
	var j *api.Job
	poll(t, limit, what, func() error {
		js, err := cl.Jobs(context.Background(), id)
		if err != nil {
			return err
		}
		if len(js) != 1 {
			return fmt.Errorf("%d jobs match %s", len(js), id)
		}
		j = js[0]
		return ok(j)
	})
	return j
}

// rankPIDs maps rank → (node, pid) for ranks that reported one.
func rankPIDs(j *api.Job) map[int32]rankAt {
	out := map[int32]rankAt{}
	for _, jn := range j.GetPlacement() {
		for _, r := range jn.GetRanks() {
			if r.GetPid() != 0 {
				out[r.GetRank()] = rankAt{jn.GetNode(), r.GetPid()}
			}
		}
	}
	return out
}

type rankAt struct {
	node string
	pid  uint32
}

var stepLine = regexp.MustCompile(`^step (\d+) `)
var resumeLine = regexp.MustCompile(`^resume step=(\d+) source=(\S+)`)

// rankLog returns the highest step a rank's log printed and its resume
// lines, in order.
func rankLog(t *testing.T, c *Cluster, node, job string, rank int32) (last int64, resumes []string) {
	t.Helper()
	f, err := os.Open(filepath.Join(c.opts.DataDir, "nodes", node, "logs", job, fmt.Sprintf("rank-%d.log", rank)))
	if err != nil {
		if errors.Is(err, os.ErrNotExist) {
			return 0, nil
		}
		t.Fatal(err)
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if m := stepLine.FindStringSubmatch(sc.Text()); m != nil {
			n, _ := strconv.ParseInt(m[1], 10, 64)
			last = max(last, n)
		}
		if m := resumeLine.FindStringSubmatch(sc.Text()); m != nil {
			resumes = append(resumes, m[1]+" "+m[2])
		}
	}
	return last, resumes
}

// maxStep is the highest step any rank of the job printed.
func maxStep(t *testing.T, c *Cluster, j *api.Job) int64 {
	t.Helper()
	var top int64
	for rank, at := range rankPIDs(j) {
		s, _ := rankLog(t, c, at.node, j.GetId(), rank)
		top = max(top, s)
	}
	return top
}

func alive(pid uint32) bool { return syscall.Kill(int(pid), 0) == nil }

// checkRecovered asserts what every recovery must hold: the new attempt
// runs on none of the avoided nodes, every old rank is gone and no pid
// runs twice, every rank resumed from the same checkpoint step within one
// checkpoint interval of where the job had got to, and that step is the
// server's. It returns the resume step.
func checkRecovered(t *testing.T, c *Cluster, old, now *api.Job, failedAt int64, avoid string) int64 {
	t.Helper()
	for rank, at := range rankPIDs(now) {
		if at.node == avoid {
			t.Errorf("rank %d runs on %s again", rank, avoid)
		}
		if !alive(at.pid) {
			t.Errorf("rank %d (pid %d) of attempt 2 is not alive", rank, at.pid)
		}
	}
	for rank, at := range rankPIDs(old) {
		if alive(at.pid) {
			t.Errorf("rank %d of attempt 1 (pid %d on %s) still runs next to attempt 2", rank, at.pid, at.node)
		}
		for r2, at2 := range rankPIDs(now) {
			if at2.pid == at.pid && at2.node == at.node {
				t.Errorf("pid %d is rank %d of attempt 1 and rank %d of attempt 2", at.pid, rank, r2)
			}
		}
	}
	resume := int64(-1)
	for rank, at := range rankPIDs(now) {
		var rs []string
		poll(t, 10*time.Second, fmt.Sprintf("rank %d printed its resume line", rank), func() error {
			_, rs = rankLog(t, c, at.node, now.GetId(), rank)
			if len(rs) == 0 || !strings.HasSuffix(rs[len(rs)-1], "GPUCTL_RESUME_STEP") {
				return fmt.Errorf("resume lines %v", rs)
			}
			return nil
		})
		n, _ := strconv.ParseInt(strings.Fields(rs[len(rs)-1])[0], 10, 64)
		if resume >= 0 && n != resume {
			t.Errorf("rank %d resumed from %d, another from %d", rank, n, resume)
		}
		resume = n
	}
	if resume != now.GetResumeStep() {
		t.Errorf("ranks resumed from %d, the server says %d", resume, now.GetResumeStep())
	}
	if lost := failedAt - resume; lost < 0 || lost > 5 {
		t.Errorf("resumed from step %d after reaching %d: %d steps lost, more than the checkpoint interval of 5", resume, failedAt, lost)
	}
	if now.GetRestarts() != 1 {
		t.Errorf("restarts %d, want 1", now.GetRestarts())
	}
	return resume
}

func recoveryEvents(t *testing.T, cl *client.Client, job string) []string {
	t.Helper()
	evs, err := cl.Events(context.Background(), &api.ListEventsRequest{})
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, e := range evs {
		if e.GetKind() == api.EventKind_EVENT_KIND_RECOVERY && e.GetJob() == job {
			out = append(out, fmt.Sprintf("%.2fs %s", e.GetDurationSeconds(), e.GetMessage()))
		}
	}
	return out
}

// TestRecoverFromKilledNode kills one job node's nodemon and its rank:
// the node is down within 3 s, and the job runs again on the spare from
// its latest checkpoint.
func TestRecoverFromKilledNode(t *testing.T) {
	c, cl := recoveryCluster(t, 5)
	ctx := context.Background()
	old := submitRing(t, c, cl, 4)
	if nodes := nodeSet(old); slices.Contains(nodes, "node-04") {
		t.Fatalf("job placed on %v; the test wants node-04 as the spare", nodes)
	}
	poll(t, 15*time.Second, "12 steps trained", func() error {
		if s := maxStep(t, c, old); s < 12 {
			return fmt.Errorf("step %d", s)
		}
		return nil
	})
	// The server follows the steps the ranks print (nodemon's rank status).
	old = waitFor(t, cl, old.GetId(), 5*time.Second, "server sees step 10", func(j *api.Job) error {
		if j.GetStep() < 10 {
			return fmt.Errorf("step %d", j.GetStep())
		}
		return nil
	})
	victim := rankPIDs(old)[3]
	killed := time.Now()
	syscall.Kill(c.NodemonPID(victim.node), syscall.SIGKILL)
	syscall.Kill(-int(victim.pid), syscall.SIGKILL)
	syscall.Kill(int(victim.pid), syscall.SIGKILL)

	// The node's state may read suspect (the recovery's loss of it), so
	// the down event is what tells.
	var detected time.Duration
	poll(t, 3*time.Second, victim.node+" down", func() error {
		evs, err := cl.Events(ctx, &api.ListEventsRequest{Node: victim.node, SinceUnixNano: killed.UnixNano()})
		if err != nil {
			return err
		}
		for _, e := range evs {
			if e.GetKind() == api.EventKind_EVENT_KIND_NODE_DOWN {
				detected = time.Unix(0, e.GetTimeUnixNano()).Sub(killed)
				return nil
			}
		}
		return errors.New("no NODE_DOWN event yet")
	})
	// Within 3 s the node reads as it is: down, disconnected, its figures
	// stale, and suspect (lost by the recovery, with the reason): no
	// queued work lands there for a while, but it is not cordoned.
	poll(t, 3*time.Second-time.Since(killed), victim.node+" reads down, disconnected, stale and suspect", func() error {
		nodes, err := cl.Nodes(ctx)
		if err != nil {
			return err
		}
		for _, n := range nodes {
			if n.GetRegistration().GetName() != victim.node {
				continue
			}
			if n.GetState() != api.NodeState_NODE_STATE_DOWN || n.GetConnected() || !n.GetStale() {
				return fmt.Errorf("state %s connected %v stale %v", n.GetState().Short(), n.GetConnected(), n.GetStale())
			}
			if n.GetCordoned() || n.GetSuspectUntilUnixNano() <= time.Now().UnixNano() || !strings.Contains(n.GetSuspectReason(), old.GetId()) {
				return fmt.Errorf("cordoned %v, suspect until %s, reason %q", n.GetCordoned(),
					time.Unix(0, n.GetSuspectUntilUnixNano()).Format(time.TimeOnly), n.GetSuspectReason())
			}
			return nil
		}
		return errors.New("node not listed")
	})
	truthful := time.Since(killed)
	now := waitFor(t, cl, old.GetId(), 40*time.Second, "attempt 2 running", func(j *api.Job) error { return runningWith(j, 2, 4) })
	back := time.Since(killed)
	failedAt := maxStep(t, c, old)
	resume := checkRecovered(t, c, old, now, failedAt, victim.node)
	t.Logf("%s read down, disconnected and suspect after %.2fs", victim.node, truthful.Seconds())
	if !slices.Contains(nodeSet(now), "node-04") {
		t.Errorf("attempt 2 on %v, want the spare node-04", nodeSet(now))
	}
	poll(t, 10*time.Second, "attempt 2 trains past its resume step", func() error {
		if s := maxStep(t, c, now); s <= resume+2 {
			return fmt.Errorf("step %d", s)
		}
		return nil
	})
	evs := recoveryEvents(t, cl, now.GetId())
	if !slices.ContainsFunc(evs, func(s string) bool { return strings.Contains(s, victim.node+" suspect until") }) ||
		!slices.ContainsFunc(evs, func(s string) bool { return strings.Contains(s, "validation "+now.GetId()+"-validate-2 passed") }) {
		t.Errorf("recovery events lack the suspicion or the validation:\n%s", strings.Join(evs, "\n"))
	}
	t.Logf("killed %s (nodemon and rank 3) at step %d: node down after %.2fs, running again on %v after %.2fs, resumed from step %d (%d steps lost), lost_steps %d, downtime %.2fs",
		victim.node, failedAt, detected.Seconds(), nodeSet(now), back.Seconds(), resume, failedAt-resume, now.GetLostSteps(), now.GetDowntimeSeconds())
	t.Logf("recovery events:\n  %s", strings.Join(evs, "\n  "))
}

// TestRecoverFromXID79 injects XID 79 into a job node: the node is
// cordoned and the job recovers onto the spare.
func TestRecoverFromXID79(t *testing.T) {
	c, cl := recoveryCluster(t, 5)
	ctx := context.Background()
	old := submitRing(t, c, cl, 4)
	poll(t, 15*time.Second, "8 steps trained", func() error {
		if s := maxStep(t, c, old); s < 8 {
			return fmt.Errorf("step %d", s)
		}
		return nil
	})
	victim := rankPIDs(old)[1]
	var gpu uint32
	for _, jn := range old.GetPlacement() {
		if jn.GetNode() == victim.node {
			gpu = jn.GetGpus()[0]
		}
	}
	injected := time.Now()
	if err := cl.InjectFault(ctx, victim.node, &api.InjectFault{GpuIndex: int32(gpu), Kind: api.FaultKind_FAULT_KIND_XID79}); err != nil {
		t.Fatal(err)
	}
	poll(t, 10*time.Second, victim.node+" cordoned", func() error {
		nodes, err := cl.Nodes(ctx)
		if err != nil {
			return err
		}
		for _, n := range nodes {
			if n.GetRegistration().GetName() == victim.node {
				if !n.GetCordoned() {
					return fmt.Errorf("state %s, not cordoned", n.GetState().Short())
				}
				if !strings.Contains(n.GetCordonReason(), "XID") && !strings.Contains(n.GetCordonReason(), "faulted") {
					return fmt.Errorf("cordon reason %q does not name the fault", n.GetCordonReason())
				}
			}
		}
		return nil
	})
	cordoned := time.Since(injected)
	now := waitFor(t, cl, old.GetId(), 40*time.Second, "attempt 2 running", func(j *api.Job) error { return runningWith(j, 2, 4) })
	back := time.Since(injected)
	failedAt := maxStep(t, c, old)
	resume := checkRecovered(t, c, old, now, failedAt, victim.node)
	if !slices.Contains(nodeSet(now), "node-04") {
		t.Errorf("attempt 2 on %v, want the spare node-04", nodeSet(now))
	}
	t.Logf("XID 79 on %s GPU %d at step %d: cordoned after %.2fs, running again on %v after %.2fs, resumed from step %d",
		victim.node, gpu, failedAt, cordoned.Seconds(), nodeSet(now), back.Seconds(), resume)
}

// TestServerRestartKeepsJobRunning stops the server under a running job
// without letting it touch the job, and starts a new one on the same data
// dir and port: the job is still running with the same pids, no rank was
// restarted, and it keeps training.
func TestServerRestartKeepsJobRunning(t *testing.T) {
	c, cl := recoveryCluster(t, 2)
	old := submitRing(t, c, cl, 2)
	poll(t, 15*time.Second, "8 steps trained", func() error {
		if s := maxStep(t, c, old); s < 8 {
			return fmt.Errorf("step %d", s)
		}
		return nil
	})
	cl.Close()
	addr := c.Server.Addr().String()
	srvDir := filepath.Join(c.opts.DataDir, "server")
	// The store is written before anything is acknowledged, so ending the
	// serve loop (store closed, no job touched) leaves what a kill -9 would.
	c.cancel()
	<-c.served
	stopped := time.Now()
	before := maxStep(t, c, old)

	srv, err := controlplane.New(controlplane.Config{DataDir: srvDir, Listen: addr,
		ValidateCommand: []string{c.opts.Ringtrain, "--steps", "3"}})
	if err != nil {
		t.Fatal(err)
	}
	sctx, cancel := context.WithCancel(context.Background())
	if err := srv.Listen(sctx); err != nil {
		cancel()
		t.Fatal(err)
	}
	c.Server, c.cancel, c.served = srv, cancel, make(chan error, 1)
	go func() { c.served <- srv.Serve(sctx) }()
	cl2, err := client.Dial(context.Background(), c.Config)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cl2.Close() })

	// For 8 s after the stop (the nodes are back long before) the job must still
	// be attempt 1 with the same pids, every one alive.
	poll(t, 15*time.Second, "nodes back", func() error {
		nodes, err := cl2.Nodes(context.Background())
		if err != nil {
			return err
		}
		for _, n := range nodes {
			if !n.GetConnected() {
				return fmt.Errorf("%s not connected", n.GetRegistration().GetName())
			}
		}
		return nil
	})
	reconnected := time.Since(stopped)
	deadline := stopped.Add(8 * time.Second)
	for time.Now().Before(deadline) {
		js, err := cl2.Jobs(context.Background(), old.GetId())
		if err != nil || len(js) != 1 {
			t.Fatalf("jobs after restart: %v %v", js, err)
		}
		if err := runningWith(js[0], 1, 2); err != nil {
			t.Fatalf("after the server restart: %v", err)
		}
		if !equalPIDs(rankPIDs(js[0]), rankPIDs(old)) {
			t.Fatalf("pids changed: %v → %v", rankPIDs(old), rankPIDs(js[0]))
		}
		time.Sleep(250 * time.Millisecond)
	}
	for rank, at := range rankPIDs(old) {
		if !alive(at.pid) {
			t.Errorf("rank %d (pid %d) died across the server restart", rank, at.pid)
		}
		if _, rs := rankLog(t, c, at.node, old.GetId(), rank); len(rs) != 1 {
			t.Errorf("rank %d started %d times: %v", rank, len(rs), rs)
		}
	}
	poll(t, 10*time.Second, "training goes on", func() error {
		if s := maxStep(t, c, old); s <= before+5 {
			return fmt.Errorf("step %d, was %d at the restart", s, before)
		}
		return nil
	})
	if evs := recoveryEvents(t, cl2, old.GetId()); len(evs) != 0 {
		t.Errorf("recovery ran across a server restart:\n%s", strings.Join(evs, "\n"))
	}
	t.Logf("server restarted at step %d: nodes reconnected after %.2fs, job still attempt 1 with pids %v after %.0fs",
		before, reconnected.Seconds(), rankPIDs(old), time.Since(stopped).Seconds())
}

func equalPIDs(a, b map[int32]rankAt) bool {
	if len(a) != len(b) {
		return false
	}
	for k, v := range a {
		if b[k] != v {
			return false
		}
	}
	return true
}

func nodeSet(j *api.Job) []string {
	var out []string
	for _, jn := range j.GetPlacement() {
		out = append(out, jn.GetNode())
	}
	slices.Sort(out)
	return out
}

// TestRecoverFromStall stops one rank (SIGSTOP) of a job with
// stall_recovery auto: the stall detector names the rank, and the job
// restarts from its checkpoint without that rank's node. The detector
// reads the ranks' NCCL calls, so this needs eBPF.
func TestRecoverFromStall(t *testing.T) {
	if testing.Short() {
		t.Skip("starts real nodemon and ringtrain processes")
	}
	opts := DefaultOptions()
	opts.Nodes, opts.JobNodes, opts.EBPF = 3, 0, ebpfMode()
	c, cl := startCluster(t, opts)
	ctx := context.Background()
	spec := fmt.Sprintf(`name: stalls
nodes: 2
gpus_per_node: 1
command: [%q, --steps, "0", --compute-ms, "30", --bytes, 64K, --ckpt-interval, "5"]
checkpoint: {dir: %q, interval: 1h}
restart_policy: replace-node
stall_threshold: 2s
stall_recovery: auto
`, c.opts.Ringtrain, filepath.Join(c.opts.DataDir, "ckpt", "stalls"))
	r, err := cl.SubmitJob(ctx, &api.SubmitJobRequest{SpecYaml: spec, Source: "stall test"})
	if err != nil {
		t.Fatal(err)
	}
	old := waitFor(t, cl, r.GetJob().GetId(), 20*time.Second, "attempt 1 running", func(j *api.Job) error { return runningWith(j, 1, 2) })
	poll(t, 15*time.Second, "8 steps trained", func() error {
		if s := maxStep(t, c, old); s < 8 {
			return fmt.Errorf("step %d", s)
		}
		return nil
	})
	requireTraced(t, cl, old.GetId(), 10*time.Second, "the stall detector")
	victim := rankPIDs(old)[1]
	stopped := time.Now()
	syscall.Kill(int(victim.pid), syscall.SIGSTOP)
	t.Cleanup(func() { syscall.Kill(int(victim.pid), syscall.SIGKILL) })
	var named time.Duration
	poll(t, 15*time.Second, "stall names the stopped rank", func() error {
		stalls, err := cl.ListStalls(ctx, old.GetId())
		if err != nil {
			return err
		}
		for _, s := range stalls {
			for _, lr := range s.GetLaggingRanks() {
				if lr.GetNode() == victim.node {
					named = time.Since(stopped)
					return nil
				}
			}
		}
		js, _ := cl.Jobs(ctx, old.GetId())
		if len(js) == 1 && js[0].GetAttempt() > 1 {
			named = time.Since(stopped)
			return nil // recovered already: the stall was named and acted on
		}
		return fmt.Errorf("stalls %v", stalls)
	})
	now := waitFor(t, cl, old.GetId(), 30*time.Second, "attempt 2 running", func(j *api.Job) error { return runningWith(j, 2, 2) })
	back := time.Since(stopped)
	if slices.Contains(nodeSet(now), victim.node) || !slices.Contains(now.GetExclude(), victim.node) {
		t.Errorf("attempt 2 on %v excluding %v; the lagging node %s must be avoided", nodeSet(now), now.GetExclude(), victim.node)
	}
	t.Logf("SIGSTOP rank 1 on %s: stall named after %.2fs, running again on %v after %.2fs", victim.node, named.Seconds(), nodeSet(now), back.Seconds())
}

// TestBadCommandCordonsNoNode submits a job whose command does not exist:
// the job fails with the launch error, and no healthy node is cordoned.
func TestBadCommandCordonsNoNode(t *testing.T) {
	c, cl := recoveryCluster(t, 3)
	passes := &jobs.PassCount{}
	c.Server.SetObserver(passes)
	ctx := context.Background()
	r, err := cl.SubmitJob(ctx, &api.SubmitJobRequest{Source: "typo.yaml",
		SpecYaml: "name: typo\nnodes: 2\ngpus_per_node: 1\ncommand: [/nonexistent/train]\nrestart_policy: replace-node\n"})
	if err != nil {
		t.Fatal(err)
	}
	j := waitFor(t, cl, r.GetJob().GetId(), 20*time.Second, "the job failed", func(j *api.Job) error {
		if j.GetState() != api.JobState_JOB_STATE_FAILED {
			return fmt.Errorf("%s: %s", j.GetState(), j.GetReason())
		}
		return nil
	})
	if !strings.Contains(j.GetReason(), `"/nonexistent/train" not found`) || j.GetRestarts() != 0 {
		t.Errorf("failed with %q after %d restarts, want the launch error and none", j.GetReason(), j.GetRestarts())
	}
	// Let two more of the owner's passes go by, in which a wrong recovery
	// would have acted, then look: no node may be cordoned for the job's
	// typo.
	seen := passes.Passes()
	poll(t, 10*time.Second, "two more scheduling passes", func() error {
		if n := passes.Passes() - seen; n < 2 {
			return fmt.Errorf("%d passes so far", n)
		}
		return nil
	})
	nodes, err := cl.Nodes(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for _, n := range nodes {
		if n.GetCordoned() || n.GetState() != api.NodeState_NODE_STATE_READY {
			t.Errorf("%s is %s cordoned=%v (%s) after a job's bad command", n.GetRegistration().GetName(), n.GetState().Short(), n.GetCordoned(), n.GetCordonReason())
		}
	}
}
