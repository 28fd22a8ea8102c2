package nvml

import (
	"fmt"
	"log/slog"
	"math"
	"strings"
	"sync"
	"time"

	"github.com/NVIDIA/go-nvml/pkg/nvml"

	"github.com/gpuctl/gpuctl/api"
)

// Sampler reads GPU inventory, telemetry samples and events through an
// nvml.Interface: the real library from Open or a simulated host's NVML.
// Its methods are safe for concurrent use.
type Sampler struct {
	lib      nvml.Interface
	log      *slog.Logger
	now      func() time.Time
	procRoot string

	mu       sync.Mutex
	devs     []*devState
	throttle throttleCache
	names    map[uint32]procName
	gen      uint64
	xids     map[xidKey]uint32

	qmu     sync.Mutex
	queue   []*api.Event
	dropped uint64
	notify  chan struct{}

	eventsOnce sync.Once
	events     chan *api.Event
}

// SamplerOption adjusts a Sampler.
type SamplerOption func(*Sampler)

// WithClock sets the clock that stamps events coming from NVML's event set
// (samples carry the time given to Sample). Default time.Now.
func WithClock(now func() time.Time) SamplerOption {
	return func(s *Sampler) { s.now = now }
}

// WithProcRoot sets where process names are read. Default /proc.
func WithProcRoot(root string) SamplerOption {
	return func(s *Sampler) { s.procRoot = root }
}

type xidKey struct {
	gpu  int
	code uint32
}

type procName struct {
	name string
	gen  uint64
}

// devState is what the sampler keeps per GPU between samples.
type devState struct {
	index    int
	handle   nvml.Device
	uuid     string
	memTotal uint64
	links    []int
	fields   []nvml.FieldValue // reused for every sample
	warned   map[string]bool

	sampled  bool
	lost     bool
	prevAt   time.Time
	nvl      counterPair
	pcie     counterPair
	eccUnc   uint64
	eccCorr  uint64
	throttle uint64
}

// counterPair is the last reading of a tx/rx byte counter pair.
type counterPair struct {
	ok     bool
	tx, rx uint64
}

// wantedEvents are the NVML event types the sampler listens for.
const wantedEvents = nvml.EventTypeXidCriticalError | nvml.EventTypeDoubleBitEccError | nvml.EventTypeSingleBitEccError

// maxQueuedEvents bounds the events waiting for a reader of Events.
const maxQueuedEvents = 4096

// NewSampler returns a sampler over an initialised NVML library. log
// receives diagnostics; nil discards them.
func NewSampler(lib nvml.Interface, log *slog.Logger, opts ...SamplerOption) *Sampler {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	s := &Sampler{
		lib:      lib,
		log:      log,
		now:      time.Now,
		procRoot: "/proc",
		names:    make(map[uint32]procName),
		xids:     make(map[xidKey]uint32),
		notify:   make(chan struct{}, 1),
	}
	for _, o := range opts {
		o(s)
	}
	return s
}

// initLocked enumerates the GPUs once.
func (s *Sampler) initLocked() error {
	if s.devs != nil {
		return nil
	}
	n, ret := s.lib.DeviceGetCount()
	if ret != nvml.SUCCESS {
		return fmt.Errorf("count GPUs: %w", ret)
	}
	devs := make([]*devState, n)
	for i := range devs {
		d := &devState{index: i, warned: make(map[string]bool)}
		devs[i] = d
		h, ret := s.lib.DeviceGetHandleByIndex(i)
		if ret != nvml.SUCCESS {
			s.log.Warn("GPU has no handle; it is reported lost until it answers", "gpu", i, "err", ret)
			continue
		}
		s.attach(d, h)
	}
	s.devs = devs
	return nil
}

// attach records a GPU's handle and the facts that do not change.
func (s *Sampler) attach(d *devState, h nvml.Device) {
	d.handle = h
	if id, ret := h.GetUUID(); ret == nvml.SUCCESS {
		d.uuid = id
	}
	if m, ret := h.GetMemoryInfo(); ret == nvml.SUCCESS {
		d.memTotal = m.Total
	}
	d.links = d.links[:0]
	for l := 0; l < nvml.NVLINK_MAX_LINKS; l++ {
		st, ret := h.GetNvLinkState(l)
		if ret == nvml.ERROR_INVALID_ARGUMENT || ret == nvml.ERROR_NOT_SUPPORTED && l == 0 {
			break // past this GPU's links, or none at all
		}
		if ret == nvml.SUCCESS && st == nvml.FEATURE_ENABLED {
			d.links = append(d.links, l)
		}
	}
	// Without NVLinks only the PCIe counters are asked for. NVML sums a
	// throughput field over all links when the scope is UINT_MAX.
	d.fields = d.fields[:0]
	if len(d.links) > 0 {
		d.fields = append(d.fields,
			nvml.FieldValue{FieldId: nvml.FI_DEV_NVLINK_THROUGHPUT_DATA_TX, ScopeId: allLinks},
			nvml.FieldValue{FieldId: nvml.FI_DEV_NVLINK_THROUGHPUT_DATA_RX, ScopeId: allLinks})
	}
	d.fields = append(d.fields,
		nvml.FieldValue{FieldId: nvml.FI_DEV_PCIE_COUNT_TX_BYTES},
		nvml.FieldValue{FieldId: nvml.FI_DEV_PCIE_COUNT_RX_BYTES})
}

// allLinks is the field scope that asks NVML for the sum over all NVLinks.
const allLinks = math.MaxUint32

// Inventory describes the GPUs and returns the driver and CUDA versions.
// A GPU that does not answer is listed with its index (and UUID if known).
func (s *Sampler) Inventory() (gpus []*api.GPUInfo, driver, cuda string, err error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if err := s.initLocked(); err != nil {
		return nil, "", "", fmt.Errorf("inventory: %w", err)
	}
	if v, ret := s.lib.SystemGetDriverVersion(); ret == nvml.SUCCESS {
		driver = v
	} else {
		s.log.Warn("driver version unavailable", "err", ret)
	}
	if v, ret := s.lib.SystemGetCudaDriverVersion(); ret == nvml.SUCCESS {
		cuda = cudaVersion(v)
	} else {
		s.log.Warn("CUDA driver version unavailable", "err", ret)
	}
	for _, d := range s.devs {
		gpus = append(gpus, s.describe(d))
	}
	return gpus, driver, cuda, nil
}

func (s *Sampler) describe(d *devState) *api.GPUInfo {
	info := &api.GPUInfo{Index: uint32(d.index), Uuid: d.uuid, MemTotalBytes: d.memTotal}
	h := d.handle
	if h == nil {
		return info
	}
	if n, ret := h.GetName(); ret == nvml.SUCCESS {
		info.Model = n
	}
	if p, ret := h.GetPciInfo(); ret == nvml.SUCCESS {
		info.PciBusId = normalizeBusID(cString(p.BusId[:]))
	}
	if mw, ret := h.GetEnforcedPowerLimit(); ret == nvml.SUCCESS {
		info.PowerLimitMw = mw
	} else if mw, ret := h.GetPowerManagementLimit(); ret == nvml.SUCCESS {
		info.PowerLimitMw = mw
	}
	for _, l := range d.links {
		p, ret := h.GetNvLinkRemotePciInfo(l)
		if ret != nvml.SUCCESS {
			continue
		}
		info.NvlinkPeers = append(info.NvlinkPeers, &api.NVLinkPeer{Link: uint32(l), RemotePciBusId: normalizeBusID(cString(p.BusId[:]))})
	}
	return info
}

// probe runs the NVML calls of one GPU's sample, noting a lost GPU and
// values the GPU does not offer.
type probe struct {
	s    *Sampler
	d    *devState
	lost bool
}

// ok reports whether ret is SUCCESS. A lost GPU is remembered; an
// unexpected error is logged once per GPU and field; NOT_SUPPORTED and
// kindred returns leave the value zero silently.
func (p *probe) ok(ret nvml.Return, field string) bool {
	switch {
	case ret == nvml.SUCCESS:
		return true
	case isLost(ret):
		p.lost = true
	case unsupported(ret):
	default:
		if !p.d.warned[field] {
			p.d.warned[field] = true
			p.s.log.Warn("GPU value unavailable; left zero", "gpu", p.d.index, "field", field, "err", ret)
		}
	}
	return false
}

// Sample reads every GPU once. Values a GPU does not offer are zero; a GPU
// that no longer answers gives a sample with Lost set. Throughputs are
// rates over the time since the previous Sample. The returned samples'
// ThrottleNames slices are shared between samples and must not be changed.
func (s *Sampler) Sample(now time.Time) ([]*api.GPUSample, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if err := s.initLocked(); err != nil {
		return nil, fmt.Errorf("sample: %w", err)
	}
	s.gen++
	out := make([]*api.GPUSample, len(s.devs))
	for i, d := range s.devs {
		out[i] = s.sampleDev(d, now)
	}
	for pid, n := range s.names {
		if n.gen != s.gen {
			delete(s.names, pid)
		}
	}
	return out, nil
}

func (s *Sampler) sampleDev(d *devState, now time.Time) *api.GPUSample {
	if d.handle == nil {
		if h, ret := s.lib.DeviceGetHandleByIndex(d.index); ret == nvml.SUCCESS {
			s.attach(d, h)
		} else {
			return s.lostSample(d, now)
		}
	}
	h := d.handle
	p := probe{s: s, d: d}
	g := &api.GPUSample{Index: uint32(d.index), Uuid: d.uuid, TimeUnixNano: now.UnixNano(), MemTotalBytes: d.memTotal}

	if u, ret := h.GetUtilizationRates(); p.ok(ret, "utilization") {
		g.UtilGpuPercent, g.UtilMemPercent = u.Gpu, u.Memory
	}
	if p.lost {
		return s.lostSample(d, now)
	}
	if m, ret := h.GetMemoryInfo(); p.ok(ret, "memory") {
		g.MemUsedBytes = m.Used
		if m.Total != 0 {
			g.MemTotalBytes = m.Total
		}
	}
	if mw, ret := h.GetPowerUsage(); p.ok(ret, "power") {
		g.PowerMw = mw
	}
	if mj, ret := h.GetTotalEnergyConsumption(); p.ok(ret, "energy") {
		g.EnergyMj = mj
	}
	if c, ret := h.GetTemperature(nvml.TEMPERATURE_GPU); p.ok(ret, "temperature") {
		g.TempC = c
	}
	if mhz, ret := h.GetClockInfo(nvml.CLOCK_SM); p.ok(ret, "sm_clock") {
		g.SmClockMhz = mhz
	}
	if mhz, ret := h.GetClockInfo(nvml.CLOCK_MEM); p.ok(ret, "mem_clock") {
		g.MemClockMhz = mhz
	}
	reasons, ret := h.GetCurrentClocksEventReasons()
	if ret == nvml.ERROR_FUNCTION_NOT_FOUND {
		// Drivers before R535 only know the older name.
		reasons, ret = h.GetCurrentClocksThrottleReasons()
	}
	if p.ok(ret, "clocks_event_reasons") {
		g.ThrottleReasons = reasons
		g.ThrottleNames = s.throttle.names(reasons)
	}
	if p.lost {
		return s.lostSample(d, now)
	}

	var ecc api.ECCCounts
	eccOK := false
	for _, c := range [...]struct {
		t   nvml.MemoryErrorType
		c   nvml.EccCounterType
		dst *uint64
	}{
		{nvml.MEMORY_ERROR_TYPE_CORRECTED, nvml.VOLATILE_ECC, &ecc.VolatileCorrected},
		{nvml.MEMORY_ERROR_TYPE_UNCORRECTED, nvml.VOLATILE_ECC, &ecc.VolatileUncorrected},
		{nvml.MEMORY_ERROR_TYPE_CORRECTED, nvml.AGGREGATE_ECC, &ecc.AggregateCorrected},
		{nvml.MEMORY_ERROR_TYPE_UNCORRECTED, nvml.AGGREGATE_ECC, &ecc.AggregateUncorrected},
	} {
		if n, ret := h.GetTotalEccErrors(c.t, c.c); p.ok(ret, "ecc") {
			*c.dst = n
			eccOK = true
		}
	}
	if eccOK {
		g.Ecc = &ecc
	}
	if pages, ret := h.GetRetiredPages(nvml.PAGE_RETIREMENT_CAUSE_MULTIPLE_SINGLE_BIT_ECC_ERRORS); p.ok(ret, "retired_pages") {
		g.RetiredPagesSbe = uint32(len(pages))
	}
	if pages, ret := h.GetRetiredPages(nvml.PAGE_RETIREMENT_CAUSE_DOUBLE_BIT_ECC_ERROR); p.ok(ret, "retired_pages") {
		g.RetiredPagesDbe = uint32(len(pages))
	}
	if corr, unc, pending, failed, ret := h.GetRemappedRows(); p.ok(ret, "remapped_rows") {
		g.RemappedRowsCorrectable, g.RemappedRowsUncorrectable = uint32(max(corr, 0)), uint32(max(unc, 0))
		g.RemapPending, g.RemapFailure = pending, failed
	}
	if p.lost {
		return s.lostSample(d, now)
	}

	s.rates(&p, g, now)
	if p.lost {
		return s.lostSample(d, now)
	}

	if procs, ret := h.GetComputeRunningProcesses(); p.ok(ret, "processes") && len(procs) > 0 {
		g.Processes = make([]*api.GPUProcess, len(procs))
		for i, pr := range procs {
			g.Processes[i] = &api.GPUProcess{Pid: pr.Pid, UsedMemBytes: pr.UsedGpuMemory, Name: s.procName(pr.Pid)}
		}
	}
	if p.lost {
		return s.lostSample(d, now)
	}
	s.transitions(d, g, now)
	return g
}

// rates fills the NVLink and PCIe throughputs from counter deltas.
func (s *Sampler) rates(p *probe, g *api.GPUSample, now time.Time) {
	d := p.d
	var nvl, pcie counterPair
	for i := range d.fields {
		d.fields[i].NvmlReturn = uint32(nvml.ERROR_UNKNOWN)
	}
	if p.ok(d.handle.GetFieldValues(d.fields), "field_values") {
		n := len(d.fields)
		if n == 4 {
			tx, okTx := fieldUint(&d.fields[0])
			rx, okRx := fieldUint(&d.fields[1])
			// NVML counts NVLink data in KiB.
			nvl = counterPair{ok: okTx && okRx, tx: tx * 1024, rx: rx * 1024}
		}
		tx, okTx := fieldUint(&d.fields[n-2])
		rx, okRx := fieldUint(&d.fields[n-1])
		pcie = counterPair{ok: okTx && okRx, tx: tx, rx: rx}
	}
	if p.lost {
		return
	}
	dt := now.Sub(d.prevAt).Seconds()
	if d.sampled && dt > 0 {
		g.NvlinkTxBytesPerSec, g.NvlinkRxBytesPerSec = rate(d.nvl, nvl, dt)
		g.PcieTxBytesPerSec, g.PcieRxBytesPerSec = rate(d.pcie, pcie, dt)
	}
	if !pcie.ok {
		// No byte counters (before Hopper): NVML's own short-window rate.
		if kb, ret := d.handle.GetPcieThroughput(nvml.PCIE_UTIL_TX_BYTES); p.ok(ret, "pcie_throughput") {
			g.PcieTxBytesPerSec = uint64(kb) * 1024
		}
		if kb, ret := d.handle.GetPcieThroughput(nvml.PCIE_UTIL_RX_BYTES); p.ok(ret, "pcie_throughput") {
			g.PcieRxBytesPerSec = uint64(kb) * 1024
		}
	}
	d.nvl, d.pcie, d.prevAt = nvl, pcie, now
}

// rate turns two readings of a counter pair into bytes per second; a
// missing reading or a counter that went backwards (reset) gives zero.
func rate(prev, cur counterPair, dt float64) (tx, rx uint64) {
	if !prev.ok || !cur.ok {
		return 0, 0
	}
	if cur.tx >= prev.tx {
		tx = uint64(float64(cur.tx-prev.tx) / dt)
	}
	if cur.rx >= prev.rx {
		rx = uint64(float64(cur.rx-prev.rx) / dt)
	}
	return tx, rx
}

// procName returns pid's command name, read once per process.
func (s *Sampler) procName(pid uint32) string {
	n, ok := s.names[pid]
	if !ok {
		n.name = readComm(s.procRoot, pid)
	}
	n.gen = s.gen
	s.names[pid] = n
	return n.name
}

// lostSample reports a GPU that does not answer, and the transition to it.
func (s *Sampler) lostSample(d *devState, now time.Time) *api.GPUSample {
	g := &api.GPUSample{Index: uint32(d.index), Uuid: d.uuid, TimeUnixNano: now.UnixNano(), MemTotalBytes: d.memTotal, Lost: true}
	if !d.lost {
		d.lost = true
		s.enqueue(gpuEvent(d, now.UnixNano(), api.EventKind_EVENT_KIND_GPU_LOST, api.Severity_SEVERITY_CRITICAL, api.XIDClass_XID_CLASS_REBOOT_NODE,
			fmt.Sprintf("GPU %d (%s) no longer answers: it fell off the bus or was lost; reboot the node", d.index, d.uuid)))
	}
	// Rates restart from a fresh reading once the GPU is back.
	d.nvl, d.pcie = counterPair{}, counterPair{}
	return g
}

// gpuEvent builds an event about GPU d.
func gpuEvent(d *devState, ts int64, kind api.EventKind, sev api.Severity, class api.XIDClass, msg string) *api.Event {
	return &api.Event{TimeUnixNano: ts, Kind: kind, Severity: sev, XidClass: class, Message: msg,
		GpuIndex: int32(d.index), GpuUuid: d.uuid}
}

// transitions turns changes between samples into events: a GPU answering
// again, ECC counts rising, a hardware or thermal throttle reason appearing,
// and all of them clearing.
func (s *Sampler) transitions(d *devState, g *api.GPUSample, now time.Time) {
	ts := now.UnixNano()
	if d.lost {
		d.lost = false
		ev := gpuEvent(d, ts, api.EventKind_EVENT_KIND_GPU_LOST, api.Severity_SEVERITY_INFO, api.XIDClass_XID_CLASS_NONE,
			fmt.Sprintf("GPU %d (%s) answers again", d.index, d.uuid))
		ev.Attrs = map[string]string{"state": "recovered"}
		s.enqueue(ev)
	}
	if g.Ecc != nil {
		s.eccRiseLocked(d, g.Ecc.VolatileUncorrected, g.Ecc.VolatileCorrected, ts, "counter")
	}
	slow, was := g.ThrottleReasons&throttleSlowdown, d.throttle&throttleSlowdown
	if d.sampled {
		if began := slow &^ was; began != 0 {
			ev := gpuEvent(d, ts, api.EventKind_EVENT_KIND_THROTTLE, api.Severity_SEVERITY_WARNING, api.XIDClass_XID_CLASS_NONE,
				fmt.Sprintf("GPU %d throttling began at %d °C, SM clock %d MHz: %s", d.index, g.TempC, g.SmClockMhz, joinNames(began)))
			ev.Attrs = map[string]string{"state": "began", "reasons": joinNames(began)}
			s.enqueue(ev)
		}
		if slow == 0 && was != 0 {
			ev := gpuEvent(d, ts, api.EventKind_EVENT_KIND_THROTTLE, api.Severity_SEVERITY_INFO, api.XIDClass_XID_CLASS_NONE,
				fmt.Sprintf("GPU %d throttling ended at %d °C, SM clock %d MHz", d.index, g.TempC, g.SmClockMhz))
			ev.Attrs = map[string]string{"state": "ended", "reasons": joinNames(was)}
			s.enqueue(ev)
		}
	}
	d.throttle = g.ThrottleReasons
	d.sampled = true
}

// eccRiseLocked compares ECC counts with the last seen and reports a rise.
// Both the samples and NVML's ECC events come through here, so one error
// seen by both is reported once. A count that fell was reset with the GPU.
func (s *Sampler) eccRiseLocked(d *devState, unc, corr uint64, ts int64, source string) {
	if !d.sampled && source == "counter" {
		d.eccUnc, d.eccCorr = unc, corr
		return
	}
	if unc > d.eccUnc {
		n := uint32(min(unc-d.eccUnc, 1<<32-1))
		ev := gpuEvent(d, ts, api.EventKind_EVENT_KIND_ECC, api.Severity_SEVERITY_CRITICAL, api.XIDClass_XID_CLASS_RESET_GPU,
			fmt.Sprintf("GPU %d: %d uncorrectable ECC error(s) (volatile count %d); reset the GPU to remap the row", d.index, n, unc))
		ev.Count = n
		ev.Attrs = map[string]string{"source": source, "type": "uncorrectable"}
		s.enqueue(ev)
	}
	if corr > d.eccCorr {
		n := uint32(min(corr-d.eccCorr, 1<<32-1))
		ev := gpuEvent(d, ts, api.EventKind_EVENT_KIND_ECC, api.Severity_SEVERITY_INFO, api.XIDClass_XID_CLASS_NONE,
			fmt.Sprintf("GPU %d: %d corrected ECC error(s) (volatile count %d)", d.index, n, corr))
		ev.Count = n
		ev.Attrs = map[string]string{"source": source, "type": "corrected"}
		s.enqueue(ev)
	}
	d.eccUnc, d.eccCorr = unc, corr
}

func joinNames(mask uint64) string {
	return strings.Join(DecodeThrottleReasons(mask), ",")
}
