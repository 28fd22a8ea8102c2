//go:build linux && amd64

package nccl

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/asm"
	"github.com/cilium/ebpf/link"
	"golang.org/x/sys/unix"

	"github.com/gpuctl/gpuctl/api"
	"github.com/gpuctl/gpuctl/internal/needs"
	wl "github.com/gpuctl/gpuctl/workload"
)

// workloadDir is the reference workload; its library is what the tests trace.
var (
	workloadDir string
	workloadErr error
)

func TestMain(m *testing.M) {
	workloadDir, workloadErr = buildWorkload()
	os.Exit(m.Run())
}

// buildWorkload runs `make -C <repo>/workload` when its library is missing.
func buildWorkload() (string, error) {
	dir, err := filepath.Abs(filepath.Join("..", "..", "workload"))
	if err != nil {
		return "", err
	}
	need := []string{"libnccl.so.2", wl.ProfilerName, "ringtrain", "ncclbench"}
	missing := false
	for _, f := range need {
		if _, err := os.Stat(filepath.Join(dir, "build", f)); err != nil {
			missing = true
		}
	}
	if !missing {
		return dir, nil
	}
	out, err := exec.Command("make", "-C", dir).CombinedOutput()
	if err != nil {
		return "", fmt.Errorf("make -C %s: %v\n%s", dir, err, out)
	}
	return dir, nil
}

func workload(t testing.TB, name string) string {
	t.Helper()
	if workloadErr != nil {
		t.Fatalf("reference workload unavailable: %v", workloadErr)
	}
	return filepath.Join(workloadDir, "build", name)
}

// requireEBPF skips when the kernel or privileges cannot run eBPF, unless
// eBPF is required here (needs.EBPF), where a skip would hide a regression.
func requireEBPF(t testing.TB, err error) {
	t.Helper()
	if err == nil {
		return
	}
	unsupported := errors.Is(err, ebpf.ErrNotSupported) || errors.Is(err, unix.EPERM) || errors.Is(err, unix.EACCES)
	if !unsupported {
		t.Fatalf("eBPF failed for a reason other than the kernel or privileges: %v", err)
	}
	needs.EBPF.Skip(t, "eBPF unavailable here: %v", err)
}

func newTracer(t testing.TB) *Tracer {
	t.Helper()
	tr, err := New(slog.New(slog.NewTextHandler(io.Discard, nil)), Options{})
	requireEBPF(t, err)
	t.Cleanup(func() {
		if err := tr.Close(); err != nil {
			t.Errorf("close tracer: %v", err)
		}
	})
	return tr
}

// poll calls cond every 20ms until it returns true or timeout passes.
func poll(t testing.TB, timeout time.Duration, what string, cond func() bool) {
	t.Helper()
	tick := time.NewTicker(20 * time.Millisecond)
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

// scanUntilAttached keeps a process that maps the library but calls nothing
// alive, so Scan finds the library before any rank starts.
func scanUntilAttached(t *testing.T, tr *Tracer, lib string) {
	t.Helper()
	holder := exec.Command("sleep", "600")
	holder.Env = append(os.Environ(), "LD_PRELOAD="+lib)
	if err := holder.Start(); err != nil {
		t.Fatalf("start library holder: %v", err)
	}
	t.Cleanup(func() {
		holder.Process.Kill()
		holder.Wait()
	})
	var st unix.Stat_t
	if err := unix.Stat(lib, &st); err != nil {
		t.Fatal(err)
	}
	id := fileID{dev: st.Dev, ino: st.Ino}
	poll(t, 10*time.Second, "Scan to attach to "+lib, func() bool {
		if err := tr.Scan(); err != nil {
			// Other processes may exit mid-scan; only our library matters.
			t.Logf("scan: %v", err)
		}
		tr.mu.Lock()
		defer tr.mu.Unlock()
		_, ok := tr.attached[id]
		return ok
	})
}

// collector gathers the records of one job from a tracer.
type collector struct {
	mu   sync.Mutex
	recs []*api.CollectiveRecord
}

func collect(t *testing.T, tr *Tracer, job string) *collector {
	c := &collector{}
	done := make(chan struct{})
	go func() {
		defer close(done)
		for r := range tr.Records() {
			if r.Job == job {
				c.mu.Lock()
				c.recs = append(c.recs, r)
				c.mu.Unlock()
			}
		}
	}()
	t.Cleanup(func() {
		tr.Close()
		<-done
	})
	return c
}

func (c *collector) snapshot() []*api.CollectiveRecord {
	c.mu.Lock()
	defer c.mu.Unlock()
	return slices.Clone(c.recs)
}

func freePort(t *testing.T) int {
	t.Helper()
	p, err := wl.FreePortPair("127.0.0.1")
	if err != nil {
		t.Fatal(err)
	}
	return p
}

type rank struct {
	cmd *exec.Cmd
	out *lockedBuffer
}

type lockedBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *lockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *lockedBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

// startRanks launches world ringtrain ranks of job on loopback.
func startRanks(t *testing.T, job string, world int, args ...string) []*rank {
	t.Helper()
	return startRanksEnv(t, job, world, nil, args...)
}

// startRanksEnv is startRanks with env(r) added to rank r's environment.
func startRanksEnv(t *testing.T, job string, world int, env func(r int) []string, args ...string) []*rank {
	t.Helper()
	bin := workload(t, "ringtrain")
	port := freePort(t)
	var ranks []*rank
	for r := range world {
		cmd := exec.Command(bin, args...)
		cmd.Env = append(os.Environ(),
			"RANK="+strconv.Itoa(r), "WORLD_SIZE="+strconv.Itoa(world),
			"MASTER_ADDR=127.0.0.1", "MASTER_PORT="+strconv.Itoa(port),
			"GPUCTL_JOB="+job, "GPUCTL_NCCL_TIMEOUT_S=30")
		if env != nil {
			cmd.Env = append(cmd.Env, env(r)...)
		}
		out := &lockedBuffer{}
		cmd.Stdout, cmd.Stderr = out, out
		if err := cmd.Start(); err != nil {
			t.Fatalf("start rank %d: %v", r, err)
		}
		rk := &rank{cmd: cmd, out: out}
		ranks = append(ranks, rk)
		t.Cleanup(func() {
			if cmd.ProcessState == nil {
				cmd.Process.Signal(syscall.SIGCONT)
				cmd.Process.Kill()
				cmd.Wait()
			}
		})
	}
	return ranks
}

// waitRanks waits for every rank to exit successfully.
func waitRanks(t *testing.T, ranks []*rank, timeout time.Duration) {
	t.Helper()
	errc := make(chan error, len(ranks))
	for i, rk := range ranks {
		go func() {
			if err := rk.cmd.Wait(); err != nil {
				errc <- fmt.Errorf("rank %d: %v\n%s", i, err, rk.out.String())
				return
			}
			errc <- nil
		}()
	}
	deadline := time.After(timeout)
	for range ranks {
		select {
		case err := <-errc:
			if err != nil {
				t.Fatal(err)
			}
		case <-deadline:
			t.Fatalf("ranks still running after %v", timeout)
		}
	}
}

func uniqueJob(t *testing.T) string {
	return fmt.Sprintf("probe-%s-%d-%d", strings.ToLower(t.Name()), os.Getpid(), time.Now().UnixNano())
}

func TestRingTrainTraced(t *testing.T) {
	const (
		world   = 3
		steps   = 6
		payload = 64 << 10
	)
	tr := newTracer(t)
	lib := workload(t, "libnccl.so.2")
	job := uniqueJob(t)
	col := collect(t, tr, job)
	scanUntilAttached(t, tr, lib)
	began := time.Now()
	ranks := startRanks(t, job, world, "--steps", strconv.Itoa(steps), "--compute-ms", "30", "--bytes", strconv.Itoa(payload))
	waitRanks(t, ranks, 60*time.Second)
	ended := time.Now()

	// ringtrain keeps two communicators: the training one carries exactly
	// one float32 gradient all-reduce per step; the control one agrees on
	// the resume step once (2 x int64), then votes on signals every step
	// (2 x int32).
	const allReduces = 1 + 2*steps
	perRank := func(recs []*api.CollectiveRecord, r int32, op api.NCCLOp) []*api.CollectiveRecord {
		var out []*api.CollectiveRecord
		for _, rec := range recs {
			if rec.Rank == r && rec.Op == op {
				out = append(out, rec)
			}
		}
		return out
	}
	poll(t, 10*time.Second, "every rank's records", func() bool {
		recs := col.snapshot()
		for r := range int32(world) {
			if len(perRank(recs, r, api.NCCLOp_NCCL_OP_ALL_REDUCE)) < allReduces ||
				len(perRank(recs, r, api.NCCLOp_NCCL_OP_COMM_INIT_RANK)) < 2 {
				return false
			}
		}
		return true
	})
	recs := col.snapshot()
	// Without the profiler plugin the calls are all there is.
	for _, rec := range recs {
		if rec.Completion {
			t.Errorf("completion record without a profiler plugin: %v", rec)
		}
	}
	for r := range int32(world) {
		inits := perRank(recs, r, api.NCCLOp_NCCL_OP_COMM_INIT_RANK)
		if len(inits) != 2 {
			t.Fatalf("rank %d: %d ncclCommInitRank records, want 2 (training and control)", r, len(inits))
		}
		comms := map[uint64]bool{}
		for _, init := range inits {
			if init.Comm == 0 || init.CommNranks != world || init.CommRank != r || init.Result != 0 || init.DurationNs <= 0 {
				t.Errorf("rank %d: ncclCommInitRank record %v; want a communicator of %d ranks with this rank %d", r, init, world, r)
			}
			comms[init.Comm] = true
		}
		if len(comms) != 2 {
			t.Fatalf("rank %d: communicators %v, want two distinct handles", r, comms)
		}
		ars := perRank(recs, r, api.NCCLOp_NCCL_OP_ALL_REDUCE)
		if len(ars) != allReduces {
			t.Fatalf("rank %d: %d all-reduce records, want %d", r, len(ars), allReduces)
		}
		byComm := map[uint64][]*api.CollectiveRecord{}
		for _, ar := range ars {
			if !comms[ar.Comm] {
				t.Fatalf("rank %d: all-reduce on unknown communicator %#x", r, ar.Comm)
			}
			byComm[ar.Comm] = append(byComm[ar.Comm], ar)
		}
		var grads int
		for comm, list := range byComm {
			slices.SortFunc(list, func(a, b *api.CollectiveRecord) int { return int(a.Seq) - int(b.Seq) })
			training := list[0].Datatype == 7
			want := steps
			if !training {
				want = 1 + steps
			}
			if len(list) != want {
				t.Errorf("rank %d comm %#x: %d all-reduces, want %d", r, comm, len(list), want)
			}
			for i, ar := range list {
				if ar.Seq != uint64(i+1) {
					t.Errorf("rank %d comm %#x: sequence numbers %v, want 1..%d", r, comm, seqs(list), len(list))
					break
				}
				if ar.CommNranks != world || ar.CommRank != r {
					t.Errorf("rank %d seq %d: comm %#x has %d ranks, rank %d; want %d, %d", r, ar.Seq, ar.Comm, ar.CommNranks, ar.CommRank, world, r)
				}
				if ar.DurationNs <= 0 || ar.Result != 0 || ar.InProgress || ar.Pid == 0 || ar.Peer != -1 {
					t.Errorf("rank %d seq %d: bad record %v", r, ar.Seq, ar)
				}
				start := time.Unix(0, ar.StartUnixNano)
				if start.Before(began.Add(-time.Second)) || start.After(ended.Add(time.Second)) {
					t.Errorf("rank %d seq %d: start %v outside the run %v..%v", r, ar.Seq, start, began, ended)
				}
				if i > 0 && ar.StartUnixNano < list[i-1].StartUnixNano+list[i-1].DurationNs {
					t.Errorf("rank %d seq %d starts before seq %d returned", r, ar.Seq, list[i-1].Seq)
				}
				if training {
					grads++
					if ar.Datatype != 7 || ar.Count != payload/4 || ar.Bytes != payload {
						t.Errorf("rank %d: gradient all-reduce %v; want %d floats (%d bytes)", r, ar, payload/4, payload)
					}
				}
			}
			// The control group's first all-reduce agrees on the resume step.
			if a := list[0]; !training && (a.Datatype != 4 || a.Count != 2 || a.Bytes != 16) {
				t.Errorf("rank %d: first control all-reduce %v, want 2 int64 (16 bytes)", r, a)
			}
		}
		if grads != steps {
			t.Errorf("rank %d: %d float32 all-reduces, want one per step (%d)", r, grads, steps)
		}
	}
	if lost := tr.Lost(); lost != 0 {
		t.Errorf("lost %d records", lost)
	}
}

func seqs(recs []*api.CollectiveRecord) []uint64 {
	var s []uint64
	for _, r := range recs {
		s = append(s, r.Seq)
	}
	return s
}

// TestInFlightShowsStalledRanks stops one rank with SIGSTOP; its peers then
// sit inside an all-reduce, which InFlight must show until it resumes.
func TestInFlightShowsStalledRanks(t *testing.T) {
	const world = 3
	tr := newTracer(t)
	lib := workload(t, "libnccl.so.2")
	job := uniqueJob(t)
	col := collect(t, tr, job)
	scanUntilAttached(t, tr, lib)
	ranks := startRanks(t, job, world, "--steps", "0", "--compute-ms", "2", "--bytes", "16K")

	// Wait until training is under way on every rank.
	poll(t, 30*time.Second, "training to start", func() bool {
		seen := map[int32]bool{}
		for _, r := range col.snapshot() {
			if r.Op == api.NCCLOp_NCCL_OP_ALL_REDUCE && r.Seq >= 5 {
				seen[r.Rank] = true
			}
		}
		return len(seen) == world
	})
	stopped := ranks[1].cmd.Process
	if err := stopped.Signal(syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	const stall = 300 * time.Millisecond
	var stuck map[int32]*api.CollectiveRecord
	poll(t, 20*time.Second, "ranks 0 and 2 to show in an all-reduce for "+stall.String(), func() bool {
		recs, err := tr.InFlight()
		if err != nil {
			t.Fatal(err)
		}
		stuck = map[int32]*api.CollectiveRecord{}
		for _, r := range recs {
			if r.Job == job && r.Op == api.NCCLOp_NCCL_OP_ALL_REDUCE && r.DurationNs >= int64(stall) {
				stuck[r.Rank] = r
			}
		}
		return stuck[0] != nil && stuck[2] != nil
	})
	for _, r := range []int32{0, 2} {
		rec := stuck[r]
		if !rec.InProgress || rec.Seq == 0 || rec.Comm == 0 || rec.CommNranks != world || rec.CommRank != r {
			t.Errorf("rank %d in flight: %v", r, rec)
		}
		if time.Since(time.Unix(0, rec.StartUnixNano)) < stall {
			t.Errorf("rank %d in flight since %v, less than its %v duration ago", r, time.Unix(0, rec.StartUnixNano), time.Duration(rec.DurationNs))
		}
	}

	// Resumed, the stalled calls complete and report how long they waited.
	if err := stopped.Signal(syscall.SIGCONT); err != nil {
		t.Fatal(err)
	}
	poll(t, 20*time.Second, "the stalled all-reduces to return", func() bool {
		done := map[int32]bool{}
		for _, rec := range col.snapshot() {
			if s := stuck[rec.Rank]; s != nil && rec.Seq == s.Seq && rec.Op == s.Op && rec.DurationNs >= int64(stall) {
				done[rec.Rank] = true
			}
		}
		return done[0] && done[2]
	})
	for _, rk := range ranks {
		rk.cmd.Process.Signal(syscall.SIGTERM)
	}
	waitRanks(t, ranks, 30*time.Second)
	inflight, err := tr.InFlight()
	if err != nil {
		t.Fatal(err)
	}
	for _, r := range inflight {
		if r.Job == job {
			t.Errorf("call still in flight after every rank exited: %v", r)
		}
	}
}

func TestAttachLibraryIdempotentAndValidated(t *testing.T) {
	tr := newTracer(t)
	lib := workload(t, "libnccl.so.2")
	if err := tr.AttachLibrary(lib); err != nil {
		requireEBPF(t, err)
	}
	// The symlink names the same file: no second set of probes.
	if err := tr.AttachLibrary(filepath.Join(filepath.Dir(lib), "libnccl.so")); err != nil {
		t.Fatal(err)
	}
	tr.mu.Lock()
	n := len(tr.attached)
	tr.mu.Unlock()
	if n != 1 {
		t.Errorf("%d libraries attached after attaching one file twice, want 1", n)
	}
	if err := tr.AttachLibrary(workload(t, "ringtrain")); err == nil || !strings.Contains(err.Error(), "exports none") {
		t.Errorf("AttachLibrary(ringtrain) = %v; want an error saying it exports no NCCL function", err)
	}
	if err := tr.AttachLibrary(filepath.Join(t.TempDir(), "missing.so")); err == nil {
		t.Error("AttachLibrary of a missing file succeeded")
	}
}

// benchCopy copies ncclbench and its library into a fresh directory, so
// that no other tracer on the host has probes on the file being measured.
func benchCopy(b *testing.B) (bench, lib string) {
	b.Helper()
	dir := b.TempDir()
	for _, f := range []string{"ncclbench", "libnccl.so.2", wl.ProfilerName} {
		data, err := os.ReadFile(workload(b, f))
		if err != nil {
			b.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dir, f), data, 0o755); err != nil {
			b.Fatal(err)
		}
	}
	return filepath.Join(dir, "ncclbench"), filepath.Join(dir, "libnccl.so.2")
}

// runBench runs ncclbench and returns its ns_per_call.
func runBench(b *testing.B, bench string, calls int, env ...string) float64 {
	b.Helper()
	cmd := exec.Command(bench, "--calls", strconv.Itoa(calls), "--op", "allreduce")
	cmd.Env = append(os.Environ(), env...)
	out, err := cmd.CombinedOutput()
	if err != nil {
		b.Fatalf("ncclbench: %v\n%s", err, out)
	}
	sc := bufio.NewScanner(bytes.NewReader(out))
	for sc.Scan() {
		if v, ok := strings.CutPrefix(sc.Text(), "ns_per_call="); ok {
			f, err := strconv.ParseFloat(v, 64)
			if err != nil {
				b.Fatalf("ncclbench printed %q: %v", sc.Text(), err)
			}
			return f
		}
	}
	b.Fatalf("ncclbench printed no ns_per_call line:\n%s", out)
	return 0
}

// BenchmarkTracedCall measures what tracing adds to one NCCL call
// (ncclbench's 1-rank ncclAllReduce): untraced; with an empty program on
// the same uprobe and uretprobe, which is the kernel's trap cost alone;
// and with the NCCL probe. ns/call-ebpf is the total cost of tracing a
// call, ns/call-program the part that is the probe's own code;
// ns/call-completion what gpuctl's profiler plugin and its two traced
// hooks add to a traced call.
func BenchmarkTracedCall(b *testing.B) {
	calls := max(b.N, 1000)
	bench, lib := benchCopy(b)
	untraced := runBench(b, bench, calls)

	tr, err := New(slog.New(slog.NewTextHandler(io.Discard, nil)), Options{})
	requireEBPF(b, err)
	defer tr.Close()

	empty, err := ebpf.NewProgram(&ebpf.ProgramSpec{
		Type: ebpf.Kprobe, License: "GPL",
		Instructions: asm.Instructions{asm.Mov.Imm(asm.R0, 0), asm.Return()},
	})
	requireEBPF(b, err)
	defer empty.Close()
	ex, err := link.OpenExecutable(lib)
	if err != nil {
		b.Fatal(err)
	}
	up, err := ex.Uprobe("ncclAllReduce", empty, nil)
	requireEBPF(b, err)
	ret, err := ex.Uretprobe("ncclAllReduce", empty, nil)
	requireEBPF(b, err)
	trapOnly := runBench(b, bench, calls)
	up.Close()
	ret.Close()

	if err := tr.AttachLibrary(lib); err != nil {
		requireEBPF(b, err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	drained := make(chan struct{})
	go func() {
		defer close(drained)
		for {
			if _, err := tr.Read(ctx); err != nil {
				return
			}
		}
	}()
	traced := runBench(b, bench, calls)
	plugin := filepath.Join(filepath.Dir(lib), wl.ProfilerName)
	if err := tr.AttachLibrary(plugin); err != nil {
		b.Fatal(err)
	}
	completion := runBench(b, bench, calls, "NCCL_PROFILER_PLUGIN="+plugin)
	cancel()
	<-drained

	b.ReportMetric(untraced, "ns/call-untraced")
	b.ReportMetric(trapOnly, "ns/call-empty-probe")
	b.ReportMetric(traced, "ns/call-traced")
	b.ReportMetric(traced-untraced, "ns/call-ebpf")
	b.ReportMetric(traced-trapOnly, "ns/call-program")
	b.ReportMetric(completion-traced, "ns/call-completion")
	b.ReportMetric(float64(tr.Lost()), "lost")
}

// TestCompletionTraced runs the reference library as a GPU runs NCCL: a
// call enqueues and returns, the stream completes it later, and gpuctl's
// profiler plugin reports the completion. A completion held back (rank 1's
// simulated GPU hung inside a collective) shows as a call that returned
// with no completion, and the completion arrives, with its true time, once
// the hang clears.
func TestCompletionTraced(t *testing.T) {
	const world = 2
	tr := newTracer(t)
	lib, plugin := workload(t, "libnccl.so.2"), workload(t, wl.ProfilerName)
	job := uniqueJob(t)
	col := collect(t, tr, job)
	scanUntilAttached(t, tr, lib)
	scanUntilAttached(t, tr, plugin)
	kernels := t.TempDir()
	ranks := startRanksEnv(t, job, world, func(r int) []string {
		return []string{"REFNCCL_ASYNC=1", "NCCL_PROFILER_PLUGIN=" + plugin,
			"GPUCTL_SIM_KERNEL_DIR=" + kernels, "CUDA_VISIBLE_DEVICES=" + strconv.Itoa(r)}
	}, "--steps", "0", "--compute-ms", "5", "--bytes", "64K")

	type key struct {
		rank int32
		comm uint64
		seq  uint64
	}
	split := func() (calls, done map[key]*api.CollectiveRecord) {
		calls, done = map[key]*api.CollectiveRecord{}, map[key]*api.CollectiveRecord{}
		for _, r := range col.snapshot() {
			if r.Op != api.NCCLOp_NCCL_OP_ALL_REDUCE {
				continue
			}
			k := key{r.Rank, r.Comm, r.Seq}
			if r.Completion {
				done[k] = r
			} else {
				calls[k] = r
			}
		}
		return calls, done
	}
	poll(t, 30*time.Second, "completions of 5 all-reduces on every rank", func() bool {
		_, done := split()
		n := map[int32]int{}
		for k := range done {
			n[k.rank]++
		}
		return n[0] >= 5 && n[1] >= 5
	})
	calls, done := split()
	for k, d := range done {
		c := calls[k]
		if c == nil {
			continue // the call's own record may still be on its way
		}
		if d.StartUnixNano != c.StartUnixNano || d.Pid != c.Pid || d.Bytes != c.Bytes || d.CommNranks != world {
			t.Errorf("completion %v does not match its call %v", d, c)
		}
		if d.GpuStartUnixNano < c.StartUnixNano || d.GpuEndUnixNano < d.GpuStartUnixNano || d.DurationNs != d.GpuEndUnixNano-d.GpuStartUnixNano {
			t.Errorf("completion %v: work from %d to %d, call entered at %d", d, d.GpuStartUnixNano, d.GpuEndUnixNano, c.StartUnixNano)
		}
	}

	// Rank 1's "kernel" never completes: its call returns (the enqueue)
	// and no completion follows while the hang lasts.
	hang := filepath.Join(kernels, "hang-1")
	if err := os.WriteFile(hang, []byte("inside"), 0o644); err != nil {
		t.Fatal(err)
	}
	const held = 500 * time.Millisecond
	var pending key
	poll(t, 30*time.Second, "a call of rank 1 returned "+held.String()+" ago with no completion", func() bool {
		calls, done := split()
		for k, c := range calls {
			end := time.Unix(0, c.StartUnixNano+c.DurationNs)
			if k.rank == 1 && done[k] == nil && time.Since(end) >= held {
				pending = k
				return true
			}
		}
		return false
	})
	cleared := time.Now()
	if err := os.Remove(hang); err != nil {
		t.Fatal(err)
	}
	var d *api.CollectiveRecord
	poll(t, 20*time.Second, "the held collective's completion", func() bool {
		_, done := split()
		d = done[pending]
		return d != nil
	})
	if end := time.Unix(0, d.GpuEndUnixNano); end.Before(cleared) {
		t.Errorf("held collective completed at %v, before the hang cleared at %v", end, cleared)
	}
	for _, rk := range ranks {
		rk.cmd.Process.Signal(syscall.SIGTERM)
	}
	waitRanks(t, ranks, 30*time.Second)
}
