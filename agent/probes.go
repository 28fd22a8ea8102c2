package agent

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	gonvml "github.com/NVIDIA/go-nvml/pkg/nvml"

	"github.com/gpuctl/gpuctl/api"
	"github.com/gpuctl/gpuctl/probes/nccl"
	"github.com/gpuctl/gpuctl/probes/netflow"
	nvmlprobe "github.com/gpuctl/gpuctl/probes/nvml"
	"github.com/gpuctl/gpuctl/probes/rdma"
	"github.com/gpuctl/gpuctl/procfs"
)

// EBPFMode says what nodemon does when the eBPF probes cannot load.
type EBPFMode string

// The eBPF modes.
const (
	EBPFAuto     EBPFMode = "auto"     // use them where the kernel allows; report why not
	EBPFRequired EBPFMode = "required" // refuse to start without them
	EBPFOff      EBPFMode = "off"
)

// ProbeOptions selects the collectors.
type ProbeOptions struct {
	// Node is this node's name; on a host shared by several nodemons each
	// reports only the processes launched for it (GPUCTL_NODE).
	Node string
	// Sim names a simulated host profile (dgx-h100, dgx-a100, dgx-h200);
	// empty means real NVML.
	Sim  string
	EBPF EBPFMode
	// OnlyLaunched traces only the processes nodemon launched for this node
	// (GPUCTL_NODE), for hosts shared by several nodemons.
	OnlyLaunched bool
	// RDMARoot is the sysfs tree of RDMA devices, default /sys/class/infiniband.
	RDMARoot string
	// SimKernelDir, with Sim, is where ranks report the kernel time the
	// simulated GPUs count as utilization (nvml.KernelDirEnv); created
	// when missing. Empty: the GPUs follow the ranks' CPU time alone.
	SimKernelDir string
	// NCCLProfiler is gpuctl's NCCL profiler plugin
	// (libnccl-profiler-gpuctl.so). With NCCL tracing on, its hooks are
	// traced and every rank gets NCCL_PROFILER_PLUGIN naming it, unless
	// nodemon's environment or the job sets its own: then the calls'
	// times are the enqueue's alone on a GPU. Empty: none.
	NCCLProfiler string
}

// Probes are nodemon's collectors.
type Probes struct {
	log     *slog.Logger
	sampler *nvmlprobe.Sampler
	sim     *nvmlprobe.Sim
	// kernelDir is the simulated GPUs' kernel time directory, if any.
	kernelDir string
	// profiler is the NCCL profiler plugin the ranks are given, if any.
	profiler string
	nccl     *nccl.Tracer
	net      *netflow.Tracer
	rdma     string
	// procs resolves a traced pid to its job and rank, and says whether
	// it is this node's; nil without eBPF.
	procs *nccl.ProcTable
	// startup holds what the probes have to report before the first sample
	// (an eBPF probe that could not load, say).
	startup []*api.Event

	mu    sync.Mutex
	calls []*api.CollectiveRecord

	// pace is how many times less often than its interval the server
	// asked for telemetry (TelemetryPace); 0 or 1: the interval itself.
	pace atomic.Uint32
}

// SetPace makes the probes sample and flush factor times less often
// than their interval (1: the interval itself), from the next tick.
func (p *Probes) SetPace(factor uint32) { p.pace.Store(factor) }

// rankEnv is what the probes add to every rank's environment: where to
// report kernel time on simulated GPUs, and the NCCL profiler plugin that
// reports when collectives complete. A job's own environment comes after
// it, so a job that names another plugin keeps it.
func (p *Probes) rankEnv() []string {
	if p == nil {
		return nil
	}
	var env []string
	if p.kernelDir != "" {
		env = append(env, nvmlprobe.KernelDirEnv+"="+p.kernelDir)
	}
	if p.profiler != "" && os.Getenv(ProfilerEnv) == "" {
		env = append(env, ProfilerEnv+"="+p.profiler)
	}
	return env
}

// ProfilerEnv is NCCL's variable naming the profiler plugin to load.
const ProfilerEnv = "NCCL_PROFILER_PLUGIN"

// OpenProbes opens NVML (real or simulated) and, as the mode allows, the
// eBPF tracers.
func OpenProbes(opts ProbeOptions, log *slog.Logger) (*Probes, error) {
	p := &Probes{log: log, rdma: opts.RDMARoot}
	if p.rdma == "" {
		p.rdma = "/sys/class/infiniband"
	}
	var lib gonvml.Interface
	if opts.Sim != "" {
		if opts.SimKernelDir != "" {
			// Ranks may run as other users: writable by all, sticky as /tmp.
			if err := os.MkdirAll(opts.SimKernelDir, 0o755); err != nil {
				return nil, fmt.Errorf("simulated host: kernel time dir: %w", err)
			}
			if err := os.Chmod(opts.SimKernelDir, 0o777|os.ModeSticky); err != nil {
				return nil, fmt.Errorf("simulated host: kernel time dir: %w", err)
			}
		}
		sim, err := nvmlprobe.NewSim(opts.Sim, nvmlprobe.SimOptions{Node: opts.Node, Logger: log, KernelDir: opts.SimKernelDir})
		if err != nil {
			return nil, fmt.Errorf("simulated host: %w", err)
		}
		p.sim, p.kernelDir, lib = sim, opts.SimKernelDir, sim.NVML()
	} else {
		l, err := nvmlprobe.Open()
		if err != nil {
			return nil, fmt.Errorf("%w: install the NVIDIA driver (it provides libnvidia-ml.so.1), or run a simulated host with --sim %s",
				err, strings.Join(nvmlprobe.Profiles(), "|"))
		}
		lib = l
	}
	p.sampler = nvmlprobe.NewSampler(lib, log)
	if opts.EBPF == EBPFOff {
		return p, nil
	}
	procs := nccl.NewProcTable("/proc", opts.Node)
	if opts.OnlyLaunched {
		procs = nccl.NewStrictProcTable("/proc", opts.Node)
	}
	p.procs = procs
	var errs []error
	if t, err := nccl.New(log, nccl.Options{Procs: procs}); err != nil {
		errs = append(errs, err)
	} else {
		p.nccl = t
		p.attachProfiler(opts.NCCLProfiler)
	}
	// Flows are reported for ranks only: the host's other traffic
	// (nodemon's own QUIC among it) is not the job's communication.
	rankOnly := func(pid uint32) (string, int32, bool) {
		job, rank, keep := procs.Lookup(pid)
		return job, rank, keep && job != ""
	}
	if t, err := netflow.New(log, netflow.Options{Lookup: rankOnly}); err != nil {
		errs = append(errs, err)
	} else {
		p.net = t
	}
	if err := errors.Join(errs...); err != nil {
		if opts.EBPF == EBPFRequired {
			p.Close()
			return nil, fmt.Errorf("eBPF probes required (--ebpf=required): %w", err)
		}
		log.Warn("eBPF probes unavailable; NCCL and flow tracing off", "err", err)
		p.startup = append(p.startup, &api.Event{
			TimeUnixNano: time.Now().UnixNano(), Kind: api.EventKind_EVENT_KIND_PROBE, Severity: api.Severity_SEVERITY_WARNING,
			Message: "eBPF probes unavailable, NCCL and flow tracing off: " + err.Error(),
		})
	}
	return p, nil
}

// Close releases every probe.
func (p *Probes) Close() error {
	var errs []error
	if p.nccl != nil {
		errs = append(errs, p.nccl.Close())
	}
	if p.net != nil {
		errs = append(errs, p.net.Close())
	}
	return errors.Join(errs...)
}

// GPUs lists the host's GPUs as NVML (real or simulated) describes them.
func (p *Probes) GPUs() ([]*api.GPUInfo, error) {
	gpus, _, _, err := p.inventory()
	return gpus, err
}

// Simulated reports whether the GPUs are simulated (--sim).
func (p *Probes) Simulated() bool { return p.sim != nil }

func (p *Probes) inventory() ([]*api.GPUInfo, string, string, error) {
	return p.sampler.Inventory()
}

func (p *Probes) simProfile() string {
	if p.sim == nil {
		return ""
	}
	return p.sim.Profile()
}

// Inject injects a fault into a simulated host's GPU.
func (p *Probes) Inject(f *api.InjectFault) error {
	if p.sim == nil {
		return errors.New("fault injection needs a simulated host (nodemon --sim)")
	}
	gpu := int(f.GetGpuIndex())
	switch f.GetKind() {
	case api.FaultKind_FAULT_KIND_HANG_INSIDE:
		return p.sim.Hang(gpu, "inside")
	case api.FaultKind_FAULT_KIND_HANG_OUTSIDE:
		return p.sim.Hang(gpu, "outside")
	case api.FaultKind_FAULT_KIND_CLEAR:
		if err := p.sim.Hang(gpu, ""); err != nil {
			return err
		}
	}
	return p.sim.InjectFactor(gpu, f.GetKind(), f.GetFactor())
}

// prepareLaunch attaches the NCCL probe to the libraries a job's command
// links, before its ranks start.
func (p *Probes) prepareLaunch(l *api.LaunchRanks) {
	if p.nccl == nil || len(l.GetCommand()) == 0 {
		return
	}
	exe, err := exec.LookPath(l.GetCommand()[0])
	if err != nil {
		return
	}
	ldPath := l.GetEnv()["LD_LIBRARY_PATH"]
	if ldPath == "" {
		ldPath = os.Getenv("LD_LIBRARY_PATH")
	}
	libs, err := neededNCCL(exe, ldPath)
	if err != nil {
		p.log.Warn("find NCCL libraries of job command", "job", l.GetJob(), "err", err)
	}
	for _, lib := range libs {
		if err := p.nccl.AttachLibrary(lib); err != nil {
			p.log.Warn("attach NCCL probe", "lib", lib, "err", err)
		}
	}
}

// attachPid attaches the NCCL probe to the NCCL libraries a running
// process mapped (a rank Slurm or Kubernetes started, found after it
// loaded them; uprobes reach mappings made before they attach).
func (p *Probes) attachPid(pid int) {
	if p.nccl == nil {
		return
	}
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/maps", pid))
	if err != nil {
		return
	}
	seen := map[string]bool{}
	for _, line := range strings.Split(string(b), "\n") {
		f := strings.Fields(line)
		if len(f) < 6 || !strings.Contains(filepath.Base(f[5]), "libnccl") || seen[f[5]] {
			continue
		}
		seen[f[5]] = true
		// The path is the process's own: in a pod, in its container's
		// root.
		if err := p.nccl.AttachLibrary(procfs.FileOf("/proc", pid, f[5])); err != nil {
			p.log.Warn("attach NCCL probe", "lib", f[5], "pid", pid, "err", err)
		}
	}
}

// run samples every interval and hands each batch to emit, forwards GPU
// events into eq, and flushes traced calls and flows more often so
// `gpuctl observe -f` stays close to live. Sampling batches carry every
// live rank's status and the NCCL calls in flight; flush batches carry
// the calls in flight when there are any, for stall detection.
func (p *Probes) run(ctx context.Context, interval time.Duration, x *Executor, emit func(*api.Telemetry), eq *eventQueue) {
	for _, e := range p.startup {
		eq.add(e)
	}
	go func() {
		for e := range p.sampler.Events(ctx) {
			eq.add(e)
		}
	}()
	if p.nccl != nil {
		go func() {
			for r := range p.nccl.Records() {
				p.mu.Lock()
				p.calls = append(p.calls, r)
				p.mu.Unlock()
			}
		}()
	}
	base, baseFlush := interval, min(interval, 250*time.Millisecond)
	tick := time.NewTimer(baseFlush)
	defer tick.Stop()
	var lastSample, lastScan time.Time
	var ranks []*api.RankStatus // as of the last sample
	for {
		// An overloaded server asks for less: sampling and flushing
		// both stretch by its factor.
		k := time.Duration(max(p.pace.Load(), 1))
		interval, flush := k*base, k*baseFlush
		now := time.Now()
		t := &api.Telemetry{TimeUnixNano: now.UnixNano()}
		if now.Sub(lastScan) >= time.Second && p.nccl != nil {
			lastScan = now
			if err := p.nccl.Scan(); err != nil {
				p.log.Debug("scan for NCCL libraries", "err", err)
			}
		}
		if now.Sub(lastSample) >= interval-flush/2 {
			lastSample = now
			t.Gpus = p.sampleGPUs(now, x)
			if p.net != nil {
				flows, err := p.net.Drain(now)
				if err != nil {
					p.log.Warn("drain flows", "err", err)
				}
				t.Flows = flows
			}
			rd, err := rdma.Read(p.rdma, now)
			if err != nil {
				p.log.Debug("read RDMA counters", "err", err)
			}
			t.Rdma = rd
		}
		p.mu.Lock()
		t.Collectives, p.calls = p.calls, nil
		p.mu.Unlock()
		var inFlight []*api.CollectiveRecord
		if p.nccl != nil {
			var err error
			if inFlight, err = p.nccl.InFlight(); err != nil {
				p.log.Debug("read NCCL calls in flight", "err", err)
			}
		}
		if len(t.Gpus) > 0 {
			// A sampling batch carries the full current sets, even empty.
			ranks = x.RankStatuses()
			t.Ranks, t.InFlight = ranks, inFlight
		} else if len(inFlight) > 0 {
			// The server replaces both sets from any batch that carries
			// one, so the ranks of the last sample travel along.
			t.Ranks, t.InFlight = ranks, inFlight
		}
		if p.nccl != nil {
			t.LostCollectives = p.nccl.Lost()
		}
		if p.net != nil {
			t.LostNetEvents = p.net.Lost()
		}
		if len(t.Gpus) > 0 || len(t.Collectives) > 0 || len(t.Flows) > 0 || len(t.InFlight) > 0 {
			emit(t)
		}
		tick.Reset(flush)
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
	}
}

// sampleGPUs tells a simulated host which ranks use which GPU, so its
// counters follow what really runs, then samples every GPU.
func (p *Probes) sampleGPUs(now time.Time, x *Executor) []*api.GPUSample {
	if p.sim != nil {
		procs := x.GPUProcesses()
		for g := 0; g < p.sim.GPUCount(); g++ {
			if err := p.sim.SetProcesses(g, procs[uint32(g)]); err != nil {
				p.log.Warn("simulated host: set processes", "gpu", g, "err", err)
			}
		}
	}
	samples, err := p.sampler.Sample(now)
	if err != nil {
		p.log.Warn("sample GPUs", "err", err)
	}
	return samples
}

// listNICs reports the host's network interfaces with addresses.
func listNICs() []*api.NIC {
	ifs, err := net.Interfaces()
	if err != nil {
		return nil
	}
	var out []*api.NIC
	for _, i := range ifs {
		if i.Flags&net.FlagLoopback != 0 || i.Flags&net.FlagUp == 0 {
			continue
		}
		nic := &api.NIC{Name: i.Name, Kind: "ethernet"}
		if strings.HasPrefix(i.Name, "ib") {
			nic.Kind = "infiniband"
		}
		addrs, _ := i.Addrs()
		for _, a := range addrs {
			nic.Addrs = append(nic.Addrs, a.String())
		}
		out = append(out, nic)
	}
	return out
}

// SetCluster names the cluster this node joined: the NCCL and flow probes
// report no process launched for another cluster.
func (p *Probes) SetCluster(id string) {
	if p != nil && p.procs != nil {
		p.procs.SetCluster(id)
	}
}

// attachProfiler traces the profiler plugin's hooks before any rank loads
// it, so no collective's completion goes unseen, and only then gives it to
// the ranks: a plugin nodemon cannot trace would cost them for nothing.
func (p *Probes) attachProfiler(path string) {
	if path == "" {
		return
	}
	if err := p.nccl.AttachLibrary(path); err != nil {
		p.log.Warn("NCCL profiler plugin not used: collective times stay the enqueue's on a GPU", "plugin", path, "err", err)
		return
	}
	p.profiler = path
	p.log.Info("NCCL profiler plugin given to ranks", "plugin", path)
}
