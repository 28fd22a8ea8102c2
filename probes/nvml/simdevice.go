package nvml

import (
	"strings"
	"sync"
	"time"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock/server"
)

// The mock server's generated methods record every call in a slice that
// only grows (and, for calls with arguments, keeps the arguments). A host
// sampled every second for weeks must not keep that history, so the handles
// the simulated host gives out are thin wrappers whose methods call the
// mock's function fields directly. The function fields stay the single
// place the simulation lives; the mock devices answer the same when used
// directly.

// simLib is the simulated host's nvml.Interface.
type simLib struct {
	*server.Server
	sim *Sim
}

// DeviceGetCount returns the number of simulated GPUs.
func (l *simLib) DeviceGetCount() (int, nvml.Return) { return len(l.sim.gpus), nvml.SUCCESS }

// DeviceGetHandleByIndex returns the handle of GPU i.
func (l *simLib) DeviceGetHandleByIndex(i int) (nvml.Device, nvml.Return) {
	if i < 0 || i >= len(l.sim.gpus) {
		return nil, nvml.ERROR_INVALID_ARGUMENT
	}
	return l.sim.gpus[i].handle, nvml.SUCCESS
}

// DeviceGetHandleByUUID returns the handle of the GPU with the given UUID.
func (l *simLib) DeviceGetHandleByUUID(id string) (nvml.Device, nvml.Return) {
	for _, g := range l.sim.gpus {
		if g.dev.UUID == id {
			return g.handle, nvml.SUCCESS
		}
	}
	return nil, nvml.ERROR_NOT_FOUND
}

// DeviceGetHandleByPciBusId returns the handle of the GPU at a PCI address.
func (l *simLib) DeviceGetHandleByPciBusId(bus string) (nvml.Device, nvml.Return) {
	for _, g := range l.sim.gpus {
		if strings.EqualFold(normalizeBusID(g.dev.PciBusID), normalizeBusID(bus)) {
			return g.handle, nvml.SUCCESS
		}
	}
	return nil, nvml.ERROR_NOT_FOUND
}

// EventSetCreate returns a new event set of the simulated host.
func (l *simLib) EventSetCreate() (nvml.EventSet, nvml.Return) {
	set := &simEventSet{sim: l.sim, ch: make(chan nvml.EventData, eventQueue),
		regs: make(map[*simGPU]uint64), done: make(chan struct{})}
	l.sim.mu.Lock()
	l.sim.sets[set] = struct{}{}
	l.sim.mu.Unlock()
	return set, nvml.SUCCESS
}

// EventSetWait waits on a set made by EventSetCreate.
func (l *simLib) EventSetWait(set nvml.EventSet, timeoutms uint32) (nvml.EventData, nvml.Return) {
	return set.Wait(timeoutms)
}

// EventSetFree frees a set made by EventSetCreate.
func (l *simLib) EventSetFree(set nvml.EventSet) nvml.Return { return set.Free() }

// simEventSet is an NVML event set of the simulated host.
type simEventSet struct {
	sim  *Sim
	ch   chan nvml.EventData
	regs map[*simGPU]uint64 // guarded by sim.mu
	done chan struct{}
	once sync.Once
}

var _ nvml.EventSet = (*simEventSet)(nil)

// Wait returns the next event, or ERROR_TIMEOUT after timeoutms.
func (e *simEventSet) Wait(timeoutms uint32) (nvml.EventData, nvml.Return) {
	select {
	case ev := <-e.ch:
		return ev, nvml.SUCCESS
	case <-e.done:
		return nvml.EventData{}, nvml.ERROR_UNINITIALIZED
	default:
	}
	t := time.NewTimer(time.Duration(timeoutms) * time.Millisecond)
	defer t.Stop()
	select {
	case ev := <-e.ch:
		return ev, nvml.SUCCESS
	case <-e.done:
		return nvml.EventData{}, nvml.ERROR_UNINITIALIZED
	case <-t.C:
		return nvml.EventData{}, nvml.ERROR_TIMEOUT
	}
}

// Free releases the set; a Wait in progress returns ERROR_UNINITIALIZED.
func (e *simEventSet) Free() nvml.Return {
	e.once.Do(func() {
		close(e.done)
		e.sim.mu.Lock()
		delete(e.sim.sets, e)
		e.sim.mu.Unlock()
	})
	return nvml.SUCCESS
}

// Wait_v3 is not offered by the simulated host.
func (e *simEventSet) Wait_v3(uint32) (nvml.EventSetWaitData_v3, nvml.Return) {
	return nvml.EventSetWaitData_v3{}, nvml.ERROR_NOT_SUPPORTED
}

// GetContextCount_v1 is not offered by the simulated host.
func (e *simEventSet) GetContextCount_v1() (nvml.GetContextCount_v1, nvml.Return) {
	return nvml.GetContextCount_v1{}, nvml.ERROR_NOT_SUPPORTED
}

// GetContextData_v1 is not offered by the simulated host.
func (e *simEventSet) GetContextData_v1(d nvml.GetContextData_v1) (nvml.GetContextData_v1, nvml.Return) {
	return d, nvml.ERROR_NOT_SUPPORTED
}

// GetContextInfo_v1 is not offered by the simulated host.
func (e *simEventSet) GetContextInfo_v1(uint32) (nvml.GetContextInfo_v1, nvml.Return) {
	return nvml.GetContextInfo_v1{}, nvml.ERROR_NOT_SUPPORTED
}

// GetGpuOperationalEventContextLegacyXid_v1 is not offered by the simulated host.
func (e *simEventSet) GetGpuOperationalEventContextLegacyXid_v1(uint32) (uint32, nvml.Return) {
	return 0, nvml.ERROR_NOT_SUPPORTED
}

// RegisterGpuOperationalEvents_v1 is not offered by the simulated host.
func (e *simEventSet) RegisterGpuOperationalEvents_v1(*nvml.GpuOperationalEventConfig_v1) nvml.Return {
	return nvml.ERROR_NOT_SUPPORTED
}

// simDevice is the handle of one simulated GPU.
type simDevice struct {
	*server.Device
	sim *Sim
	gpu *simGPU
}

// The methods below forward to the mock device's function fields.

func (d *simDevice) GetIndex() (int, nvml.Return)              { return d.Device.GetIndexFunc() }
func (d *simDevice) GetUUID() (string, nvml.Return)            { return d.Device.GetUUIDFunc() }
func (d *simDevice) GetName() (string, nvml.Return)            { return d.Device.GetNameFunc() }
func (d *simDevice) GetMemoryInfo() (nvml.Memory, nvml.Return) { return d.Device.GetMemoryInfoFunc() }
func (d *simDevice) GetPciInfo() (nvml.PciInfo, nvml.Return)   { return d.Device.GetPciInfoFunc() }
func (d *simDevice) GetPowerUsage() (uint32, nvml.Return)      { return d.Device.GetPowerUsageFunc() }
func (d *simDevice) GetEnforcedPowerLimit() (uint32, nvml.Return) {
	return d.Device.GetEnforcedPowerLimitFunc()
}
func (d *simDevice) GetPowerManagementLimit() (uint32, nvml.Return) {
	return d.Device.GetPowerManagementLimitFunc()
}
func (d *simDevice) GetNvLinkState(l int) (nvml.EnableState, nvml.Return) {
	return d.Device.GetNvLinkStateFunc(l)
}
func (d *simDevice) GetNvLinkRemotePciInfo(l int) (nvml.PciInfo, nvml.Return) {
	return d.Device.GetNvLinkRemotePciInfoFunc(l)
}
func (d *simDevice) GetUtilizationRates() (nvml.Utilization, nvml.Return) {
	return d.Device.GetUtilizationRatesFunc()
}
func (d *simDevice) GetTotalEnergyConsumption() (uint64, nvml.Return) {
	return d.Device.GetTotalEnergyConsumptionFunc()
}
func (d *simDevice) GetTemperature(t nvml.TemperatureSensors) (uint32, nvml.Return) {
	return d.Device.GetTemperatureFunc(t)
}
func (d *simDevice) GetClockInfo(c nvml.ClockType) (uint32, nvml.Return) {
	return d.Device.GetClockInfoFunc(c)
}
func (d *simDevice) GetCurrentClocksEventReasons() (uint64, nvml.Return) {
	return d.Device.GetCurrentClocksEventReasonsFunc()
}
func (d *simDevice) GetCurrentClocksThrottleReasons() (uint64, nvml.Return) {
	return d.Device.GetCurrentClocksThrottleReasonsFunc()
}
func (d *simDevice) GetTotalEccErrors(t nvml.MemoryErrorType, c nvml.EccCounterType) (uint64, nvml.Return) {
	return d.Device.GetTotalEccErrorsFunc(t, c)
}
func (d *simDevice) GetRetiredPages(c nvml.PageRetirementCause) ([]uint64, nvml.Return) {
	return d.Device.GetRetiredPagesFunc(c)
}
func (d *simDevice) GetRemappedRows() (int, int, bool, bool, nvml.Return) {
	return d.Device.GetRemappedRowsFunc()
}
func (d *simDevice) GetFieldValues(v []nvml.FieldValue) nvml.Return {
	return d.Device.GetFieldValuesFunc(v)
}
func (d *simDevice) GetPcieThroughput(c nvml.PcieUtilCounter) (uint32, nvml.Return) {
	return d.Device.GetPcieThroughputFunc(c)
}
func (d *simDevice) GetComputeRunningProcesses() ([]nvml.ProcessInfo, nvml.Return) {
	return d.Device.GetComputeRunningProcessesFunc()
}
func (d *simDevice) GetSupportedEventTypes() (uint64, nvml.Return) {
	return d.Device.GetSupportedEventTypesFunc()
}
func (d *simDevice) RegisterEvents(types uint64, set nvml.EventSet) nvml.Return {
	return d.Device.RegisterEventsFunc(types, set)
}

// simEvents are the NVML event types the simulated GPUs support.
const simEvents = nvml.EventTypeXidCriticalError | nvml.EventTypeSingleBitEccError |
	nvml.EventTypeDoubleBitEccError | nvml.EventTypePState | nvml.EventTypeClock

// setDeviceFuncs installs the simulation in the mock device's function
// fields. Every call takes the host lock, brings the model up to the clock
// and answers ERROR_GPU_IS_LOST for a GPU off the bus.
func (s *Sim) setDeviceFuncs(g *simGPU) {
	d := g.dev
	pr := s.prof
	lost := nvml.ERROR_GPU_IS_LOST
	// read runs f under the host lock on an up-to-date model.
	read := func(f func()) nvml.Return {
		s.mu.Lock()
		defer s.mu.Unlock()
		if g.lost {
			return lost
		}
		s.stepLocked()
		f()
		return nvml.SUCCESS
	}

	uuidF, nameF, indexF := d.GetUUIDFunc, d.GetNameFunc, d.GetIndexFunc
	d.GetUUIDFunc = func() (id string, ret nvml.Return) {
		ret = read(func() { id, _ = uuidF() })
		return
	}
	d.GetNameFunc = func() (n string, ret nvml.Return) {
		ret = read(func() { n, _ = nameF() })
		return
	}
	d.GetIndexFunc = func() (i int, ret nvml.Return) {
		ret = read(func() { i, _ = indexF() })
		return
	}
	d.GetMemoryInfoFunc = func() (m nvml.Memory, ret nvml.Return) {
		ret = read(func() {
			m = nvml.Memory{Total: d.MemoryInfo.Total, Used: g.memUsed, Free: d.MemoryInfo.Total - g.memUsed}
		})
		return
	}
	d.GetPciInfoFunc = func() (p nvml.PciInfo, ret nvml.Return) {
		ret = read(func() { p = pciInfo(d.PciBusID, d.Config.PciDeviceId) })
		return
	}
	d.GetPowerManagementLimitFunc = func() (mw uint32, ret nvml.Return) {
		ret = read(func() { mw = uint32(pr.tdpW * 1000) })
		return
	}
	d.GetEnforcedPowerLimitFunc = d.GetPowerManagementLimitFunc
	d.GetNvLinkStateFunc = func(link int) (st nvml.EnableState, ret nvml.Return) {
		if link < 0 || link >= pr.links {
			return nvml.FEATURE_DISABLED, nvml.ERROR_INVALID_ARGUMENT
		}
		ret = read(func() { st = nvml.FEATURE_ENABLED })
		return
	}
	d.GetNvLinkRemotePciInfoFunc = func(link int) (p nvml.PciInfo, ret nvml.Return) {
		if link < 0 || link >= pr.links {
			return p, nvml.ERROR_INVALID_ARGUMENT
		}
		// Links spread evenly over the NVSwitches.
		sw := pr.switches[link*len(pr.switches)/pr.links]
		ret = read(func() { p = pciInfo("00000000:"+sw+":00.0", 0x22a310de) })
		return
	}
	d.GetUtilizationRatesFunc = func() (u nvml.Utilization, ret nvml.Return) {
		ret = read(func() { u = nvml.Utilization{Gpu: uint32(g.util + 0.5), Memory: uint32(g.memUtil + 0.5)} })
		return
	}
	d.GetPowerUsageFunc = func() (mw uint32, ret nvml.Return) {
		ret = read(func() { mw = uint32(g.powerW * 1000) })
		return
	}
	d.GetTotalEnergyConsumptionFunc = func() (mj uint64, ret nvml.Return) {
		ret = read(func() { mj = uint64(g.energyJ * 1000) })
		return
	}
	d.GetTemperatureFunc = func(sensor nvml.TemperatureSensors) (c uint32, ret nvml.Return) {
		if sensor != nvml.TEMPERATURE_GPU {
			return 0, nvml.ERROR_INVALID_ARGUMENT
		}
		ret = read(func() { c = uint32(g.tempC + 0.5) })
		return
	}
	d.GetClockInfoFunc = func(ct nvml.ClockType) (mhz uint32, ret nvml.Return) {
		switch ct {
		case nvml.CLOCK_GRAPHICS, nvml.CLOCK_SM:
			ret = read(func() { mhz = g.smMHz })
		case nvml.CLOCK_MEM:
			ret = read(func() { mhz = pr.memMHz })
		case nvml.CLOCK_VIDEO:
			ret = read(func() { mhz = g.smMHz * 9 / 10 })
		default:
			ret = nvml.ERROR_INVALID_ARGUMENT
		}
		return
	}
	d.GetCurrentClocksEventReasonsFunc = func() (r uint64, ret nvml.Return) {
		ret = read(func() { r = g.reasons })
		return
	}
	d.GetCurrentClocksThrottleReasonsFunc = d.GetCurrentClocksEventReasonsFunc
	d.GetTotalEccErrorsFunc = func(t nvml.MemoryErrorType, c nvml.EccCounterType) (n uint64, ret nvml.Return) {
		if t >= nvml.MEMORY_ERROR_TYPE_COUNT || c >= nvml.ECC_COUNTER_TYPE_COUNT {
			return 0, nvml.ERROR_INVALID_ARGUMENT
		}
		ret = read(func() { n = g.ecc[t][c] })
		return
	}
	// Ampere and Hopper replace page retirement with row remapping: NVML
	// answers NOT_SUPPORTED, as it does on the real GPUs.
	d.GetRetiredPagesFunc = func(nvml.PageRetirementCause) ([]uint64, nvml.Return) {
		if ret := read(func() {}); ret != nvml.SUCCESS {
			return nil, ret
		}
		return nil, nvml.ERROR_NOT_SUPPORTED
	}
	d.GetRemappedRowsFunc = func() (corr, unc int, pending, failed bool, ret nvml.Return) {
		ret = read(func() { corr, unc, pending, failed = g.remapCorr, g.remapUnc, g.remapPending, g.remapFailure })
		return
	}
	d.GetFieldValuesFunc = func(vals []nvml.FieldValue) nvml.Return {
		if len(vals) == 0 {
			return nvml.ERROR_INVALID_ARGUMENT
		}
		return read(func() {
			ts := s.last.UnixMicro()
			for i := range vals {
				s.fieldLocked(g, &vals[i], ts)
			}
		})
	}
	d.GetPcieThroughputFunc = func(c nvml.PcieUtilCounter) (kbs uint32, ret nvml.Return) {
		switch c {
		case nvml.PCIE_UTIL_TX_BYTES:
			ret = read(func() { kbs = g.pcieTxKBs })
		case nvml.PCIE_UTIL_RX_BYTES:
			ret = read(func() { kbs = g.pcieRxKBs })
		default:
			ret = nvml.ERROR_INVALID_ARGUMENT
		}
		return
	}
	d.GetComputeRunningProcessesFunc = func() (ps []nvml.ProcessInfo, ret nvml.Return) {
		ret = read(func() {
			if len(g.procs) > 0 {
				ps = append([]nvml.ProcessInfo(nil), g.procs...)
			}
		})
		return
	}
	d.GetSupportedEventTypesFunc = func() (t uint64, ret nvml.Return) {
		ret = read(func() { t = simEvents })
		return
	}
	d.RegisterEventsFunc = func(types uint64, set nvml.EventSet) nvml.Return {
		es, ok := set.(*simEventSet)
		if !ok || es.sim != s {
			return nvml.ERROR_INVALID_ARGUMENT
		}
		if types&^simEvents != 0 {
			return nvml.ERROR_NOT_SUPPORTED
		}
		return read(func() { es.regs[g] |= types })
	}
}

// fieldLocked answers one field of a GetFieldValues call.
func (s *Sim) fieldLocked(g *simGPU, v *nvml.FieldValue, ts int64) {
	v.Timestamp = ts
	v.LatencyUsec = 0
	var n uint64
	switch v.FieldId {
	case nvml.FI_DEV_NVLINK_THROUGHPUT_DATA_TX, nvml.FI_DEV_NVLINK_THROUGHPUT_DATA_RX:
		total := g.nvlTx
		if v.FieldId == nvml.FI_DEV_NVLINK_THROUGHPUT_DATA_RX {
			total = g.nvlRx
		}
		kib := total / 1024
		switch link := v.ScopeId; {
		case link == allLinks:
			n = kib
		case int(link) < s.prof.links:
			// Traffic spreads over the links; each link's counter is its
			// share, and stays monotonic as the total grows.
			l := uint64(s.prof.links)
			n = kib / l
			if uint64(link) < kib%l {
				n++
			}
		default:
			v.NvmlReturn = uint32(nvml.ERROR_INVALID_ARGUMENT)
			return
		}
	case nvml.FI_DEV_PCIE_COUNT_TX_BYTES, nvml.FI_DEV_PCIE_COUNT_RX_BYTES:
		if !s.prof.pcieBytes {
			v.NvmlReturn = uint32(nvml.ERROR_NOT_SUPPORTED)
			return
		}
		n = g.pcieTx
		if v.FieldId == nvml.FI_DEV_PCIE_COUNT_RX_BYTES {
			n = g.pcieRx
		}
	default:
		v.NvmlReturn = uint32(nvml.ERROR_NOT_SUPPORTED)
		return
	}
	v.NvmlReturn = uint32(nvml.SUCCESS)
	v.ValueType = uint32(nvml.VALUE_TYPE_UNSIGNED_LONG_LONG)
	putU64(v.Value[:], n)
}

// pciInfo builds the PciInfo NVML gives for an address like
// "00000000:1B:00.0".
func pciInfo(busID string, deviceID uint32) nvml.PciInfo {
	p := nvml.PciInfo{PciDeviceId: deviceID, PciSubSystemId: 0x16c110de}
	for i := 0; i < len(busID) && i < len(p.BusId)-1; i++ {
		p.BusId[i] = int8(busID[i])
	}
	legacy := busID
	if len(legacy) > 12 {
		legacy = legacy[4:] // "0000:1B:00.0"
	}
	for i := 0; i < len(legacy) && i < len(p.BusIdLegacy)-1; i++ {
		p.BusIdLegacy[i] = int8(legacy[i])
	}
	if a, err := parseBusID(busID); err == nil {
		p.Domain, p.Bus, p.Device = a.domain, a.bus, a.device
	}
	return p
}
