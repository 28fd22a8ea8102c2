//go:build linux && amd64

package nccl

import (
	"bufio"
	"context"
	"debug/elf"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/link"
	"github.com/cilium/ebpf/ringbuf"
	"github.com/cilium/ebpf/rlimit"
	"golang.org/x/sys/unix"

	"github.com/gpuctl/gpuctl/api"
)

// Options tune a Tracer; the zero value is ready to use.
type Options struct {
	// Procs resolves pids to job and rank and filters them; nil means
	// NewProcTable("/proc", ""), which reports every process.
	Procs *ProcTable
	// ProcRoot is where Scan looks for processes; "" means "/proc".
	ProcRoot string
	// Buffer is how many decoded records wait for Read before the reader
	// stops draining the ring buffer (which then counts what it drops).
	Buffer int
}

// Tracer traces the NCCL calls of every process using an attached library.
type Tracer struct {
	log      *slog.Logger
	procs    *ProcTable
	procRoot string

	objs    ncclObjects
	reader  *ringbuf.Reader
	records chan *api.CollectiveRecord

	// bootOffset is unix time minus CLOCK_MONOTONIC (bpf_ktime_get_ns), in
	// ns; refreshed by Scan so a stepped wall clock is followed.
	bootOffset atomic.Int64
	bad        atomic.Uint64 // records that failed to decode

	mu       sync.Mutex
	attached map[fileID][]link.Link
	closed   bool

	done chan struct{}
	wg   sync.WaitGroup
}

type fileID struct{ dev, ino uint64 }

// probes maps each exported NCCL symbol to its entry program.
func (o *ncclObjects) probes() map[string]*ebpf.Program {
	return map[string]*ebpf.Program{
		"ncclAllReduce":     o.NcclAllReduce,
		"ncclAllGather":     o.NcclAllGather,
		"ncclReduceScatter": o.NcclReduceScatter,
		"ncclBroadcast":     o.NcclBroadcast,
		"ncclReduce":        o.NcclReduce,
		"ncclSend":          o.NcclSend,
		"ncclRecv":          o.NcclRecv,
		"ncclGroupStart":    o.NcclGroupStart,
		"ncclGroupEnd":      o.NcclGroupEnd,
		"ncclCommInitRank":  o.NcclCommInitRank,
	}
}

// hooks maps each hook of gpuctl's NCCL profiler plugin to its program:
// entry only, as the hooks return at once.
func (o *ncclObjects) hooks() map[string]*ebpf.Program {
	return map[string]*ebpf.Program{
		"gpuctl_coll_enqueued": o.GpuctlCollEnqueued,
		"gpuctl_coll_done":     o.GpuctlCollDone,
	}
}

// New loads the NCCL probe into the kernel. Nothing is traced until
// AttachLibrary or Scan attaches it to a library. Errors wrap
// ebpf.ErrNotSupported where the kernel lacks a needed feature.
func New(log *slog.Logger, opts Options) (*Tracer, error) {
	// Kernels before 5.11 charge BPF memory to RLIMIT_MEMLOCK; newer ones
	// do not, and there a failure here is harmless.
	memlockErr := rlimit.RemoveMemlock()
	t := &Tracer{
		log:      log,
		procs:    opts.Procs,
		procRoot: opts.ProcRoot,
		attached: make(map[fileID][]link.Link),
		done:     make(chan struct{}),
	}
	if t.procRoot == "" {
		t.procRoot = "/proc"
	}
	if t.procs == nil {
		t.procs = NewProcTable(t.procRoot, "")
	}
	buf := opts.Buffer
	if buf <= 0 {
		buf = 4096
	}
	t.records = make(chan *api.CollectiveRecord, buf)
	if err := loadNcclObjects(&t.objs, nil); err != nil {
		var ve *ebpf.VerifierError
		if errors.As(err, &ve) {
			return nil, fmt.Errorf("load nccl probe: verifier rejected it: %+v", ve)
		}
		return nil, fmt.Errorf("load nccl probe (needs root, or CAP_BPF and CAP_PERFMON; memlock: %v): %w", memlockErr, err)
	}
	rd, err := ringbuf.NewReader(t.objs.NcclEvents)
	if err != nil {
		t.objs.Close()
		return nil, fmt.Errorf("load nccl probe: open ring buffer: %w", err)
	}
	t.reader = rd
	t.syncClock()
	t.wg.Add(1)
	go t.run()
	return t, nil
}

// syncClock records the offset from CLOCK_MONOTONIC to unix time.
func (t *Tracer) syncClock() {
	var ts unix.Timespec
	if err := unix.ClockGettime(unix.CLOCK_MONOTONIC, &ts); err != nil {
		t.log.Warn("read CLOCK_MONOTONIC; keeping the previous offset", "err", err)
		return
	}
	t.bootOffset.Store(time.Now().UnixNano() - ts.Nano())
}

func monotonicNow() uint64 {
	var ts unix.Timespec
	if err := unix.ClockGettime(unix.CLOCK_MONOTONIC, &ts); err != nil {
		return 0
	}
	return uint64(ts.Nano())
}

// run moves records from the ring buffer to the records channel.
func (t *Tracer) run() {
	defer t.wg.Done()
	defer close(t.records)
	var rec ringbuf.Record
	for {
		if err := t.reader.ReadInto(&rec); err != nil {
			if errors.Is(err, ringbuf.ErrClosed) {
				return
			}
			t.log.Warn("read nccl ring buffer", "err", err)
			continue
		}
		c, err := decodeCall(rec.RawSample)
		if err != nil {
			if t.bad.Add(1) == 1 {
				t.log.Error("drop nccl record", "err", err)
			}
			continue
		}
		r := c.record(t.bootOffset.Load(), 0)
		job, rank, keep := t.procs.Lookup(c.Pid)
		if !keep {
			continue
		}
		r.Job, r.Rank = job, rank
		select {
		case t.records <- r:
		case <-t.done:
			return
		}
	}
}

// Records returns the channel of completed calls; it is closed by Close.
func (t *Tracer) Records() <-chan *api.CollectiveRecord { return t.records }

// Read returns the next completed call, waiting until one arrives, ctx ends
// or the tracer is closed (then it returns os.ErrClosed).
func (t *Tracer) Read(ctx context.Context) (*api.CollectiveRecord, error) {
	select {
	case r, ok := <-t.records:
		if !ok {
			return nil, fmt.Errorf("read nccl record: %w", os.ErrClosed)
		}
		return r, nil
	case <-ctx.Done():
		return nil, ctx.Err()
	}
}

// AttachLibrary attaches the probes to the NCCL library at path. Attaching
// the same file twice (by device and inode, whatever the path) is a no-op.
// Symbols the library does not export are skipped; a library exporting
// none of them is an error.
func (t *Tracer) AttachLibrary(path string) error {
	var st unix.Stat_t
	if err := unix.Stat(path, &st); err != nil {
		return fmt.Errorf("attach nccl probe to %s: %w", path, err)
	}
	id := fileID{dev: st.Dev, ino: st.Ino}
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.closed {
		return fmt.Errorf("attach nccl probe to %s: %w", path, os.ErrClosed)
	}
	if _, ok := t.attached[id]; ok {
		return nil
	}
	exported, err := exportedFuncs(path)
	if err != nil {
		return fmt.Errorf("attach nccl probe to %s: %w", path, err)
	}
	ex, err := link.OpenExecutable(path)
	if err != nil {
		return fmt.Errorf("attach nccl probe to %s: %w", path, err)
	}
	var links []link.Link
	var missing []string
	fail := func(err error) error {
		for _, l := range links {
			l.Close()
		}
		return fmt.Errorf("attach nccl probe to %s: %w", path, err)
	}
	for sym, prog := range t.objs.probes() {
		if !exported[sym] {
			missing = append(missing, sym)
			continue
		}
		up, err := ex.Uprobe(sym, prog, nil)
		if err != nil {
			return fail(fmt.Errorf("uprobe %s: %w", sym, err))
		}
		links = append(links, up)
		ret, err := ex.Uretprobe(sym, t.objs.NcclReturn, nil)
		if err != nil {
			return fail(fmt.Errorf("uretprobe %s: %w", sym, err))
		}
		links = append(links, ret)
	}
	for sym, prog := range t.objs.hooks() {
		if !exported[sym] {
			continue
		}
		up, err := ex.Uprobe(sym, prog, nil)
		if err != nil {
			return fail(fmt.Errorf("uprobe %s: %w", sym, err))
		}
		links = append(links, up)
	}
	if len(links) == 0 {
		return fmt.Errorf("attach nccl probe to %s: it exports none of the NCCL functions or profiler hooks traced (is it an NCCL library, or gpuctl's profiler plugin?)", path)
	}
	t.attached[id] = links
	t.log.Info("nccl probe attached", "lib", path, "probes", len(links), "missing", missing)
	return nil
}

// exportedFuncs returns the functions an ELF file defines in its dynamic
// symbol table; a program that only imports ncclAllReduce lists it too, as
// undefined, and must not count.
func exportedFuncs(path string) (map[string]bool, error) {
	f, err := elf.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	syms, err := f.DynamicSymbols()
	if err != nil && !errors.Is(err, elf.ErrNoSymbols) {
		return nil, fmt.Errorf("read dynamic symbols: %w", err)
	}
	out := make(map[string]bool)
	for _, s := range syms {
		if elf.ST_TYPE(s.Info) == elf.STT_FUNC && s.Section != elf.SHN_UNDEF {
			out[s.Name] = true
		}
	}
	return out, nil
}

// Scan attaches to every libnccl.so* mapped by a process on the host that
// is not attached yet, and forgets processes that exited. Libraries that
// cannot be attached are logged and skipped; the error joins those failures.
func (t *Tracer) Scan() error {
	t.syncClock()
	t.procs.Prune()
	libs, pids, err := findLibraries(t.procRoot)
	if err != nil {
		return fmt.Errorf("scan for nccl libraries: %w", err)
	}
	// Read each NCCL process's environment now, while it runs: a record
	// may reach user space only after its process has exited.
	for _, pid := range pids {
		t.procs.Lookup(pid)
	}
	var errs []error
	for _, lib := range libs {
		if err := t.AttachLibrary(lib); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// findLibraries lists, once per mapped file, a path that opens each
// libnccl.so* mapped by any process, through that process's root so it
// resolves inside containers too, and the processes that map one.
func findLibraries(procRoot string) (libs []string, pids []uint32, err error) {
	ents, err := os.ReadDir(procRoot)
	if err != nil {
		return nil, nil, err
	}
	self := os.Getpid()
	seen := make(map[string]bool)
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil || pid == self {
			continue
		}
		dir := filepath.Join(procRoot, e.Name())
		f, err := os.Open(filepath.Join(dir, "maps"))
		if err != nil {
			continue // exited, or a kernel thread we may not read
		}
		sc := bufio.NewScanner(f)
		found := false
		for sc.Scan() {
			path, ok := ncclMapping(sc.Text())
			if !ok {
				continue
			}
			found = true
			full := filepath.Join(dir, "root", path)
			if !seen[full] {
				seen[full] = true
				libs = append(libs, full)
			}
		}
		f.Close()
		if found {
			pids = append(pids, uint32(pid))
		}
	}
	return libs, pids, nil
}

// ncclMapping returns the file of a /proc/PID/maps line when it is an NCCL
// library still present on disk.
func ncclMapping(line string) (string, bool) {
	// address perms offset dev inode path; the path may contain spaces.
	fields := strings.Fields(line)
	if len(fields) < 6 {
		return "", false
	}
	i := strings.Index(line, " /")
	if i < 0 {
		return "", false
	}
	path := line[i+1:]
	if strings.HasSuffix(path, " (deleted)") {
		return "", false
	}
	// NCCL and its profiler plugins (libnccl-profiler-NAME.so, gpuctl's
	// among them); a plugin without gpuctl's hooks is skipped when attached.
	if base := filepath.Base(path); !strings.HasPrefix(base, "libnccl.so") && !strings.HasPrefix(base, "libnccl-profiler") {
		return "", false
	}
	return path, true
}

// InFlight returns the calls that threads are inside right now, with
// InProgress set and DurationNs the time so far. Entries of threads that
// no longer exist are removed.
func (t *Tracer) InFlight() ([]*api.CollectiveRecord, error) {
	var (
		tid  uint32
		call ncclNcclCall
		out  []*api.CollectiveRecord
		dead []uint32
	)
	now := monotonicNow()
	off := t.bootOffset.Load()
	it := t.objs.NcclInflight.Iterate()
	for it.Next(&tid, &call) {
		if !t.procs.alive(call.Pid, call.Tid) {
			dead = append(dead, tid)
			continue
		}
		job, rank, keep := t.procs.Lookup(call.Pid)
		if !keep {
			continue
		}
		r := call.record(off, now)
		r.Job, r.Rank = job, rank
		out = append(out, r)
	}
	if err := it.Err(); err != nil {
		return out, fmt.Errorf("read nccl calls in flight: %w", err)
	}
	for _, tid := range dead {
		// Deleting an entry a new thread reused the id for is harmless:
		// its return probe then finds nothing and drops one record.
		if err := t.objs.NcclInflight.Delete(tid); err != nil && !errors.Is(err, ebpf.ErrKeyNotExist) {
			t.log.Warn("remove in-flight call of exited thread", "tid", tid, "err", err)
		}
	}
	return out, nil
}

// Lost returns how many calls could not be delivered: the ring buffer or
// the in-flight map was full, or a record did not decode.
func (t *Tracer) Lost() uint64 {
	var (
		zero uint32
		vals []uint64
	)
	lost := t.bad.Load()
	if err := t.objs.NcclLost.Lookup(zero, &vals); err != nil {
		t.log.Warn("read nccl lost counter", "err", err)
		return lost
	}
	for _, v := range vals {
		lost += v
	}
	return lost
}

// Close detaches every probe and releases the kernel objects.
func (t *Tracer) Close() error {
	t.mu.Lock()
	if t.closed {
		t.mu.Unlock()
		return nil
	}
	t.closed = true
	var errs []error
	for _, links := range t.attached {
		for _, l := range links {
			errs = append(errs, l.Close())
		}
	}
	t.attached = nil
	t.mu.Unlock()
	close(t.done)
	errs = append(errs, t.reader.Close())
	t.wg.Wait()
	errs = append(errs, t.objs.Close())
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("close nccl tracer: %w", err)
	}
	return nil
}
