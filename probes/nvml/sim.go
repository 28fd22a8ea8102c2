package nvml

import (
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock/dgxa100"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock/dgxh100"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock/dgxh200"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock/server"
	"github.com/google/uuid"

	"github.com/gpuctl/gpuctl/api"
	"github.com/gpuctl/gpuctl/procfs"
)

// profile is the physical description of one simulated DGX model.
type profile struct {
	name      string
	newServer func() *server.Server
	model     string    // marketing name NVML reports
	busIDs    [8]string // GPU PCI addresses, in NVML's form
	switches  []string  // NVSwitch PCI addresses the GPUs' links end on
	links     int       // NVLinks per GPU
	tdpW      float64   // power limit
	idleW     float64   // power with no work
	maxSM     uint32    // boost SM clock, MHz
	idleSM    uint32    // idle SM clock, MHz
	memMHz    uint32    // HBM clock, MHz
	loadC     float64   // steady temperature at full power
	swSlowC   float64   // temperature at which software thermal slowdown starts
	hwSlowC   float64   // temperature at which hardware thermal slowdown starts
	pcieBytes bool      // offers the PCIe byte-counter fields (Hopper and newer)
}

// DGX system layouts: GPU and NVSwitch bus addresses as on the real boxes.
var profiles = map[string]*profile{
	"dgx-a100": {
		name: "dgx-a100", newServer: dgxa100.New, model: "NVIDIA A100-SXM4-40GB",
		busIDs:   [8]string{"07", "0F", "47", "4E", "87", "90", "B7", "BD"},
		switches: []string{"C4", "C5", "C6", "C7", "C8", "C9"},
		links:    12, tdpW: 400, idleW: 52, maxSM: 1410, idleSM: 210, memMHz: 1215,
		loadC: 68, swSlowC: 85, hwSlowC: 90, pcieBytes: false,
	},
	"dgx-h100": {
		name: "dgx-h100", newServer: dgxh100.New, model: "NVIDIA H100 80GB HBM3",
		busIDs:   [8]string{"1B", "43", "52", "61", "9D", "C3", "D1", "DF"},
		switches: []string{"05", "06", "07", "08"},
		links:    18, tdpW: 700, idleW: 70, maxSM: 1980, idleSM: 345, memMHz: 2619,
		loadC: 74, swSlowC: 87, hwSlowC: 90, pcieBytes: true,
	},
	"dgx-h200": {
		name: "dgx-h200", newServer: dgxh200.New, model: "NVIDIA H200",
		busIDs:   [8]string{"1B", "43", "52", "61", "9D", "C3", "D1", "DF"},
		switches: []string{"05", "06", "07", "08"},
		links:    18, tdpW: 700, idleW: 75, maxSM: 1980, idleSM: 345, memMHz: 3201,
		loadC: 72, swSlowC: 87, hwSlowC: 90, pcieBytes: true,
	},
}

// Profiles lists the simulated host profiles NewSim accepts.
func Profiles() []string {
	names := make([]string, 0, len(profiles))
	for n := range profiles {
		names = append(names, n)
	}
	slices.Sort(names)
	return names
}

// Model constants shared by every profile.
const (
	ambientC = 30.0 // inlet air plus board offset
	faultC   = 98.0 // where a GPU with failed cooling heads
	tauC     = 12 * time.Second
	tauFault = 3 * time.Second
	// loadPower is the share of the power limit a fully busy training
	// process draws.
	loadPower = 0.92
	// minStep is the least model time between two updates, so that the many
	// calls of one sample read one consistent state.
	minStep = 100 * time.Millisecond
	// cpuWindow is the least real time over which a process's CPU use is
	// measured; /proc counts CPU time in 10 ms ticks.
	cpuWindow = 50 * time.Millisecond
	// contextBytes is what a CUDA context takes on the GPU before any data.
	contextBytes = 1 << 30
	// rssFactor scales a process's resident host memory to its GPU memory:
	// a rank keeps its model state on the GPU, far larger than its host copy.
	rssFactor = 16
	// eventQueue bounds an event set's undelivered events, as the driver's
	// queue is bounded.
	eventQueue = 256
)

// SimOptions configures a simulated host. The zero value is a host on the
// real clock reading the real /proc.
type SimOptions struct {
	// Now is the model clock: sample times, energy and temperature follow
	// it. Default time.Now.
	Now func() time.Time
	// CPUNow is the clock a process's CPU time is divided by to give its
	// busy fraction. CPU time is real, so this stays time.Now unless ProcRoot
	// points at a fake /proc.
	CPUNow func() time.Time
	// ProcRoot is where process statistics are read. Default /proc.
	ProcRoot string
	// Node names the host. When set, GPU UUIDs are derived from it and the
	// profile, so they survive a restart; otherwise they are random.
	Node string
	// ProcessMemBytes, when non-zero, is the GPU memory every process uses.
	// Otherwise a process uses a 1 GiB context plus 16 times its resident
	// host memory.
	ProcessMemBytes uint64
	// Logger receives the simulation's diagnostics. Default: discarded.
	Logger *slog.Logger
	// KernelDir, when set, is where processes on the simulated GPUs report
	// the time their "kernels" ran: a file named by the pid holding the
	// total nanoseconds in decimal (ringtrain writes it when given the
	// directory as GPUCTL_SIM_KERNEL_DIR). A process busy that way keeps
	// its GPU busy without keeping a CPU busy.
	//
	// The host also writes there what its ranks' work follows: gpu-<N>.speed,
	// the share of full speed GPU N computes at under load (its SM clock
	// over the boost clock), and link.speed, the share of full speed the
	// host's NCCL transfers keep (FAULT_KIND_LINK_SLOW). Both hold a
	// decimal fraction, replaced by rename; a missing file means 1.
	KernelDir string
}

// KernelDirEnv names the environment variable that gives a process on a
// simulated GPU the directory where it reports its kernel time.
const KernelDirEnv = "GPUCTL_SIM_KERNEL_DIR"

// Sim is a simulated DGX host. Its NVML view (NVML) is go-nvml's mock server
// for the profile, with every dynamic counter driven by a workload model fed
// from the processes assigned to each GPU (SetProcesses) and by injected
// faults (Inject).
//
// The model, per GPU, at each step of at least 100 ms of model time:
//   - busy = the sum over its live processes of the larger of CPU time used
//     (read from /proc/<pid>/stat) and kernel time reported (in
//     SimOptions.KernelDir), over real time elapsed (a process on two GPUs
//     counts half on each), capped at 1. Utilization is busy·100 %, memory utilization
//     busy·60 %.
//   - power = idle + (0.92·limit − idle)·busy; halved under hardware thermal
//     slowdown; capped at the limit (sw_power_cap). The energy counter is the
//     integral of power.
//   - temperature moves toward ambient + (power/limit)·(load temperature −
//     ambient) with a 12 s time constant; with the thermal fault toward 98 °C
//     with a 3 s constant. Hardware thermal slowdown holds while the fault is
//     set and the GPU is above its slowdown temperature; clocks then halve.
//     A slow GPU (FAULT_KIND_SLOW) runs its clocks at its factor, with the
//     hardware slowdown reason.
//   - memory used = per process, SimOptions.ProcessMemBytes or a 1 GiB
//     context + 16·RSS, capped at 95 % of the GPU's memory.
//   - NVLink bytes = the processes' read/write syscall bytes (rchar/wchar in
//     /proc/<pid>/io: the reference workload's collectives go through
//     sockets); PCIe bytes = their storage bytes (read_bytes/write_bytes:
//     data loading and checkpoints staged through the host).
//
// A GPU with no live process idles: idle power and clock, gpu_idle reason,
// cooling toward its idle temperature.
type Sim struct {
	prof *profile
	srv  *server.Server
	lib  *simLib
	opts SimOptions
	log  *slog.Logger

	mu    sync.Mutex
	gpus  []*simGPU
	last  time.Time
	procs map[uint32]*simProc
	sets  map[*simEventSet]struct{}
	buf   []byte
	// link is the share of full speed the host's transfers keep, 1 unless
	// FAULT_KIND_LINK_SLOW set it; linkWritten what link.speed holds.
	link, linkWritten float64
}

// simProc is the last reading of one process.
type simProc struct {
	startTime uint64
	cpuTicks  uint64
	cpuAt     time.Time
	kernelNs  uint64  // kernel time it last reported
	frac      float64 // busy fraction over the last window
	io        procIO
	ioOK      bool
	dio       procIO // I/O since the previous step
	rssBytes  uint64
	gpus      int // how many GPUs it is assigned to
}

// simGPU is the model state of one GPU.
type simGPU struct {
	index  int
	dev    *server.Device
	handle *simDevice
	pids   []uint32

	util, memUtil  float64
	powerW         float64
	energyJ        float64
	tempC          float64
	smMHz          uint32
	reasons        uint64
	memUsed        uint64
	procs          []nvml.ProcessInfo
	nvlTx, nvlRx   uint64 // bytes
	pcieTx, pcieRx uint64 // bytes
	pcieTxKBs      uint32
	pcieRxKBs      uint32
	ecc            [nvml.MEMORY_ERROR_TYPE_COUNT][nvml.ECC_COUNTER_TYPE_COUNT]uint64
	remapCorr      int
	remapUnc       int
	remapPending   bool
	remapFailure   bool
	lost           bool
	thermalFault   bool
	// slow is the share of full speed FAULT_KIND_SLOW left (1: none);
	// speedWritten what gpu-<N>.speed holds (0: not written yet).
	slow         float64
	speedWritten float64
}

// NewSim builds a simulated host of the named profile (see Profiles).
func NewSim(name string, opts SimOptions) (*Sim, error) {
	prof, ok := profiles[name]
	if !ok {
		return nil, fmt.Errorf("simulated GPU profile %q is unknown; valid profiles: %s", name, strings.Join(Profiles(), ", "))
	}
	if opts.Now == nil {
		opts.Now = time.Now
	}
	if opts.CPUNow == nil {
		opts.CPUNow = time.Now
	}
	if opts.ProcRoot == "" {
		opts.ProcRoot = "/proc"
	}
	log := opts.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	s := &Sim{
		prof:  prof,
		srv:   prof.newServer(),
		opts:  opts,
		log:   log.With("sim_profile", name),
		procs: make(map[uint32]*simProc),
		sets:  make(map[*simEventSet]struct{}),
		buf:   make([]byte, 1024),
		last:  opts.Now(),
		link:  1,
	}
	if len(s.srv.Devices) != len(prof.busIDs) {
		return nil, fmt.Errorf("simulated profile %s: mock server has %d GPUs, layout has %d", name, len(s.srv.Devices), len(prof.busIDs))
	}
	s.lib = &simLib{Server: s.srv, sim: s}
	for i, d := range s.srv.Devices {
		dev, ok := d.(*server.Device)
		if !ok {
			return nil, fmt.Errorf("simulated profile %s: mock device %d is a %T, not *server.Device", name, i, d)
		}
		dev.Config.Name = prof.model
		dev.PciBusID = "00000000:" + prof.busIDs[i] + ":00.0"
		if opts.Node != "" {
			id := uuid.NewSHA1(uuid.NameSpaceURL, []byte("gpuctl-sim:"+opts.Node+"/"+name+"/"+fmt.Sprint(i)))
			dev.UUID = "GPU-" + id.String()
		}
		g := &simGPU{index: i, dev: dev, tempC: idleTemp(prof), smMHz: prof.idleSM,
			powerW: prof.idleW, reasons: nvml.ClocksEventReasonGpuIdle, slow: 1}
		g.handle = &simDevice{Device: dev, sim: s, gpu: g}
		s.gpus = append(s.gpus, g)
		s.setDeviceFuncs(g)
	}
	// A speed file left by an earlier run would slow new ranks.
	s.publishSpeedsLocked()
	return s, nil
}

func idleTemp(p *profile) float64 {
	return ambientC + p.idleW/p.tdpW*(p.loadC-ambientC)
}

// NVML returns the simulated host's NVML interface, for NewSampler.
func (s *Sim) NVML() nvml.Interface { return s.lib }

// Server returns the underlying go-nvml mock server. Its devices' function
// fields are the simulation; replacing one changes what the host answers.
func (s *Sim) Server() *server.Server { return s.srv }

// Profile returns the profile name the host was built from.
func (s *Sim) Profile() string { return s.prof.name }

// GPUCount returns the number of simulated GPUs.
func (s *Sim) GPUCount() int { return len(s.gpus) }

// SetProcesses declares which host processes use GPU gpu, replacing any
// earlier list. Processes that exit are dropped at the next step.
func (s *Sim) SetProcesses(gpu int, pids []uint32) error {
	if err := s.checkGPU(gpu); err != nil {
		return fmt.Errorf("set processes: %w", err)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	s.gpus[gpu].pids = slices.Clone(pids)
	s.countAssignmentsLocked()
	return nil
}

// countAssignmentsLocked records how many GPUs each process is on, so a
// process's load is shared between them.
func (s *Sim) countAssignmentsLocked() {
	for _, p := range s.procs {
		p.gpus = 0
	}
	for _, g := range s.gpus {
		for _, pid := range g.pids {
			if p, ok := s.procs[pid]; ok {
				p.gpus++
			}
		}
	}
}

func (s *Sim) checkGPU(gpu int) error {
	if gpu < 0 || gpu >= len(s.gpus) {
		return fmt.Errorf("GPU %d does not exist: this %s host has GPUs 0-%d", gpu, s.prof.name, len(s.gpus)-1)
	}
	return nil
}

// Inject applies a fault to GPU gpu (Inject with a factor of 1 for the
// kinds that take one); see InjectFactor.
func (s *Sim) Inject(gpu int, kind api.FaultKind) error { return s.InjectFactor(gpu, kind, 1) }

// InjectFactor applies a fault to GPU gpu:
//   - FAULT_KIND_XID79: Xid 79 is raised, then the GPU falls off the bus and
//     answers ERROR_GPU_IS_LOST to every call.
//   - FAULT_KIND_XID48: a double-bit ECC error: the uncorrectable counts and
//     uncorrectable remapped rows rise, a row remap is pending, and Xid 48
//     and a double-bit ECC event are raised.
//   - FAULT_KIND_ECC_UNCORRECTABLE: the same counters rise and a double-bit
//     ECC event is raised, without an Xid.
//   - FAULT_KIND_THERMAL: cooling fails; the GPU heats toward 98 °C and
//     throttles once past its slowdown temperature.
//   - FAULT_KIND_GPU_LOST: the GPU stops answering without an Xid.
//   - FAULT_KIND_SLOW: the GPU runs at factor of its speed: its clocks
//     drop to that share, with the hardware slowdown reason, and its ranks
//     (reading gpu-<N>.speed) take 1/factor as long to compute.
//   - FAULT_KIND_LINK_SLOW: the host's NCCL transfers run at factor of
//     their speed (link.speed, read by the reference NCCL library); gpu
//     is not used.
//   - FAULT_KIND_CLEAR: as a GPU reset: the GPU answers again, cooling
//     returns, its slowdown ends, volatile ECC counts restart from zero and
//     pending row remaps take effect. Aggregate counts and remapped rows
//     stay. It also ends a slow link.
func (s *Sim) InjectFactor(gpu int, kind api.FaultKind, factor float64) error {
	if kind == api.FaultKind_FAULT_KIND_SLOW || kind == api.FaultKind_FAULT_KIND_LINK_SLOW {
		if !(factor > 0 && factor <= 1) {
			return fmt.Errorf("inject %s: factor %g is not a share of full speed: give one in (0, 1], e.g. 0.7", kind, factor)
		}
	}
	if kind == api.FaultKind_FAULT_KIND_LINK_SLOW {
		if s.opts.KernelDir == "" {
			return fmt.Errorf("inject %s: this simulated host has no directory to tell its ranks' NCCL (start nodemon with --sim and a --data-dir)", kind)
		}
		gpu = 0
	}
	if err := s.checkGPU(gpu); err != nil {
		return fmt.Errorf("inject %s: %w", kind, err)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	s.stepLocked()
	g := s.gpus[gpu]
	switch kind {
	case api.FaultKind_FAULT_KIND_XID79:
		s.emitLocked(g, nvml.EventTypeXidCriticalError, 79)
		g.lost = true
	case api.FaultKind_FAULT_KIND_XID48:
		s.uncorrectableLocked(g)
		s.emitLocked(g, nvml.EventTypeDoubleBitEccError, 0)
		s.emitLocked(g, nvml.EventTypeXidCriticalError, 48)
	case api.FaultKind_FAULT_KIND_ECC_UNCORRECTABLE:
		s.uncorrectableLocked(g)
		s.emitLocked(g, nvml.EventTypeDoubleBitEccError, 0)
	case api.FaultKind_FAULT_KIND_THERMAL:
		g.thermalFault = true
	case api.FaultKind_FAULT_KIND_GPU_LOST:
		g.lost = true
	case api.FaultKind_FAULT_KIND_SLOW:
		g.slow = factor
	case api.FaultKind_FAULT_KIND_LINK_SLOW:
		s.link = factor
	case api.FaultKind_FAULT_KIND_CLEAR:
		g.lost = false
		g.thermalFault = false
		g.slow = 1
		s.link = 1
		for t := range g.ecc {
			g.ecc[t][nvml.VOLATILE_ECC] = 0
		}
		g.remapPending = false
	default:
		return fmt.Errorf("inject on GPU %d: fault kind %s is not one the simulated host knows; use XID79, XID48, ECC_UNCORRECTABLE, THERMAL, GPU_LOST, SLOW, LINK_SLOW or CLEAR", gpu, kind)
	}
	s.publishSpeedsLocked()
	s.log.Info("fault injected", "gpu", gpu, "fault", kind.String(), "factor", factor)
	return nil
}

// loadedClock is the SM clock g runs at when busy, from its state now.
func (s *Sim) loadedClock(g *simGPU) uint32 {
	sm, _ := s.throttle(g, s.prof.maxSM)
	return sm
}

// throttle applies g's slowdowns to clock sm, with their reasons.
func (s *Sim) throttle(g *simGPU, sm uint32) (uint32, uint64) {
	pr := s.prof
	var reasons uint64
	if g.tempC >= pr.swSlowC {
		reasons |= nvml.ClocksEventReasonSwThermalSlowdown
		sm = sm * 85 / 100
	}
	if g.thermalFault && g.tempC >= pr.hwSlowC {
		reasons |= nvml.ClocksThrottleReasonHwSlowdown | nvml.ClocksThrottleReasonHwThermalSlowdown
		sm = max(sm/2, pr.idleSM)
	}
	if g.slow < 1 {
		reasons |= nvml.ClocksThrottleReasonHwSlowdown
		sm = max(uint32(float64(sm)*g.slow), pr.idleSM)
	}
	return sm, reasons
}

// publishSpeedsLocked writes each GPU's loaded speed and the link speed to
// KernelDir where they changed, so ranks follow their GPU's clocks.
func (s *Sim) publishSpeedsLocked() {
	if s.opts.KernelDir == "" {
		return
	}
	for _, g := range s.gpus {
		if g.lost {
			continue
		}
		sp := float64(s.loadedClock(g)) / float64(s.prof.maxSM)
		if sp != g.speedWritten && s.writeSpeed(fmt.Sprintf("gpu-%d.speed", g.index), sp) {
			g.speedWritten = sp
		}
	}
	if s.link != s.linkWritten && s.writeSpeed("link.speed", s.link) {
		s.linkWritten = s.link
	}
}

// writeSpeed replaces KernelDir/name with speed; false when it could not.
func (s *Sim) writeSpeed(name string, speed float64) bool {
	path := filepath.Join(s.opts.KernelDir, name)
	tmp := path + ".tmp"
	if err := os.WriteFile(tmp, []byte(strconv.FormatFloat(speed, 'f', 4, 64)+"\n"), 0o644); err != nil {
		s.log.Warn("simulated speed not written; ranks keep the old one", "file", path, "err", err)
		return false
	}
	if err := os.Rename(tmp, path); err != nil {
		s.log.Warn("simulated speed not written; ranks keep the old one", "file", path, "err", err)
		return false
	}
	return true
}

func (s *Sim) uncorrectableLocked(g *simGPU) {
	g.ecc[nvml.MEMORY_ERROR_TYPE_UNCORRECTED][nvml.VOLATILE_ECC]++
	g.ecc[nvml.MEMORY_ERROR_TYPE_UNCORRECTED][nvml.AGGREGATE_ECC]++
	g.remapUnc++
	g.remapPending = true
}

// emitLocked queues an NVML event for every event set registered for it.
func (s *Sim) emitLocked(g *simGPU, typ uint64, data uint64) {
	for set := range s.sets {
		if set.regs[g]&typ == 0 {
			continue
		}
		select {
		case set.ch <- nvml.EventData{Device: g.handle, EventType: typ, EventData: data}:
		default:
			s.log.Warn("event set full; event dropped", "gpu", g.index, "event_type", typ, "data", data)
		}
	}
}

// stepLocked advances the model to the clock's time if at least minStep has
// passed since the last step.
func (s *Sim) stepLocked() {
	now := s.opts.Now()
	dt := now.Sub(s.last)
	if dt < minStep {
		return
	}
	s.last = now
	s.refreshProcsLocked()
	sec := dt.Seconds()
	for _, g := range s.gpus {
		s.stepGPULocked(g, sec)
	}
	s.publishSpeedsLocked()
}

// refreshProcsLocked reads every assigned process once, drops those that
// have exited and measures the rest.
func (s *Sim) refreshProcsLocked() {
	cpuNow := s.opts.CPUNow()
	seen := make(map[uint32]bool, len(s.procs))
	changed := false
	for _, g := range s.gpus {
		live := g.pids[:0]
		for _, pid := range g.pids {
			if done, ok := seen[pid]; ok {
				if done {
					live = append(live, pid)
				}
				continue
			}
			ok := s.readProcLocked(pid, cpuNow)
			seen[pid] = ok
			if ok {
				live = append(live, pid)
			}
		}
		if len(live) != len(g.pids) {
			changed = true
		}
		g.pids = live
	}
	for pid := range s.procs {
		if !seen[pid] {
			delete(s.procs, pid)
		}
	}
	if changed || len(seen) > 0 {
		s.countAssignmentsLocked()
	}
}

// readProcLocked updates the reading of pid; false when it no longer runs.
func (s *Sim) readProcLocked(pid uint32, cpuNow time.Time) bool {
	st, pio, ioOK, err := readProc(s.opts.ProcRoot, pid, s.buf)
	if err != nil {
		if !errors.Is(err, fs.ErrNotExist) && !errors.Is(err, errZombie) {
			s.log.Warn("process unreadable; dropped from its GPU", "pid", pid, "err", err)
		} else {
			s.log.Debug("process exited; dropped from its GPU", "pid", pid)
		}
		delete(s.procs, pid)
		if s.opts.KernelDir != "" {
			// Its report would be read as the next holder of the pid's.
			os.Remove(filepath.Join(s.opts.KernelDir, strconv.FormatUint(uint64(pid), 10)))
		}
		return false
	}
	p, ok := s.procs[pid]
	if !ok || p.startTime != st.StartTicks {
		// First sight, or the pid now names another process.
		s.procs[pid] = &simProc{startTime: st.StartTicks, cpuTicks: st.UTime + st.STime, cpuAt: cpuNow,
			kernelNs: s.kernelNsLocked(pid), io: pio, ioOK: ioOK, rssBytes: st.RSSPages * uint64(os.Getpagesize())}
		return true
	}
	p.rssBytes = st.RSSPages * uint64(os.Getpagesize())
	if el := cpuNow.Sub(p.cpuAt); el >= cpuWindow {
		cpu := st.UTime + st.STime
		used := float64(cpu-min(cpu, p.cpuTicks)) / procfs.ClockTicks
		kernel := s.kernelNsLocked(pid)
		ran := float64(kernel-min(kernel, p.kernelNs)) / 1e9
		p.frac = max(used, ran) / el.Seconds()
		p.cpuTicks, p.kernelNs, p.cpuAt = cpu, kernel, cpuNow
	}
	p.dio = procIO{}
	if ioOK && p.ioOK {
		p.dio = procIO{
			rchar:      delta(pio.rchar, p.io.rchar),
			wchar:      delta(pio.wchar, p.io.wchar),
			readBytes:  delta(pio.readBytes, p.io.readBytes),
			writeBytes: delta(pio.writeBytes, p.io.writeBytes),
		}
	}
	p.io, p.ioOK = pio, ioOK
	return true
}

// kernelNsLocked is the kernel time pid reported, 0 when it reports none.
func (s *Sim) kernelNsLocked(pid uint32) uint64 {
	if s.opts.KernelDir == "" {
		return 0
	}
	b, err := readInto(filepath.Join(s.opts.KernelDir, strconv.FormatUint(uint64(pid), 10)), s.buf)
	if err != nil {
		return 0
	}
	ns, err := strconv.ParseUint(strings.TrimSpace(string(b)), 10, 64)
	if err != nil {
		s.log.Debug("kernel time unreadable", "pid", pid, "err", err)
		return 0
	}
	return ns
}

func delta(now, before uint64) uint64 {
	if now < before {
		return 0
	}
	return now - before
}

// stepGPULocked advances one GPU by sec seconds.
func (s *Sim) stepGPULocked(g *simGPU, sec float64) {
	if g.lost {
		// Nothing is read from a GPU off the bus; its state waits for CLEAR.
		return
	}
	pr := s.prof
	busy := 0.0
	var dio procIO
	var mem uint64
	total := g.dev.MemoryInfo.Total
	limit := total / 100 * 95
	g.procs = g.procs[:0]
	for _, pid := range g.pids {
		p := s.procs[pid]
		if p == nil {
			continue
		}
		share := float64(max(p.gpus, 1))
		busy += p.frac / share
		n := uint64(max(p.gpus, 1))
		dio.rchar += p.dio.rchar / n
		dio.wchar += p.dio.wchar / n
		dio.readBytes += p.dio.readBytes / n
		dio.writeBytes += p.dio.writeBytes / n
		use := s.opts.ProcessMemBytes
		if use == 0 {
			use = contextBytes + rssFactor*p.rssBytes
		}
		use = min(use, limit-min(limit, mem))
		mem += use
		g.procs = append(g.procs, nvml.ProcessInfo{Pid: pid, UsedGpuMemory: use})
	}
	busy = math.Min(busy, 1)

	// Heat from the last interval's power, then this interval's state.
	g.energyJ += g.powerW * sec
	target, tau := ambientC+g.powerW/pr.tdpW*(pr.loadC-ambientC), tauC
	if g.thermalFault {
		target, tau = faultC, tauFault
	}
	g.tempC += (target - g.tempC) * (1 - math.Exp(-sec/tau.Seconds()))

	var reasons uint64
	power := pr.idleW + (loadPower*pr.tdpW-pr.idleW)*busy
	sm := pr.maxSM
	if busy == 0 {
		reasons |= nvml.ClocksEventReasonGpuIdle
		sm = pr.idleSM
	}
	sm, thr := s.throttle(g, sm)
	reasons |= thr
	if g.thermalFault && g.tempC >= pr.hwSlowC {
		power *= 0.5
	}
	if power > pr.tdpW {
		power = pr.tdpW
		reasons |= nvml.ClocksEventReasonSwPowerCap
	}
	g.util, g.memUtil = busy*100, busy*60
	g.powerW, g.smMHz, g.reasons, g.memUsed = power, sm, reasons, mem

	g.nvlTx += dio.wchar
	g.nvlRx += dio.rchar
	g.pcieTx += dio.writeBytes
	g.pcieRx += dio.readBytes
	g.pcieTxKBs = uint32(min(float64(dio.writeBytes)/1024/sec, math.MaxUint32))
	g.pcieRxKBs = uint32(min(float64(dio.readBytes)/1024/sec, math.MaxUint32))
}
