package agent

import (
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/gpuctl/gpuctl/api"
	"github.com/gpuctl/gpuctl/internal/needs"
	"github.com/gpuctl/gpuctl/procfs"
)

type eventLog struct {
	mu     sync.Mutex
	events []*api.Event
}

func (l *eventLog) add(e *api.Event) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.events = append(l.events, e)
}

func (l *eventLog) match(ok func(*api.Event) bool) []*api.Event {
	l.mu.Lock()
	defer l.mu.Unlock()
	var out []*api.Event
	for _, e := range l.events {
		if ok(e) {
			out = append(out, e)
		}
	}
	return out
}

// waitFor polls until an event satisfies ok or the deadline passes.
func (l *eventLog) waitFor(t *testing.T, what string, ok func(*api.Event) bool) *api.Event {
	t.Helper()
	var got *api.Event
	eventually(t, "a "+what+" event", 15*time.Second, func() bool {
		if m := l.match(ok); len(m) > 0 {
			got = m[0]
			return true
		}
		return false
	})
	return got
}

func isExit(job string, rank int32) func(*api.Event) bool {
	return func(e *api.Event) bool {
		return e.Kind == api.EventKind_EVENT_KIND_PROCESS_EXIT && e.Job == job && e.Rank == rank
	}
}

type testExec struct {
	x      *Executor
	events *eventLog
	dir    string
}

// newTestExecutor starts an executor on dir (a new temp dir when empty);
// cleanup stops its ranks and closes it.
func newTestExecutor(t *testing.T, dir string, tweak ...func(*ExecutorOptions)) testExec {
	t.Helper()
	if dir == "" {
		dir = t.TempDir()
	}
	events := &eventLog{}
	opts := ExecutorOptions{
		Node: "node-a", DataDir: dir, OnEvent: events.add, Log: slog.New(slog.NewTextHandler(io.Discard, nil)),
		CgroupRoot: "off", Poll: 50 * time.Millisecond,
		// These tests run their ranks as whoever runs the tests (root in CI).
		AllowRootRanks: true,
	}
	for _, f := range tweak {
		f(&opts)
	}
	x, err := NewExecutor(opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		x.StopAll(time.Second)
		x.Close()
	})
	return testExec{x: x, events: events, dir: dir}
}

// killOnCleanup makes sure pid's process group is gone after the test,
// whatever the executors did.
func killOnCleanup(t *testing.T, pid int) {
	t.Cleanup(func() { syscall.Kill(-pid, syscall.SIGKILL) })
}

// onOwner runs fn on x's owner goroutine, where the executor's own code
// runs, and commits what it changed.
func onOwner(t *testing.T, x *Executor, fn func()) {
	t.Helper()
	if _, err := x.do(func() (any, error) { fn(); return nil, nil }); err != nil {
		t.Fatal(err)
	}
}

// rankRec is what the executor keeps of a rank it knows.
func rankRec(t *testing.T, x *Executor, job string, rank int32) rankRecord {
	t.Helper()
	var rec *rankRecord
	onOwner(t, x, func() {
		if p := x.ranks[job][rank]; p != nil {
			r := p.rec
			rec = &r
		}
	})
	if rec == nil {
		t.Fatalf("no rank %d of job %s", rank, job)
	}
	return *rec
}

// rankPID is the pid of a rank the executor knows.
func rankPID(t *testing.T, x *Executor, job string, rank int32) int {
	t.Helper()
	return rankRec(t, x, job, rank).PID
}

func sleepJob(job string, attempt uint32, ranks ...int32) *api.LaunchRanks {
	l := &api.LaunchRanks{Job: job, Attempt: attempt, Command: []string{"/bin/sleep", "300"}, WorldSize: int32(len(ranks))}
	for _, r := range ranks {
		l.Ranks = append(l.Ranks, &api.RankSpec{Rank: r, LocalRank: r, Gpus: []uint32{uint32(r)}})
	}
	return l
}

func TestExecutorLaunchSetsRankEnvironment(t *testing.T) {
	e := newTestExecutor(t, "")
	l := &api.LaunchRanks{
		Job: "j1", Attempt: 1, Command: []string{"/bin/sh", "-c", "env; exit 3"},
		Env: map[string]string{"NCCL_DEBUG": "WARN"}, WorldSize: 4, MasterAddr: "127.0.0.1", MasterPort: 29500,
		CheckpointDir: "/tmp/ckpt", ResumeStep: 40,
		Ranks: []*api.RankSpec{{Rank: 2, LocalRank: 0, Gpus: []uint32{4, 5}}},
	}
	if err := e.x.Launch(l); err != nil {
		t.Fatal(err)
	}
	ev := e.events.waitFor(t, "exit", isExit("j1", 2))
	if ev.ExitCode != 3 || ev.Signal != "" {
		t.Fatalf("exit event = %v", ev)
	}
	out, err := os.ReadFile(logPath(e.dir, "j1", 2))
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"RANK=2", "LOCAL_RANK=0", "WORLD_SIZE=4", "LOCAL_WORLD_SIZE=1", "MASTER_ADDR=127.0.0.1",
		"MASTER_PORT=29500", "CUDA_VISIBLE_DEVICES=4,5", "GPUCTL_JOB=j1", "GPUCTL_NODE=node-a", "NCCL_DEBUG=WARN",
		"GPUCTL_CHECKPOINT_DIR=/tmp/ckpt", "GPUCTL_RESUME_STEP=40", "GPUCTL_ATTEMPT=1"} {
		if !strings.Contains(string(out), "\n"+want+"\n") {
			t.Errorf("rank environment lacks %s", want)
		}
	}
	if !strings.Contains(string(out), "gpuctl: rank 2 exited with code 3") {
		t.Errorf("log lacks the shim's exit line:\n%s", out)
	}
}

func TestExecutorLaunchIsIdempotentAndSignals(t *testing.T) {
	e := newTestExecutor(t, "")
	l := sleepJob("j2", 1, 0)
	for range 2 {
		if err := e.x.Launch(l); err != nil {
			t.Fatal(err)
		}
	}
	pids := e.x.GPUProcesses()[0]
	if len(pids) != 1 {
		t.Fatalf("GPU 0 has %d processes after a repeated launch, want 1", len(pids))
	}
	killOnCleanup(t, int(pids[0]))
	if err := e.x.Launch(sleepJob("j2", 2, 0)); err == nil || !strings.Contains(err.Error(), "still runs") {
		t.Fatalf("launch of attempt 2 over a live attempt 1: err = %v, want a refusal", err)
	}
	if err := e.x.Signal(&api.SignalRanks{Job: "j2", Signal: "SIGBOGUS"}); err == nil {
		t.Fatal("unknown signal accepted")
	}
	if err := e.x.Signal(&api.SignalRanks{Job: "nope", Signal: "SIGTERM"}); err == nil {
		t.Fatal("signal to an unknown job accepted")
	}
	if err := e.x.Signal(&api.SignalRanks{Job: "j2", Signal: "sigkill"}); err != nil {
		t.Fatal(err)
	}
	ev := e.events.waitFor(t, "exit", isExit("j2", 0))
	if ev.Signal != "SIGKILL" || ev.Pid != pids[0] {
		t.Fatalf("exit = %v, want SIGKILL of pid %d", ev, pids[0])
	}
	if got := e.x.GPUProcesses()[0]; len(got) != 0 {
		t.Fatalf("exited rank still listed on GPU 0: %v", got)
	}
}

func TestExecutorRefusesBadLaunch(t *testing.T) {
	e := newTestExecutor(t, "")
	tests := []struct {
		name string
		l    *api.LaunchRanks
		want string
	}{
		{"no command", &api.LaunchRanks{Job: "j", Ranks: []*api.RankSpec{{}}}, "required"},
		{"no ranks", &api.LaunchRanks{Job: "j", Command: []string{"/bin/true"}}, "required"},
		{"missing binary", &api.LaunchRanks{Job: "j", Command: []string{"/no/such/bin"}, Ranks: []*api.RankSpec{{}}}, "not found"},
		{"job escapes the log dir", &api.LaunchRanks{Job: "../x", Command: []string{"/bin/true"}, Ranks: []*api.RankSpec{{}}}, "job name"},
		{"hidden job", &api.LaunchRanks{Job: ".x", Command: []string{"/bin/true"}, Ranks: []*api.RankSpec{{}}}, "job name"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			err := e.x.Launch(tc.l)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("err = %v, want one saying %q", err, tc.want)
			}
		})
	}
}

func TestStopEscalatesToSIGKILLForTheWholeGroup(t *testing.T) {
	e := newTestExecutor(t, "")
	// The rank and its child both ignore SIGTERM; the child stays in the
	// rank's process group.
	l := &api.LaunchRanks{Job: "stubborn", Attempt: 1, WorldSize: 1, Ranks: []*api.RankSpec{{Rank: 0}},
		Command: []string{"/bin/sh", "-c", `trap "" TERM; sleep 300 & echo child=$!; wait`}}
	if err := e.x.Launch(l); err != nil {
		t.Fatal(err)
	}
	killOnCleanup(t, rankPID(t, e.x, "stubborn", 0))
	child := 0
	eventually(t, "child pid in the log", 10*time.Second, func() bool {
		child = childPID(logPath(e.dir, "stubborn", 0))
		return child > 0
	})
	start := time.Now()
	if err := e.x.Stop("stubborn", nil, 300*time.Millisecond); err != nil {
		t.Fatal(err)
	}
	if d := time.Since(start); d < 300*time.Millisecond {
		t.Fatalf("Stop returned after %s, before the grace ran out", d)
	}
	ev := e.events.waitFor(t, "exit", isExit("stubborn", 0))
	if ev.Signal != "SIGKILL" {
		t.Fatalf("exit = %v, want SIGKILL after SIGTERM was ignored", ev)
	}
	eventually(t, "the rank's child gone", 5*time.Second, func() bool {
		st, err := procfs.ReadStat("/proc", child)
		return err != nil || st.State == "Z" // a zombie waits for init to reap it
	})
}

// childPID finds the "child=PID" line a test rank prints.
func childPID(path string) int {
	b, _ := os.ReadFile(path)
	for _, l := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(l, "child="); ok {
			n, _ := strconv.Atoi(v)
			return n
		}
	}
	return 0
}

// crash simulates a nodemon crash: the executor stops watching and
// persisting, and its ranks run on.
func crash(e testExec) { e.x.Close() }

func TestAdoptionAfterRestart(t *testing.T) {
	dir := t.TempDir()
	first := newTestExecutor(t, dir)
	l := &api.LaunchRanks{Job: "adopt", Attempt: 3, WorldSize: 1, Ranks: []*api.RankSpec{{Rank: 0, Gpus: []uint32{2}}},
		Command: []string{"/bin/sh", "-c", `i=0; while :; do i=$((i+1)); echo "step $i loss=1 step_ms=1"; sleep 0.05; done`}}
	if err := first.x.Launch(l); err != nil {
		t.Fatal(err)
	}
	pid := first.x.GPUProcesses()[2][0]
	killOnCleanup(t, int(pid))
	crash(first)

	second := newTestExecutor(t, dir)
	ev := second.events.waitFor(t, "adoption", func(e *api.Event) bool { return e.Attrs["adopted"] == "true" })
	if ev.Pid != pid || ev.Kind != api.EventKind_EVENT_KIND_JOB {
		t.Fatalf("adoption event = %v, want pid %d", ev, pid)
	}
	if got := second.x.GPUProcesses()[2]; len(got) != 1 || got[0] != pid {
		t.Fatalf("GPU 2 processes after adoption = %v, want [%d]", got, pid)
	}
	// A repeated launch of the adopted attempt starts nothing.
	if err := second.x.Launch(l); err != nil {
		t.Fatal(err)
	}
	if got := second.x.GPUProcesses()[2]; len(got) != 1 || got[0] != pid {
		t.Fatalf("GPU 2 processes after a repeated launch = %v, want only the adopted %d", got, pid)
	}
	if n := len(second.events.match(func(e *api.Event) bool { return e.Message != "" && strings.Contains(e.Message, "started") })); n != 0 {
		t.Fatalf("%d start events after adoption, want none", n)
	}
	// Its progress is followed from the log.
	eventually(t, "the adopted rank's steps", 10*time.Second, func() bool {
		st := second.x.RankStatuses()
		return len(st) == 1 && st[0].Step > 0 && st[0].StepUnixNano > 0 && st[0].Attempt == 3 && st[0].ProcState != ""
	})
	if err := second.x.Signal(&api.SignalRanks{Job: "adopt", Signal: "SIGTERM"}); err != nil {
		t.Fatal(err)
	}
	exit := second.events.waitFor(t, "exit", isExit("adopt", 0))
	if exit.Signal != "SIGTERM" || exit.ExitCode != -1 || exit.Attrs["adopted"] != "true" {
		t.Fatalf("exit of the adopted rank = %v, want its real status (SIGTERM) from the shim", exit)
	}
	// Reported once, and only by the live executor, even after more polls.
	onOwner(t, second.x, func() { second.x.poll(time.Now()) })
	onOwner(t, second.x, func() { second.x.poll(time.Now()) })
	if n := len(second.events.match(isExit("adopt", 0))); n != 1 {
		t.Fatalf("%d exit events, want 1", n)
	}
	if n := len(first.events.match(isExit("adopt", 0))); n != 0 {
		t.Fatalf("the crashed executor reported %d exits", n)
	}
	b, err := os.ReadFile(filepath.Join(dir, "ranks.json"))
	if err != nil || strings.Contains(string(b), `"job": "adopt"`) {
		t.Fatalf("ranks.json still lists the exited rank (err %v):\n%s", err, b)
	}
}

func TestRankKilledWhileNodemonDownIsLost(t *testing.T) {
	dir := t.TempDir()
	first := newTestExecutor(t, dir)
	if err := first.x.Launch(sleepJob("lost", 1, 0, 1)); err != nil {
		t.Fatal(err)
	}
	var pids []int
	for _, g := range []uint32{0, 1} {
		pid := int(first.x.GPUProcesses()[g][0])
		pids = append(pids, pid)
		killOnCleanup(t, pid)
	}
	shim := rankRec(t, first.x, "lost", 1)
	crash(first)
	syscall.Kill(-pids[1], syscall.SIGKILL)
	eventually(t, "rank 1's shim gone", 10*time.Second, func() bool {
		return !processAlive("/proc", shim.ShimPID, shim.ShimStartTicks)
	})

	second := newTestExecutor(t, dir)
	lost := second.events.match(isExit("lost", 1))
	if len(lost) != 1 || lost[0].Signal != "LOST" || lost[0].Message == "" ||
		!strings.HasPrefix(lost[0].Message, "rank was not running when nodemon restarted") ||
		lost[0].Attrs["exit_status"] != "killed by SIGKILL" {
		t.Fatalf("events for the killed rank = %v, want one LOST exit", lost)
	}
	if got := second.x.GPUProcesses(); len(got[0]) != 1 || len(got[1]) != 0 {
		t.Fatalf("GPU processes = %v, want rank 0 adopted and rank 1 gone", got)
	}
	// Relaunching the lost rank starts it again; rank 0 stays as it is.
	if err := second.x.Launch(sleepJob("lost", 1, 0, 1)); err != nil {
		t.Fatal(err)
	}
	got := second.x.GPUProcesses()
	if len(got[1]) != 1 || int(got[0][0]) != pids[0] {
		t.Fatalf("after relaunch GPU processes = %v, want rank 0 still pid %d and a new rank 1", got, pids[0])
	}
	killOnCleanup(t, int(got[1][0]))
}

func TestShimKilledTakesItsRankAlong(t *testing.T) {
	e := newTestExecutor(t, "")
	if err := e.x.Launch(sleepJob("orphan", 1, 0)); err != nil {
		t.Fatal(err)
	}
	rec := rankRec(t, e.x, "orphan", 0)
	killOnCleanup(t, rec.PID)
	syscall.Kill(rec.ShimPID, syscall.SIGKILL)
	ev := e.events.waitFor(t, "exit", isExit("orphan", 0))
	if ev.Signal != "SIGKILL" {
		t.Fatalf("exit = %v", ev)
	}
	eventually(t, "the rank gone with its shim", 5*time.Second, func() bool {
		return !processAlive("/proc", rec.PID, rec.StartTicks)
	})
}

func TestJobCgroupsOnFakeTree(t *testing.T) {
	root := t.TempDir()
	if err := os.WriteFile(filepath.Join(root, "cgroup.controllers"), []byte("cpu memory\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	e := newTestExecutor(t, "", func(o *ExecutorOptions) { o.CgroupRoot = root })
	if err := e.x.Launch(sleepJob("cg", 1, 0)); err != nil {
		t.Fatal(err)
	}
	pid := int(e.x.GPUProcesses()[0][0])
	killOnCleanup(t, pid)
	dir := filepath.Join(root, "gpuctl", "cg", "rank-0")
	// A plain directory is no cgroup: the shim falls back to moving the
	// rank in through cgroup.procs.
	b, err := os.ReadFile(filepath.Join(dir, "cgroup.procs"))
	if err != nil || strings.TrimSpace(string(b)) != strconv.Itoa(pid) {
		t.Fatalf("cgroup.procs = %q (err %v), want the rank's pid %d", b, err, pid)
	}
	if err := e.x.Signal(&api.SignalRanks{Job: "cg", Signal: "SIGKILL"}); err != nil {
		t.Fatal(err)
	}
	e.events.waitFor(t, "exit", isExit("cg", 0))
	eventually(t, "the rank's cgroup removed", 5*time.Second, func() bool {
		_, err := os.Stat(filepath.Join(root, "gpuctl", "cg"))
		return os.IsNotExist(err)
	})
}

func TestJobCgroupsOffWithoutV2(t *testing.T) {
	c := newJobCgroups(t.TempDir())
	if c.enabled() || !strings.Contains(c.off, "cgroup v1") {
		t.Fatalf("cgroups on a tree without cgroup.controllers: enabled=%v, why %q", c.enabled(), c.off)
	}
}

// TestJobCgroupsV2 runs on a real cgroup v2 hierarchy: the unified mount
// of a cgroup v2 host, or of a hybrid one.
func TestJobCgroupsV2(t *testing.T) {
	var root string
	for _, r := range []string{"/sys/fs/cgroup", "/sys/fs/cgroup/unified"} {
		if _, err := os.Stat(filepath.Join(r, "cgroup.controllers")); err == nil {
			root = r
			break
		}
	}
	if root == "" {
		t.Skip("no cgroup v2 hierarchy mounted at /sys/fs/cgroup or /sys/fs/cgroup/unified")
	}
	probe := filepath.Join(root, fmt.Sprintf("gpuctl-test-%d", os.Getpid()))
	if err := os.Mkdir(probe, 0o755); err != nil {
		needs.Root.Skip(t, "cannot create a cgroup under %s (%v): needs root or a delegated cgroup", root, err)
	}
	_, killErr := os.Stat(filepath.Join(probe, "cgroup.kill"))
	syscall.Rmdir(probe)
	if killErr != nil {
		t.Skipf("kernel has no cgroup.kill (Linux 5.14+): %v", killErr)
	}
	e := newTestExecutor(t, "", func(o *ExecutorOptions) { o.CgroupRoot = root })
	t.Cleanup(func() { syscall.Rmdir(filepath.Join(root, "gpuctl")) })
	// The child leaves the rank's process group and session: only the
	// cgroup still holds it.
	l := &api.LaunchRanks{Job: "cgv2", Attempt: 1, WorldSize: 1, Ranks: []*api.RankSpec{{Rank: 0}},
		Command: []string{"/bin/sh", "-c", `setsid sleep 300 & echo child=$!; wait`}}
	if err := e.x.Launch(l); err != nil {
		t.Fatal(err)
	}
	pid := rankPID(t, e.x, "cgv2", 0)
	killOnCleanup(t, pid)
	child := 0
	eventually(t, "child pid in the log", 10*time.Second, func() bool {
		child = childPID(logPath(e.dir, "cgv2", 0))
		return child > 0
	})
	t.Cleanup(func() { syscall.Kill(child, syscall.SIGKILL) })
	b, _ := os.ReadFile(filepath.Join(root, "gpuctl", "cgv2", "rank-0", "cgroup.procs"))
	if !strings.Contains(string(b), strconv.Itoa(pid)) {
		t.Fatalf("rank pid %d not in its cgroup: cgroup.procs = %q", pid, b)
	}
	if err := e.x.Signal(&api.SignalRanks{Job: "cgv2", Signal: "SIGKILL"}); err != nil {
		t.Fatal(err)
	}
	e.events.waitFor(t, "exit", isExit("cgv2", 0))
	eventually(t, "the child that left the process group killed", 5*time.Second, func() bool {
		st, err := procfs.ReadStat("/proc", child)
		return err != nil || st.State == "Z"
	})
	eventually(t, "the job's cgroup removed", 5*time.Second, func() bool {
		_, err := os.Stat(filepath.Join(root, "gpuctl", "cgv2"))
		return os.IsNotExist(err)
	})
}

// TestEventsFollowRanksJSON: a rank's start is reported only once
// ranks.json lists it, and its exit only once ranks.json no longer does,
// so a nodemon that dies right after reporting either finds, on restart,
// exactly the ranks the server was told run.
func TestEventsFollowRanksJSON(t *testing.T) {
	dir := t.TempDir()
	var mu sync.Mutex
	var wrong []string
	listed := func(job string) bool {
		b, err := os.ReadFile(filepath.Join(dir, "ranks.json"))
		return err == nil && strings.Contains(string(b), `"job": "`+job+`"`)
	}
	e := newTestExecutor(t, dir, func(o *ExecutorOptions) {
		events := o.OnEvent
		o.OnEvent = func(ev *api.Event) {
			switch {
			case ev.GetJob() != "json":
			case ev.GetKind() == api.EventKind_EVENT_KIND_JOB && !listed("json"):
				mu.Lock()
				wrong = append(wrong, "start reported before ranks.json lists the rank: "+ev.GetMessage())
				mu.Unlock()
			case ev.GetKind() == api.EventKind_EVENT_KIND_PROCESS_EXIT && listed("json"):
				mu.Lock()
				wrong = append(wrong, "exit reported while ranks.json still lists the rank: "+ev.GetMessage())
				mu.Unlock()
			}
			events(ev)
		}
	})
	if err := e.x.Launch(sleepJob("json", 1, 0)); err != nil {
		t.Fatal(err)
	}
	if err := e.x.Signal(&api.SignalRanks{Job: "json", Signal: "SIGKILL"}); err != nil {
		t.Fatal(err)
	}
	e.events.waitFor(t, "exit", isExit("json", 0))
	mu.Lock()
	defer mu.Unlock()
	if len(wrong) > 0 {
		t.Fatal(strings.Join(wrong, "\n"))
	}
}

// TestClosedExecutorAnswers: once closed, the owner is gone, and every
// request is answered at once (shutting down, or nothing) rather than
// waiting for it; the ranks it knew keep running.
func TestClosedExecutorAnswers(t *testing.T) {
	e := newTestExecutor(t, "")
	if err := e.x.Launch(sleepJob("closed", 1, 0)); err != nil {
		t.Fatal(err)
	}
	rec := rankRec(t, e.x, "closed", 0)
	killOnCleanup(t, rec.PID)
	e.x.Close()
	answered := make(chan error, 1)
	go func() {
		errLaunch := e.x.Launch(sleepJob("closed", 2, 1))
		errSignal := e.x.Signal(&api.SignalRanks{Job: "closed", Signal: "SIGTERM"})
		if _, err := e.x.Fence(&api.SignalRanks{Job: "closed", Attempt: 1}); err == nil || errLaunch == nil || errSignal == nil {
			answered <- fmt.Errorf("launch %v, signal %v, fence %v: want each refused", errLaunch, errSignal, err)
			return
		}
		if !strings.Contains(errLaunch.Error(), "shutting down") {
			answered <- fmt.Errorf("launch after Close: %v, want it to say nodemon is shutting down", errLaunch)
			return
		}
		if st := e.x.RankStatuses(); len(st) != 0 {
			answered <- fmt.Errorf("rank statuses after Close: %v", st)
			return
		}
		e.x.StopAll(time.Second)
		answered <- nil
	}()
	select {
	case err := <-answered:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("a request to a closed executor was not answered within 10s")
	}
	if !processAlive("/proc", rec.PID, rec.StartTicks) {
		t.Fatalf("rank pid %d gone after Close; Close must leave ranks running", rec.PID)
	}
}
