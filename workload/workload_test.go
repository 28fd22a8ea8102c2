package workload

import (
	"bufio"
	"bytes"
	"context"
	"debug/elf"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

var arts Artifacts

func TestMain(m *testing.M) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	a, err := Build(ctx, ".")
	cancel()
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	arts = a
	os.Exit(m.Run())
}

// proc is a started process whose stdout is captured line by line.
type proc struct {
	cmd    *exec.Cmd
	done   chan struct{}
	mu     sync.Mutex
	lines  []string
	stderr bytes.Buffer
	err    error
}

type lockedWriter struct{ p *proc }

func (w lockedWriter) Write(b []byte) (int, error) {
	w.p.mu.Lock()
	defer w.p.mu.Unlock()
	return w.p.stderr.Write(b)
}

// start runs bin with a minimal environment (PATH plus env), so nothing from
// the caller's environment leaks into a rank.
func start(t testing.TB, bin string, args, env []string) *proc {
	t.Helper()
	p := &proc{cmd: exec.Command(bin, args...), done: make(chan struct{})}
	p.cmd.Env = append([]string{"PATH=" + os.Getenv("PATH")}, env...)
	p.cmd.Stderr = lockedWriter{p}
	stdout, err := p.cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := p.cmd.Start(); err != nil {
		t.Fatalf("start %s: %v", bin, err)
	}
	go func() {
		sc := bufio.NewScanner(stdout)
		for sc.Scan() {
			p.mu.Lock()
			p.lines = append(p.lines, sc.Text())
			p.mu.Unlock()
		}
		err := p.cmd.Wait()
		p.mu.Lock()
		p.err = err
		p.mu.Unlock()
		close(p.done)
	}()
	t.Cleanup(func() {
		select {
		case <-p.done:
		default:
			_ = p.cmd.Process.Kill()
			<-p.done
		}
	})
	return p
}

func (p *proc) Lines() []string {
	p.mu.Lock()
	defer p.mu.Unlock()
	return slices.Clone(p.lines)
}

func (p *proc) Stderr() string {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.stderr.String()
}

func (p *proc) exited() bool {
	select {
	case <-p.done:
		return true
	default:
		return false
	}
}

// wait waits for the process to exit and returns its exit code (-1 when a
// signal killed it).
func (p *proc) wait(t testing.TB, timeout time.Duration) int {
	t.Helper()
	select {
	case <-p.done:
	case <-time.After(timeout):
		t.Fatalf("%s did not exit within %v\nstdout:\n%s\nstderr:\n%s", p.cmd.Path, timeout,
			strings.Join(p.Lines(), "\n"), p.Stderr())
	}
	return p.cmd.ProcessState.ExitCode()
}

func (p *proc) signal(t testing.TB, sig syscall.Signal) {
	t.Helper()
	if err := p.cmd.Process.Signal(sig); err != nil {
		t.Fatalf("signal %v: %v", sig, err)
	}
}

// freePort returns a loopback TCP port that was free a moment ago.
func freePort(t testing.TB) int {
	t.Helper()
	p, err := FreePortPair("127.0.0.1")
	if err != nil {
		t.Fatal(err)
	}
	return p
}

// startRanks launches n ranks of bin on loopback.
func startRanks(t testing.TB, bin string, n int, args []string, env ...string) []*proc {
	t.Helper()
	port := strconv.Itoa(freePort(t))
	ranks := make([]*proc, n)
	for r := range ranks {
		e := append([]string{
			"RANK=" + strconv.Itoa(r), "WORLD_SIZE=" + strconv.Itoa(n), "LOCAL_RANK=" + strconv.Itoa(r),
			"MASTER_ADDR=127.0.0.1", "MASTER_PORT=" + port, "GPUCTL_NCCL_TIMEOUT_S=20",
		}, env...)
		ranks[r] = start(t, bin, args, e)
	}
	return ranks
}

// poll calls cond every 10ms until it is true, failing after timeout.
func poll(t testing.TB, timeout time.Duration, what string, cond func() bool) {
	t.Helper()
	tick := time.NewTicker(10 * time.Millisecond)
	defer tick.Stop()
	deadline := time.After(timeout)
	for !cond() {
		select {
		case <-tick.C:
		case <-deadline:
			t.Fatalf("timed out after %v waiting for %s", timeout, what)
		}
	}
}

// steps parses ringtrain's "step N ... state=HEX ..." lines into N -> HEX.
func steps(t testing.TB, lines []string) map[int]string {
	t.Helper()
	m := map[int]string{}
	for _, l := range lines {
		f := strings.Fields(l)
		if len(f) < 2 || f[0] != "step" {
			continue
		}
		n, err := strconv.Atoi(f[1])
		if err != nil {
			t.Fatalf("bad step line %q", l)
		}
		for _, kv := range f[2:] {
			if v, ok := strings.CutPrefix(kv, "state="); ok {
				m[n] = v
			}
		}
	}
	return m
}

func lastStep(p *proc) int {
	last := 0
	for _, l := range p.Lines() {
		f := strings.Fields(l)
		if len(f) >= 2 && f[0] == "step" {
			if n, err := strconv.Atoi(f[1]); err == nil {
				last = n
			}
		}
	}
	return last
}

// field returns the value of key=value on the first line starting with prefix.
func field(lines []string, prefix, key string) (string, bool) {
	for _, l := range lines {
		if !strings.HasPrefix(l, prefix) {
			continue
		}
		for _, kv := range strings.Fields(l) {
			if v, ok := strings.CutPrefix(kv, key+"="); ok {
				return v, true
			}
		}
	}
	return "", false
}

func requireExit(t testing.TB, ranks []*proc, timeout time.Duration, want int) {
	t.Helper()
	for r, p := range ranks {
		if code := p.wait(t, timeout); code != want {
			t.Fatalf("rank %d exited %d, want %d\nstdout:\n%s\nstderr:\n%s", r, code, want,
				strings.Join(p.Lines(), "\n"), p.Stderr())
		}
	}
}

// reference returns the state digest of every step of an uninterrupted run.
// The state is replicated and depends only on the step, so one rank will do.
func reference(t testing.TB, last int, stateBytes string) map[int]string {
	t.Helper()
	p := start(t, arts.RingTrain, []string{"--steps", strconv.Itoa(last), "--compute-ms", "0",
		"--bytes", "4K", "--state-bytes", stateBytes}, nil)
	requireExit(t, []*proc{p}, 20*time.Second, 0)
	return steps(t, p.Lines())
}

func TestLibraryABI(t *testing.T) {
	f, err := elf.Open(arts.Lib)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	soname, err := f.DynString(elf.DT_SONAME)
	if err != nil || !slices.Equal(soname, []string{"libnccl.so.2"}) {
		t.Errorf("SONAME = %v, %v; want [libnccl.so.2]", soname, err)
	}
	syms, err := f.DynamicSymbols()
	if err != nil {
		t.Fatal(err)
	}
	exported := map[string]bool{}
	for _, s := range syms {
		if s.Section != elf.SHN_UNDEF && elf.ST_TYPE(s.Info) == elf.STT_FUNC {
			exported[s.Name] = true
		}
	}
	api := []string{"ncclGetVersion", "ncclGetUniqueId", "ncclCommInitRank", "ncclCommDestroy",
		"ncclCommAbort", "ncclCommCount", "ncclCommUserRank", "ncclCommGetAsyncError",
		"ncclGetErrorString", "ncclGetLastError", "ncclAllReduce", "ncclAllGather",
		"ncclReduceScatter", "ncclBroadcast", "ncclReduce", "ncclSend", "ncclRecv",
		"ncclGroupStart", "ncclGroupEnd",
		// The one CUDA runtime call a training loop waits on its
		// collectives with (cudasync.h).
		"cudaStreamSynchronize"}
	for _, name := range api {
		if !exported[name] {
			t.Errorf("%s is not exported", name)
		}
		delete(exported, name)
	}
	for name := range exported {
		if !strings.HasPrefix(name, "_") {
			t.Errorf("internal function %s is exported; only the NCCL API may be", name)
		}
	}

	// ringtrain finds the library beside itself, wherever the two are copied.
	dir := t.TempDir()
	for _, src := range []string{arts.Lib, arts.RingTrain} {
		b, err := os.ReadFile(src)
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dir, filepath.Base(src)), b, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	p := start(t, filepath.Join(dir, "ringtrain"), []string{"--steps", "1", "--compute-ms", "0", "--bytes", "4K"}, nil)
	requireExit(t, []*proc{p}, 20*time.Second, 0)
}

func TestRingTrainRanksAgree(t *testing.T) {
	t.Run("completing in the call", func(t *testing.T) { ringTrainRanksAgree(t) })
	// As on a GPU: calls enqueue, the stream completes them, ringtrain
	// synchronizes before it reads the result; with the profiler loaded.
	t.Run("asynchronous with the profiler", func(t *testing.T) {
		ringTrainRanksAgree(t, "REFNCCL_ASYNC=1", "NCCL_PROFILER_PLUGIN="+arts.Profiler)
	})
}

func ringTrainRanksAgree(t *testing.T, env ...string) {
	const n, last = 4, 6
	ranks := startRanks(t, arts.RingTrain, n,
		[]string{"--steps", strconv.Itoa(last), "--compute-ms", "5", "--bytes", "1M", "--state-bytes", "64K"},
		append([]string{"GPUCTL_JOB=agree"}, env...)...)
	requireExit(t, ranks, 40*time.Second, 0)
	want := reference(t, last, "64K")
	for r, p := range ranks {
		got := steps(t, p.Lines())
		if len(got) != last {
			t.Errorf("rank %d printed %d steps, want %d:\n%s", r, len(got), last, strings.Join(p.Lines(), "\n"))
		}
		for s := 1; s <= last; s++ {
			if got[s] != want[s] {
				t.Errorf("rank %d step %d: state %q, want %q", r, s, got[s], want[s])
			}
		}
		lines := p.Lines()
		if l := lines[len(lines)-1]; l != fmt.Sprintf("stop step=%d reason=steps", last) {
			t.Errorf("rank %d: last line %q", r, l)
		}
		if v, _ := field(lines, "resume ", "step"); v != "0" {
			t.Errorf("rank %d: resume step %q, want 0", r, v)
		}
	}
}

func TestCollectives(t *testing.T) {
	for _, n := range []int{3, 4} {
		t.Run(fmt.Sprintf("%d ranks", n), func(t *testing.T) {
			ranks := startRanks(t, arts.CollTest, n, nil)
			requireExit(t, ranks, 40*time.Second, 0)
			for r, p := range ranks {
				if v, ok := field(p.Lines(), "colltest ok", "checks"); !ok || v == "0" {
					t.Errorf("rank %d: no checks ran: %q", r, p.Lines())
				}
			}
		})
	}
	t.Run("3 communicators in one process", func(t *testing.T) {
		p := start(t, arts.CollTest, []string{"--local", "3"},
			[]string{"MASTER_ADDR=127.0.0.1", "MASTER_PORT=" + strconv.Itoa(freePort(t))})
		requireExit(t, []*proc{p}, 40*time.Second, 0)
	})
}

func TestCheckpointResume(t *testing.T) {
	dir := t.TempDir()
	args := []string{"--steps", "0", "--compute-ms", "20", "--bytes", "64K", "--state-bytes", "32K"}
	ranks := startRanks(t, arts.RingTrain, 2, args, "GPUCTL_CHECKPOINT_DIR="+dir, "GPUCTL_JOB=ckpt")
	poll(t, 20*time.Second, "step 2 on every rank", func() bool {
		return lastStep(ranks[0]) >= 2 && lastStep(ranks[1]) >= 2
	})
	// One rank is signalled; both must checkpoint at the same step.
	ranks[1].signal(t, syscall.SIGUSR1)
	var ckpt [2]string
	poll(t, 20*time.Second, "a checkpoint line on every rank", func() bool {
		for r, p := range ranks {
			ckpt[r], _ = field(p.Lines(), "checkpoint ", "step")
		}
		return ckpt[0] != "" && ckpt[1] != ""
	})
	if ckpt[0] != ckpt[1] {
		t.Fatalf("ranks checkpointed different steps: %s and %s", ckpt[0], ckpt[1])
	}
	step, _ := strconv.Atoi(ckpt[0])
	poll(t, 10*time.Second, "the latest marker", func() bool {
		b, err := os.ReadFile(filepath.Join(dir, "latest"))
		return err == nil && string(b) == ckpt[0]
	})
	for r := range 2 {
		fi, err := os.Stat(filepath.Join(dir, "step-"+ckpt[0], fmt.Sprintf("rank-%d.bin", r)))
		if err != nil {
			t.Fatal(err)
		}
		if v, _ := field(ranks[r].Lines(), "checkpoint ", "bytes"); v != strconv.FormatInt(fi.Size(), 10) {
			t.Errorf("rank %d reported bytes=%s, file has %d", r, v, fi.Size())
		}
	}
	for _, p := range ranks {
		p.signal(t, syscall.SIGKILL)
	}
	requireExit(t, ranks, 10*time.Second, -1)

	last := step + 3
	want := reference(t, last, "32K")
	resumeArgs := append(slices.Clone(args), "--compute-ms", "0", "--steps", strconv.Itoa(last))
	for _, tc := range []struct {
		name, env, source string
	}{
		{"from latest", "GPUCTL_RESUME_STEP=-1", "latest"},
		{"from GPUCTL_RESUME_STEP", "GPUCTL_RESUME_STEP=" + ckpt[0], "GPUCTL_RESUME_STEP"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ranks := startRanks(t, arts.RingTrain, 2, resumeArgs, "GPUCTL_CHECKPOINT_DIR="+dir, tc.env)
			requireExit(t, ranks, 30*time.Second, 0)
			for r, p := range ranks {
				lines := p.Lines()
				if v, _ := field(lines, "resume ", "step"); v != ckpt[0] {
					t.Errorf("rank %d resumed at %q, want %s", r, v, ckpt[0])
				}
				if v, _ := field(lines, "resume ", "source"); v != tc.source {
					t.Errorf("rank %d resume source %q, want %s", r, v, tc.source)
				}
				got := steps(t, lines)
				if len(got) != last-step {
					t.Errorf("rank %d ran %d steps after resuming at %d, want %d", r, len(got), step, last-step)
				}
				for s := step + 1; s <= last; s++ {
					if got[s] != want[s] {
						t.Errorf("rank %d step %d: state %q, want %q (as an uninterrupted run)", r, s, got[s], want[s])
					}
				}
			}
		})
	}
}

func TestSIGTERMStopsEveryRankCleanly(t *testing.T) {
	dir := t.TempDir()
	ranks := startRanks(t, arts.RingTrain, 3,
		[]string{"--compute-ms", "10", "--bytes", "16K", "--state-bytes", "8K"}, "GPUCTL_CHECKPOINT_DIR="+dir)
	poll(t, 20*time.Second, "step 2 on rank 2", func() bool { return lastStep(ranks[2]) >= 2 })
	// Checkpoint then stop, both asked of one rank only.
	ranks[2].signal(t, syscall.SIGUSR1)
	ranks[2].signal(t, syscall.SIGTERM)
	requireExit(t, ranks, 20*time.Second, 0)
	var stops []string
	for _, p := range ranks {
		v, _ := field(p.Lines(), "stop ", "step")
		stops = append(stops, v)
		if r, _ := field(p.Lines(), "stop ", "reason"); r != "signal" {
			t.Errorf("stop reason %q, want signal", r)
		}
		if c, _ := field(p.Lines(), "checkpoint ", "step"); c != v {
			t.Errorf("checkpoint at step %q, stop at %q: want a checkpoint at the stop step", c, v)
		}
	}
	if stops[0] == "" || stops[0] != stops[1] || stops[1] != stops[2] {
		t.Errorf("ranks stopped at steps %q, want one step", stops)
	}
}

func TestDeadPeerFailsTheOthers(t *testing.T) {
	ranks := startRanks(t, arts.RingTrain, 4, []string{"--compute-ms", "5", "--bytes", "256K", "--state-bytes", "8K"})
	poll(t, 20*time.Second, "step 3 on every rank", func() bool {
		return !slices.ContainsFunc(ranks, func(p *proc) bool { return lastStep(p) < 3 })
	})
	ranks[2].signal(t, syscall.SIGKILL)
	for r, p := range ranks {
		if r == 2 {
			continue
		}
		if code := p.wait(t, 15*time.Second); code == 0 || code == -1 {
			t.Errorf("rank %d exited %d after rank 2 died, want a failure status\nstderr:\n%s", r, code, p.Stderr())
		}
	}
}

func TestStoppedPeerStallsTheRing(t *testing.T) {
	ranks := startRanks(t, arts.RingTrain, 3, []string{"--compute-ms", "2", "--bytes", "16K", "--state-bytes", "8K"})
	poll(t, 20*time.Second, "step 3 on every rank", func() bool {
		return !slices.ContainsFunc(ranks, func(p *proc) bool { return lastStep(p) < 3 })
	})
	ranks[1].signal(t, syscall.SIGSTOP)
	// Once rank 1 is stopped the others can finish at most the step in flight.
	poll(t, 5*time.Second, "rank 1 to stop", func() bool {
		b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", ranks[1].cmd.Process.Pid))
		f := strings.Fields(string(b))
		return err == nil && len(f) > 2 && f[2] == "T"
	})
	stalled := lastStep(ranks[1])
	<-time.After(time.Second) // observe a stall: nothing may advance in this window
	for r, p := range ranks {
		if p.exited() {
			t.Fatalf("rank %d exited while rank 1 was stopped: %s", r, p.Stderr())
		}
		if s := lastStep(p); s > stalled+1 {
			t.Errorf("rank %d reached step %d while rank 1 was stopped at %d", r, s, stalled)
		}
	}
	ranks[1].signal(t, syscall.SIGCONT)
	poll(t, 20*time.Second, "progress after SIGCONT", func() bool {
		return !slices.ContainsFunc(ranks, func(p *proc) bool { return lastStep(p) < stalled+3 })
	})
}

func TestBootstrapTimeout(t *testing.T) {
	port := strconv.Itoa(freePort(t))
	base := []string{"WORLD_SIZE=2", "MASTER_ADDR=127.0.0.1", "MASTER_PORT=" + port, "GPUCTL_NCCL_TIMEOUT_S=1"}
	for _, tc := range []struct {
		name, rank, want string
	}{
		{"rank without root", "RANK=1", "cannot reach bootstrap root 127.0.0.1:" + port},
		{"root without ranks", "RANK=0", "only 1 of 2 ranks joined"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p := start(t, arts.RingTrain, []string{"--steps", "1"}, append([]string{tc.rank}, base...))
			if code := p.wait(t, 15*time.Second); code != 1 {
				t.Errorf("exit %d, want 1", code)
			}
			if !strings.Contains(p.Stderr(), tc.want) {
				t.Errorf("stderr %q does not say %q", p.Stderr(), tc.want)
			}
		})
	}
}

func TestUsageErrors(t *testing.T) {
	for _, tc := range []struct {
		name string
		args []string
		env  []string
		want string
	}{
		{"unknown flag", []string{"--stpes", "3"}, nil, "unknown flag --stpes"},
		{"odd bytes", []string{"--bytes", "6"}, nil, "--bytes must be a positive multiple of 4"},
		{"negative steps", []string{"--steps=-2"}, nil, "bad value -2 for --steps"},
		{"missing value", []string{"--steps"}, nil, "--steps needs a value"},
		{"rank out of range", nil, []string{"RANK=4", "WORLD_SIZE=4"}, "RANK=4 is not an integer in 0..3"},
		{"no master", nil, []string{"RANK=0", "WORLD_SIZE=2"}, "needs MASTER_ADDR and MASTER_PORT"},
		{"resume without dir", []string{"--steps", "9"}, []string{"GPUCTL_RESUME_STEP=3"}, "needs GPUCTL_CHECKPOINT_DIR"},
		{"bad resume step", nil, []string{"GPUCTL_RESUME_STEP=x"}, "GPUCTL_RESUME_STEP=x is not an integer"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p := start(t, arts.RingTrain, tc.args, tc.env)
			if code := p.wait(t, 10*time.Second); code != 2 {
				t.Errorf("exit %d, want 2", code)
			}
			if !strings.Contains(p.Stderr(), tc.want) {
				t.Errorf("stderr %q does not say %q", p.Stderr(), tc.want)
			}
		})
	}
}

// validCheckpoint makes a real 1-rank checkpoint of step 1 and returns its bytes.
func validCheckpoint(t testing.TB) []byte {
	t.Helper()
	dir := t.TempDir()
	p := start(t, arts.RingTrain, []string{"--steps", "1", "--compute-ms", "0", "--bytes", "4K",
		"--state-bytes", "64", "--ckpt-interval", "1"}, []string{"GPUCTL_CHECKPOINT_DIR=" + dir})
	requireExit(t, []*proc{p}, 10*time.Second, 0)
	b, err := os.ReadFile(filepath.Join(dir, "step-1", "rank-0.bin"))
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// resumeFrom runs one rank resuming from a checkpoint directory holding the
// given latest marker and step-1/rank-0.bin.
func resumeFrom(t testing.TB, latest string, file []byte) *proc {
	t.Helper()
	dir := t.TempDir()
	if err := os.MkdirAll(filepath.Join(dir, "step-1"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "latest"), []byte(latest), 0o644); err != nil {
		t.Fatal(err)
	}
	if file != nil {
		if err := os.WriteFile(filepath.Join(dir, "step-1", "rank-0.bin"), file, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	return start(t, arts.RingTrain, []string{"--steps", "3", "--compute-ms", "0", "--bytes", "4K",
		"--state-bytes", "64"}, []string{"GPUCTL_CHECKPOINT_DIR=" + dir})
}

func TestMalformedCheckpoint(t *testing.T) {
	valid := validCheckpoint(t)
	flip := func(i int) []byte {
		b := slices.Clone(valid)
		b[i] ^= 0x40
		return b
	}
	for _, tc := range []struct {
		name, latest string
		file         []byte
		want         string
	}{
		{"valid", "1", valid, ""},
		{"marker not a number", "one", valid, "malformed checkpoint marker"},
		{"empty marker", "", valid, "malformed checkpoint marker"},
		{"marker names a missing step", "2", valid, "cannot open checkpoint"},
		{"missing file", "1", nil, "step-1/rank-0.bin: No such file"},
		{"truncated header", "1", valid[:20], "rank-0.bin is truncated"},
		{"truncated state", "1", valid[:len(valid)-8], "rank-0.bin is truncated"},
		{"trailing bytes", "1", append(slices.Clone(valid), 0), "trailing bytes"},
		{"bad magic", "1", flip(0), "not a ringtrain checkpoint"},
		{"wrong step", "1", flip(24), "holds step"},
		{"corrupt state", "1", flip(len(valid) - 1), "checksum mismatch"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p := resumeFrom(t, tc.latest, tc.file)
			code := p.wait(t, 10*time.Second)
			if tc.want == "" {
				if code != 0 || !slices.Contains(p.Lines(), "resume step=1 source=latest") {
					t.Fatalf("exit %d, output %q, stderr %q; want a resume at step 1", code, p.Lines(), p.Stderr())
				}
				return
			}
			if code != 1 || !strings.Contains(p.Stderr(), tc.want) {
				t.Errorf("exit %d, stderr %q; want exit 1 saying %q", code, p.Stderr(), tc.want)
			}
		})
	}
}

// FuzzCheckpointFile feeds arbitrary checkpoint files to ringtrain's loader:
// it must resume or fail with a message naming the file, never crash.
func FuzzCheckpointFile(f *testing.F) {
	valid := validCheckpoint(f)
	f.Add(valid)
	f.Add(valid[:len(valid)-1])
	f.Add([]byte("RNGTCKP1"))
	f.Add([]byte{})
	f.Fuzz(func(t *testing.T, data []byte) {
		p := resumeFrom(t, "1", data)
		switch code := p.wait(t, 10*time.Second); code {
		case 0:
			// Only the informational header fields (world size, reserved,
			// job name) may differ from the valid file.
			informational := func(i int) bool { return (i >= 16 && i < 24) || (i >= 48 && i < 112) }
			if len(data) != len(valid) {
				t.Fatalf("accepted a %d-byte checkpoint; the valid one has %d bytes", len(data), len(valid))
			}
			for i := range data {
				if data[i] != valid[i] && !informational(i) {
					t.Fatalf("accepted a checkpoint that differs from the valid one at byte %d: %x", i, data)
				}
			}
		case 1:
			if !strings.Contains(p.Stderr(), "rank-0.bin") {
				t.Fatalf("error does not name the file: %q", p.Stderr())
			}
		default:
			t.Fatalf("exit %d (crash?), stderr %q", code, p.Stderr())
		}
	})
}

// markerForm is the `latest` marker ringtrain accepts: a step, optionally
// with the attempt (epoch) that committed it.
var markerForm = regexp.MustCompile(`^[ \n\t\r]*([0-9]+)(?:[ \t]+attempt=([0-9]+))?[ \n\t\r]*$`)

// TestCheckpointEpoch runs a one-rank trainer as attempt 2 of a job: its
// checkpoints mark `latest` with the attempt, it commits over an older
// attempt's marker, and as a stale attempt 1 over attempt 2's marker it
// refuses to commit, leaves the marker alone and exits 3.
func TestCheckpointEpoch(t *testing.T) {
	dir := t.TempDir()
	args := []string{"--steps", "4", "--compute-ms", "0", "--bytes", "4K", "--state-bytes", "64", "--ckpt-interval", "2"}
	run := func(attempt string) *proc {
		return start(t, arts.RingTrain, args, []string{"GPUCTL_CHECKPOINT_DIR=" + dir, "GPUCTL_RESUME_STEP=0", "GPUCTL_ATTEMPT=" + attempt})
	}
	if err := os.WriteFile(filepath.Join(dir, "latest"), []byte("0 attempt=1\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if p := run("2"); p.wait(t, 20*time.Second) != 0 {
		t.Fatalf("attempt 2 over attempt 1's marker: exit %d\n%s", p.cmd.ProcessState.ExitCode(), p.Stderr())
	}
	b, _ := os.ReadFile(filepath.Join(dir, "latest"))
	if string(b) != "4 attempt=2" {
		t.Fatalf("latest after attempt 2 = %q, want \"4 attempt=2\"", b)
	}
	stale := run("1")
	if code := stale.wait(t, 20*time.Second); code != 3 || !strings.Contains(stale.Stderr(), "superseded") {
		t.Fatalf("stale attempt 1: exit %d, stderr %q; want 3 naming the superseded attempt", code, stale.Stderr())
	}
	if b2, _ := os.ReadFile(filepath.Join(dir, "latest")); string(b2) != string(b) {
		t.Errorf("a stale attempt moved latest from %q to %q", b, b2)
	}
	for _, l := range stale.Lines() {
		if strings.HasPrefix(l, "checkpoint ") {
			t.Errorf("the stale attempt reported a checkpoint: %s", l)
		}
	}
}

// FuzzLatestMarker feeds arbitrary `latest` markers to ringtrain.
func FuzzLatestMarker(f *testing.F) {
	valid := validCheckpoint(f)
	for _, s := range []string{"1", "1\n", " 1 ", "", "-1", "x", "99999999999999999999", "1\x00", "1 attempt=2", "1 attempt=0", "1 attempt="} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, latest string) {
		p := resumeFrom(t, latest, valid)
		code := p.wait(t, 10*time.Second)
		if code == 0 {
			// A step, optionally with the attempt that committed it.
			m := markerForm.FindStringSubmatch(latest)
			if m == nil {
				t.Fatalf("marker %q accepted", latest)
			}
			n, err := strconv.ParseUint(m[1], 10, 64)
			if err != nil || n > 1 { // 0 is a fresh start, 1 the checkpoint here
				t.Fatalf("marker %q accepted", latest)
			}
			if m[2] != "" {
				if a, err := strconv.ParseUint(m[2], 10, 32); err != nil || a == 0 {
					t.Fatalf("marker %q accepted", latest)
				}
			}
			return
		}
		// A marker past --steps is a usage error (2); anything else malformed
		// or missing fails the load (1). Either way the message says why.
		stderr := p.Stderr()
		explained := strings.Contains(stderr, "latest") || strings.Contains(stderr, "checkpoint") ||
			strings.Contains(stderr, "resume step")
		if (code != 1 && code != 2) || !explained {
			t.Fatalf("marker %q: exit %d, stderr %q", latest, code, stderr)
		}
	})
}

func TestNCCLBench(t *testing.T) {
	for _, op := range []string{"allreduce", "group"} {
		t.Run(op, func(t *testing.T) {
			ns, err := runBench(op, 10000)
			if err != nil {
				t.Fatal(err)
			}
			if ns <= 0 || ns > 1e6 {
				t.Errorf("ns_per_call=%v is implausible", ns)
			}
		})
	}
}

func runBench(op string, calls int) (float64, error) {
	out, err := exec.Command(arts.NCCLBench, "--calls", strconv.Itoa(calls), "--op", op).CombinedOutput()
	if err != nil {
		return 0, fmt.Errorf("ncclbench: %w\n%s", err, out)
	}
	v, ok := strings.CutPrefix(strings.TrimSpace(string(out)), "ns_per_call=")
	if !ok {
		return 0, errors.New("ncclbench printed " + string(out))
	}
	return strconv.ParseFloat(v, 64)
}

// BenchmarkNCCLCall reports the cost of one untraced 1-rank ncclAllReduce.
func BenchmarkNCCLCall(b *testing.B) {
	ns, err := runBench("allreduce", max(b.N, 1000))
	if err != nil {
		b.Fatal(err)
	}
	b.ReportMetric(ns, "ns/call")
}

// BenchmarkAllReduce4Ranks reports ring all-reduce bandwidth between four
// ranks on loopback: 4 MiB per step, no compute.
func BenchmarkAllReduce4Ranks(b *testing.B) {
	const bytesPerStep = 4 << 20
	steps := max(b.N, 3)
	b.ResetTimer()
	start := time.Now()
	ranks := startRanks(b, arts.RingTrain, 4, []string{"--steps", strconv.Itoa(steps), "--compute-ms", "0",
		"--bytes", strconv.Itoa(bytesPerStep), "--state-bytes", "8"})
	requireExit(b, ranks, 5*time.Minute, 0)
	elapsed := time.Since(start)
	var total float64
	for _, l := range ranks[0].Lines() {
		if v, ok := field([]string{l}, "step ", "step_ms"); ok {
			ms, _ := strconv.ParseFloat(v, 64)
			total += ms
		}
	}
	b.ReportMetric(total/float64(steps), "ms/step")
	b.ReportMetric(float64(bytesPerStep)*float64(steps)/elapsed.Seconds()/1e6, "MB/s")
}

// TestRingTrainReportsKernelTime: under GPUCTL_SIM_KERNEL_DIR a rank
// sleeps through its compute phase (its CPU time stays a fraction of it)
// and leaves its total kernel time in <dir>/<pid>, which simulated GPUs
// count as utilization.
func TestRingTrainReportsKernelTime(t *testing.T) {
	dir := t.TempDir()
	const steps, ms = 10, 40
	p := start(t, arts.RingTrain, []string{"--steps", strconv.Itoa(steps), "--compute-ms", strconv.Itoa(ms), "--bytes", "4K"},
		[]string{"GPUCTL_SIM_KERNEL_DIR=" + dir})
	requireExit(t, []*proc{p}, 20*time.Second, 0)
	kernel := kernelTime(t, dir, p)
	if want := steps * ms * time.Millisecond; kernel < want || kernel > 2*want {
		t.Errorf("kernel time %s, want about %s", kernel, want)
	}
	st := p.cmd.ProcessState
	if cpu := st.UserTime() + st.SystemTime(); cpu > kernel/4 {
		t.Errorf("CPU time %s for %s of kernel time: the compute phase kept a CPU busy", cpu, kernel)
	}
}

// kernelTime is the total kernel time p reported in dir.
func kernelTime(t *testing.T, dir string, p *proc) time.Duration {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(dir, strconv.Itoa(p.cmd.Process.Pid)))
	if err != nil {
		t.Fatalf("no kernel time report: %v", err)
	}
	ns, err := strconv.ParseUint(strings.TrimSpace(string(b)), 10, 64)
	if err != nil {
		t.Fatalf("kernel time report %q: %v", b, err)
	}
	return time.Duration(ns)
}

// TestRingTrainFollowsGPUSpeed: a rank computes for compute_ms divided by
// the speed its simulated GPU runs at (gpu-N.speed, N its
// CUDA_VISIBLE_DEVICES), so a GPU at half speed doubles its kernel time.
func TestRingTrainFollowsGPUSpeed(t *testing.T) {
	const steps, ms = 10, 40
	for _, c := range []struct {
		name  string
		speed string // gpu-3.speed, "" for none
		want  time.Duration
	}{
		{"no speed file", "", steps * ms * time.Millisecond},
		{"full speed", "1.0000\n", steps * ms * time.Millisecond},
		{"half speed", "0.5000\n", 2 * steps * ms * time.Millisecond},
		{"another GPU slowed", "", steps * ms * time.Millisecond},
	} {
		t.Run(c.name, func(t *testing.T) {
			dir := t.TempDir()
			if c.speed != "" {
				if err := os.WriteFile(filepath.Join(dir, "gpu-3.speed"), []byte(c.speed), 0o644); err != nil {
					t.Fatal(err)
				}
			}
			if c.name == "another GPU slowed" {
				if err := os.WriteFile(filepath.Join(dir, "gpu-2.speed"), []byte("0.5\n"), 0o644); err != nil {
					t.Fatal(err)
				}
			}
			p := start(t, arts.RingTrain, []string{"--steps", strconv.Itoa(steps), "--compute-ms", strconv.Itoa(ms), "--bytes", "4K"},
				[]string{"GPUCTL_SIM_KERNEL_DIR=" + dir, "CUDA_VISIBLE_DEVICES=3"})
			requireExit(t, []*proc{p}, 20*time.Second, 0)
			if got := kernelTime(t, dir, p); got < c.want || got > c.want*3/2 {
				t.Errorf("kernel time %s, want about %s", got, c.want)
			}
		})
	}
}

// TestSlowLinkStretchesTransfers: with link.speed at 0.25 in the simulated
// host's directory, the reference library's transfers are paced to a
// quarter of their rate (the steps take well over twice as long); the ranks
// still agree on every step.
func TestSlowLinkStretchesTransfers(t *testing.T) {
	run := func(speed string) time.Duration {
		t.Helper()
		dir := t.TempDir()
		if speed != "" {
			if err := os.WriteFile(filepath.Join(dir, "link.speed"), []byte(speed), 0o644); err != nil {
				t.Fatal(err)
			}
		}
		ranks := startRanks(t, arts.RingTrain, 2, []string{"--steps", "20", "--compute-ms", "0", "--bytes", "4M", "--state-bytes", "64K"},
			"GPUCTL_SIM_KERNEL_DIR="+dir)
		requireExit(t, ranks, 60*time.Second, 0)
		var total float64
		for _, l := range ranks[0].Lines() {
			if v, ok := field([]string{l}, "step ", "step_ms"); ok {
				ms, _ := strconv.ParseFloat(v, 64)
				total += ms
			}
		}
		want := reference(t, 20, "64K")
		for r, p := range ranks {
			for s, st := range steps(t, p.Lines()) {
				if st != want[s] {
					t.Errorf("link.speed %q: rank %d step %d state %q, want %q", speed, r, s, st, want[s])
				}
			}
		}
		return time.Duration(total * float64(time.Millisecond))
	}
	full := run("")
	slow := run("0.25\n")
	t.Logf("20 steps of a 4 MiB all-reduce: %s at full speed, %s at link.speed 0.25", full, slow)
	if slow < 2*full {
		t.Errorf("at link.speed 0.25 the steps took %s, at full speed %s: want at least twice as long", slow, full)
	}
}
