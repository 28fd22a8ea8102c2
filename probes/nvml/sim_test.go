package nvml

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"math"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/NVIDIA/go-nvml/pkg/nvml"

	"github.com/gpuctl/gpuctl/api"
	"github.com/gpuctl/gpuctl/procfs"
)

// fakeClock is a model clock tests move by hand.
type fakeClock struct {
	mu sync.Mutex
	t  time.Time
}

func newFakeClock() *fakeClock {
	return &fakeClock{t: time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)}
}

func (c *fakeClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.t
}

func (c *fakeClock) Advance(d time.Duration) time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.t = c.t.Add(d)
	return c.t
}

func testLogger(t *testing.T) *slog.Logger {
	return slog.New(slog.NewTextHandler(t.Output(), &slog.HandlerOptions{Level: slog.LevelWarn}))
}

// newTestSim builds a simulated host on a fake clock and a sampler over it.
func newTestSim(t *testing.T, profile string, opts SimOptions) (*Sim, *Sampler, *fakeClock) {
	t.Helper()
	clk := newFakeClock()
	if opts.Now == nil {
		opts.Now = clk.Now
	}
	opts.Logger = testLogger(t)
	sim, err := NewSim(profile, opts)
	if err != nil {
		t.Fatalf("NewSim(%s): %v", profile, err)
	}
	return sim, NewSampler(sim.NVML(), testLogger(t), WithClock(clk.Now)), clk
}

// step advances the clock by one second and samples.
func step(t *testing.T, s *Sampler, clk *fakeClock) []*api.GPUSample {
	t.Helper()
	got, err := s.Sample(clk.Advance(time.Second))
	if err != nil {
		t.Fatalf("Sample: %v", err)
	}
	return got
}

// collector gathers a sampler's events.
type collector struct {
	mu  sync.Mutex
	evs []*api.Event
}

func collect(t *testing.T, s *Sampler) *collector {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	ch := s.Events(ctx)
	c := &collector{}
	done := make(chan struct{})
	go func() {
		defer close(done)
		for ev := range ch {
			c.mu.Lock()
			c.evs = append(c.evs, ev)
			c.mu.Unlock()
		}
	}()
	t.Cleanup(func() {
		cancel()
		<-done
	})
	return c
}

func (c *collector) matching(pred func(*api.Event) bool) []*api.Event {
	c.mu.Lock()
	defer c.mu.Unlock()
	var out []*api.Event
	for _, ev := range c.evs {
		if pred(ev) {
			out = append(out, ev)
		}
	}
	return out
}

// waitFor polls until an event matching pred arrives.
func (c *collector) waitFor(t *testing.T, what string, pred func(*api.Event) bool) *api.Event {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	tick := time.NewTicker(5 * time.Millisecond)
	defer tick.Stop()
	for {
		if m := c.matching(pred); len(m) > 0 {
			return m[0]
		}
		if time.Now().After(deadline) {
			c.mu.Lock()
			defer c.mu.Unlock()
			t.Fatalf("no %s event; got %v", what, c.evs)
		}
		<-tick.C
	}
}

func TestSimProfiles(t *testing.T) {
	tests := []struct {
		profile string
		model   string
		memMiB  uint64
		links   int
		limitMW uint32
	}{
		{"dgx-a100", "NVIDIA A100-SXM4-40GB", 40960, 12, 400_000},
		{"dgx-h100", "NVIDIA H100 80GB HBM3", 81920, 18, 700_000},
		{"dgx-h200", "NVIDIA H200", 144384, 18, 700_000},
	}
	for _, tc := range tests {
		t.Run(tc.profile, func(t *testing.T) {
			sim, s, clk := newTestSim(t, tc.profile, SimOptions{})
			gpus, driver, cuda, err := s.Inventory()
			if err != nil {
				t.Fatalf("Inventory: %v", err)
			}
			if driver != "550.54.15" || cuda != "12.4" {
				t.Errorf("driver %q, CUDA %q", driver, cuda)
			}
			if len(gpus) != 8 || sim.GPUCount() != 8 {
				t.Fatalf("%d GPUs in inventory, sim says %d; want 8", len(gpus), sim.GPUCount())
			}
			buses := map[string]bool{}
			for i, g := range gpus {
				if g.Index != uint32(i) || g.Model != tc.model || g.MemTotalBytes != tc.memMiB<<20 || g.PowerLimitMw != tc.limitMW {
					t.Errorf("GPU %d: %+v", i, g)
				}
				if !strings.HasPrefix(g.Uuid, "GPU-") {
					t.Errorf("GPU %d UUID %q", i, g.Uuid)
				}
				if _, err := parseBusID(g.PciBusId); err != nil || g.PciBusId != strings.ToLower(g.PciBusId) || buses[g.PciBusId] {
					t.Errorf("GPU %d PCI bus id %q (err %v, duplicate %v)", i, g.PciBusId, err, buses[g.PciBusId])
				}
				buses[g.PciBusId] = true
				if len(g.NvlinkPeers) != tc.links {
					t.Errorf("GPU %d has %d NVLink peers, want %d", i, len(g.NvlinkPeers), tc.links)
				}
				for _, p := range g.NvlinkPeers {
					if _, err := parseBusID(p.RemotePciBusId); err != nil {
						t.Errorf("GPU %d link %d peer %q: %v", i, p.Link, p.RemotePciBusId, err)
					}
				}
			}
			samples := step(t, s, clk)
			if len(samples) != 8 {
				t.Fatalf("%d samples, want 8", len(samples))
			}
			pr := profiles[tc.profile]
			for i, g := range samples {
				if g.Lost || g.Uuid != gpus[i].Uuid || g.MemTotalBytes != tc.memMiB<<20 || g.TimeUnixNano != clk.Now().UnixNano() {
					t.Errorf("GPU %d sample: %v", i, g)
				}
				if g.UtilGpuPercent != 0 || g.PowerMw != uint32(pr.idleW*1000) || g.SmClockMhz != pr.idleSM || g.MemClockMhz != pr.memMHz {
					t.Errorf("GPU %d is not idle: %v", i, g)
				}
				if !slices.Contains(g.ThrottleNames, "gpu_idle") || g.TempC < 30 || g.TempC > 40 || g.Ecc == nil {
					t.Errorf("GPU %d idle state: %v", i, g)
				}
			}
		})
	}
}

func TestNewSimUnknownProfile(t *testing.T) {
	_, err := NewSim("dgx-z9", SimOptions{})
	if err == nil || !strings.Contains(err.Error(), "dgx-a100, dgx-h100, dgx-h200") || !strings.Contains(err.Error(), "dgx-z9") {
		t.Fatalf("unknown profile: err %v, want one naming it and listing the valid ones", err)
	}
}

func TestSimUUIDsFollowNode(t *testing.T) {
	uuids := func(node string) []string {
		sim, err := NewSim("dgx-h100", SimOptions{Node: node})
		if err != nil {
			t.Fatal(err)
		}
		var out []string
		for i := range sim.GPUCount() {
			h, _ := sim.NVML().DeviceGetHandleByIndex(i)
			id, ret := h.GetUUID()
			if ret != nvml.SUCCESS {
				t.Fatalf("GetUUID: %v", ret)
			}
			out = append(out, id)
		}
		return out
	}
	a, b, c := uuids("node-a"), uuids("node-a"), uuids("node-b")
	if !slices.Equal(a, b) {
		t.Errorf("same node, different UUIDs: %v %v", a, b)
	}
	if slices.Equal(a, c) || len(slices.Compact(slices.Sorted(slices.Values(a)))) != 8 {
		t.Errorf("UUIDs not distinct: %v %v", a, c)
	}
	sim, _ := NewSim("dgx-h100", SimOptions{Node: "node-a"})
	if h, ret := sim.NVML().DeviceGetHandleByUUID(a[3]); ret != nvml.SUCCESS || h != sim.gpus[3].handle {
		t.Errorf("DeviceGetHandleByUUID: %v", ret)
	}
	if h, ret := sim.NVML().DeviceGetHandleByPciBusId("0000:52:00.0"); ret != nvml.SUCCESS || h != sim.gpus[2].handle {
		t.Errorf("DeviceGetHandleByPciBusId: %v", ret)
	}
}

// startBurner starts a real process that burns one CPU.
func startBurner(t *testing.T) uint32 {
	t.Helper()
	cmd := exec.Command("/bin/sh", "-c", "while :; do :; done")
	if err := cmd.Start(); err != nil {
		t.Fatalf("start CPU burner: %v", err)
	}
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
	})
	return uint32(cmd.Process.Pid)
}

// A process using the CPU on GPU 0 makes GPU 0 busy, hot and power-hungry,
// while GPU 1 idles.
func TestBusyProcessLoadsItsGPU(t *testing.T) {
	sim, s, clk := newTestSim(t, "dgx-h100", SimOptions{})
	pid := startBurner(t)
	if err := sim.SetProcesses(0, []uint32{pid}); err != nil {
		t.Fatal(err)
	}
	first := step(t, s, clk)
	idle := first[0]
	deadline := time.Now().Add(30 * time.Second)
	tick := time.NewTicker(20 * time.Millisecond)
	defer tick.Stop()
	var got []*api.GPUSample
	for {
		<-tick.C
		got = step(t, s, clk)
		g := got[0]
		if g.UtilGpuPercent >= 30 && g.PowerMw >= idle.PowerMw+100_000 && g.TempC >= idle.TempC+5 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("GPU 0 never got busy: first %v, last %v", idle, g)
		}
	}
	g0, g1 := got[0], got[1]
	if slices.Contains(g0.ThrottleNames, "gpu_idle") || g0.SmClockMhz != profiles["dgx-h100"].maxSM {
		t.Errorf("busy GPU 0 still idles: %v", g0)
	}
	if len(g0.Processes) != 1 || g0.Processes[0].Pid != pid || g0.Processes[0].Name != "sh" || g0.Processes[0].UsedMemBytes < contextBytes {
		t.Errorf("GPU 0 processes: %v", g0.Processes)
	}
	if g0.MemUsedBytes != g0.Processes[0].UsedMemBytes {
		t.Errorf("GPU 0 memory used %d, process uses %d", g0.MemUsedBytes, g0.Processes[0].UsedMemBytes)
	}
	if g1.UtilGpuPercent != 0 || g1.PowerMw != first[1].PowerMw || g1.TempC > first[1].TempC || len(g1.Processes) != 0 ||
		g1.MemUsedBytes != 0 || !slices.Contains(g1.ThrottleNames, "gpu_idle") {
		t.Errorf("GPU 1 did not stay idle: %v", g1)
	}
	if g0.EnergyMj <= g1.EnergyMj {
		t.Errorf("busy GPU 0 used %d mJ, idle GPU 1 %d mJ", g0.EnergyMj, g1.EnergyMj)
	}
}

// fakeProc is a /proc with processes whose counters a test sets.
type fakeProc struct {
	t    *testing.T
	root string
}

func (f fakeProc) set(pid int, cpuTicks, rssPages uint64, rchar, wchar, readB, writeB uint64) {
	f.t.Helper()
	dir := filepath.Join(f.root, fmt.Sprint(pid))
	if err := os.MkdirAll(dir, 0o755); err != nil {
		f.t.Fatal(err)
	}
	stat := statLine(pid, "rank", 'R', cpuTicks, 0, 1000+uint64(pid), int64(rssPages))
	io := fmt.Sprintf("rchar: %d\nwchar: %d\nread_bytes: %d\nwrite_bytes: %d\n", rchar, wchar, readB, writeB)
	for name, body := range map[string]string{"stat": stat, "io": io, "comm": "rank\n"} {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(body), 0o644); err != nil {
			f.t.Fatal(err)
		}
	}
}

func (f fakeProc) exit(pid int) {
	if err := os.RemoveAll(filepath.Join(f.root, fmt.Sprint(pid))); err != nil {
		f.t.Fatal(err)
	}
}

// With a fake /proc on the model clock the model is exact: a process using
// one full CPU on two GPUs loads each half-way, its I/O becomes link
// traffic, and its exit idles the GPUs.
func TestModelFromFakeProc(t *testing.T) {
	for _, profile := range []string{"dgx-h100", "dgx-a100"} {
		t.Run(profile, func(t *testing.T) {
			fp := fakeProc{t: t, root: t.TempDir()}
			clk := newFakeClock()
			sim, err := NewSim(profile, SimOptions{Now: clk.Now, CPUNow: clk.Now, ProcRoot: fp.root, Logger: testLogger(t)})
			if err != nil {
				t.Fatal(err)
			}
			s := NewSampler(sim.NVML(), testLogger(t), WithClock(clk.Now), WithProcRoot(fp.root))
			pr := profiles[profile]
			const pid = 4242
			rss := uint64(1000)
			fp.set(pid, 0, rss, 0, 0, 0, 0)
			for _, gpu := range []int{3, 4} {
				if err := sim.SetProcesses(gpu, []uint32{pid}); err != nil {
					t.Fatal(err)
				}
			}
			step(t, s, clk)
			var got []*api.GPUSample
			for i := 1; i <= 30; i++ {
				// One CPU second per second; 20 MiB through sockets and
				// 2 MiB to storage per second.
				fp.set(pid, uint64(i)*procfs.ClockTicks, rss, 0, uint64(i)*20<<20, 0, uint64(i)*2<<20)
				got = step(t, s, clk)
			}
			wantPower := pr.idleW + (loadPower*pr.tdpW-pr.idleW)*0.5
			for _, gpu := range []int{3, 4} {
				g := got[gpu]
				if g.UtilGpuPercent != 50 || g.UtilMemPercent != 30 {
					t.Errorf("GPU %d util %d/%d %%, want 50/30", gpu, g.UtilGpuPercent, g.UtilMemPercent)
				}
				if g.PowerMw != uint32(wantPower*1000) {
					t.Errorf("GPU %d power %d mW, want %d", gpu, g.PowerMw, uint32(wantPower*1000))
				}
				if g.NvlinkTxBytesPerSec != 10<<20 || g.NvlinkRxBytesPerSec != 0 {
					t.Errorf("GPU %d NVLink tx %d rx %d B/s, want %d and 0", gpu, g.NvlinkTxBytesPerSec, g.NvlinkRxBytesPerSec, 10<<20)
				}
				if g.PcieTxBytesPerSec != 1<<20 {
					t.Errorf("GPU %d PCIe tx %d B/s, want %d", gpu, g.PcieTxBytesPerSec, 1<<20)
				}
				wantMem := uint64(contextBytes + rssFactor*rss*uint64(os.Getpagesize()))
				if g.MemUsedBytes != wantMem || len(g.Processes) != 1 || g.Processes[0].Name != "rank" {
					t.Errorf("GPU %d memory %d (want %d), processes %v", gpu, g.MemUsedBytes, wantMem, g.Processes)
				}
				// 30 s at a 12 s time constant: within 10 % of the target.
				target := ambientC + wantPower/pr.tdpW*(pr.loadC-ambientC)
				if d := float64(g.TempC) - target; d < -(target-idleTemp(pr))*0.1-1 || d > 1 {
					t.Errorf("GPU %d at %d °C, target %.1f", gpu, g.TempC, target)
				}
			}
			// Per-link NVLink counters add up to the all-links one.
			h, _ := sim.NVML().DeviceGetHandleByIndex(3)
			vals := []nvml.FieldValue{{FieldId: nvml.FI_DEV_NVLINK_THROUGHPUT_DATA_TX, ScopeId: allLinks}}
			for l := range pr.links {
				vals = append(vals, nvml.FieldValue{FieldId: nvml.FI_DEV_NVLINK_THROUGHPUT_DATA_TX, ScopeId: uint32(l)})
			}
			if ret := h.GetFieldValues(vals); ret != nvml.SUCCESS {
				t.Fatalf("GetFieldValues: %v", ret)
			}
			var sum uint64
			for _, v := range vals[1:] {
				n, ok := fieldUint(&v)
				if !ok {
					t.Fatalf("link field %d not answered", v.ScopeId)
				}
				sum += n
			}
			if all, _ := fieldUint(&vals[0]); all != sum || all != 30*10<<10 {
				t.Errorf("NVLink TX KiB: all links %d, per-link sum %d, want %d", all, sum, 30*10<<10)
			}
			if e3, e0 := got[3].EnergyMj, got[0].EnergyMj; e3 <= e0 {
				t.Errorf("loaded GPU energy %d mJ not above idle %d mJ", e3, e0)
			}
			// 31 idle seconds on GPU 0.
			if want := uint64(pr.idleW * 31 * 1000); got[0].EnergyMj != want {
				t.Errorf("idle GPU energy %d mJ, want %d", got[0].EnergyMj, want)
			}

			fp.exit(pid)
			got = step(t, s, clk)
			got = step(t, s, clk)
			for _, gpu := range []int{3, 4} {
				g := got[gpu]
				if g.UtilGpuPercent != 0 || len(g.Processes) != 0 || g.MemUsedBytes != 0 || g.PowerMw != uint32(pr.idleW*1000) {
					t.Errorf("GPU %d after its process exited: %v", gpu, g)
				}
			}
		})
	}
}

func faultCases() []struct {
	kind     api.FaultKind
	check    func(*api.GPUSample) bool
	events   []func(*api.Event) bool
	noXID    bool
	recovers func(*api.GPUSample) bool
} {
	isKind := func(k api.EventKind, sev api.Severity, class api.XIDClass) func(*api.Event) bool {
		return func(e *api.Event) bool {
			return e.GpuIndex == 1 && e.Kind == k && e.Severity == sev && e.XidClass == class
		}
	}
	xid := func(code uint32, class api.XIDClass) func(*api.Event) bool {
		return func(e *api.Event) bool {
			return e.GpuIndex == 1 && e.Kind == api.EventKind_EVENT_KIND_XID && e.Xid == code && e.XidClass == class &&
				e.Severity == api.Severity_SEVERITY_CRITICAL && e.Count == 1 && e.GpuUuid != ""
		}
	}
	lostEv := isKind(api.EventKind_EVENT_KIND_GPU_LOST, api.Severity_SEVERITY_CRITICAL, api.XIDClass_XID_CLASS_REBOOT_NODE)
	eccEv := func(e *api.Event) bool {
		return isKind(api.EventKind_EVENT_KIND_ECC, api.Severity_SEVERITY_CRITICAL, api.XIDClass_XID_CLASS_RESET_GPU)(e) && e.Count == 1
	}
	isLostSample := func(g *api.GPUSample) bool { return g.Lost && g.Uuid != "" && g.PowerMw == 0 }
	eccSample := func(g *api.GPUSample) bool {
		return g.Ecc.GetVolatileUncorrected() == 1 && g.Ecc.GetAggregateUncorrected() == 1 && g.RemappedRowsUncorrectable == 1 && g.RemapPending
	}
	eccCleared := func(g *api.GPUSample) bool {
		// A reset restarts the volatile count and applies the remap.
		return !g.Lost && g.Ecc.GetVolatileUncorrected() == 0 && g.Ecc.GetAggregateUncorrected() == 1 && !g.RemapPending
	}
	answers := func(g *api.GPUSample) bool { return !g.Lost && g.PowerMw > 0 }
	return []struct {
		kind     api.FaultKind
		check    func(*api.GPUSample) bool
		events   []func(*api.Event) bool
		noXID    bool
		recovers func(*api.GPUSample) bool
	}{
		{kind: api.FaultKind_FAULT_KIND_XID79, check: isLostSample,
			events: []func(*api.Event) bool{xid(79, api.XIDClass_XID_CLASS_REBOOT_NODE), lostEv}, recovers: answers},
		{kind: api.FaultKind_FAULT_KIND_GPU_LOST, check: isLostSample, events: []func(*api.Event) bool{lostEv},
			noXID: true, recovers: answers},
		{kind: api.FaultKind_FAULT_KIND_XID48, check: eccSample,
			events: []func(*api.Event) bool{xid(48, api.XIDClass_XID_CLASS_RESET_GPU), eccEv}, recovers: eccCleared},
		{kind: api.FaultKind_FAULT_KIND_ECC_UNCORRECTABLE, check: eccSample, events: []func(*api.Event) bool{eccEv},
			noXID: true, recovers: eccCleared},
		{kind: api.FaultKind_FAULT_KIND_THERMAL, check: func(g *api.GPUSample) bool {
			// GPU 1 is busy, so its clock was at boost before the fault.
			return g.TempC >= 90 && slices.Contains(g.ThrottleNames, "hw_thermal_slowdown") &&
				g.SmClockMhz <= profiles["dgx-h100"].maxSM/2
		}, events: []func(*api.Event) bool{func(e *api.Event) bool {
			return isKind(api.EventKind_EVENT_KIND_THROTTLE, api.Severity_SEVERITY_WARNING, api.XIDClass_XID_CLASS_NONE)(e) &&
				strings.Contains(e.Attrs["reasons"], "hw_thermal_slowdown")
		}}, noXID: true, recovers: func(g *api.GPUSample) bool {
			return g.ThrottleReasons&throttleSlowdown == 0 && g.TempC < 80 && g.SmClockMhz == profiles["dgx-h100"].maxSM
		}},
	}
}

// Every injected fault shows in the samples and as events of the right
// class, touches only its GPU, and CLEAR restores the GPU.
func TestInjectedFaults(t *testing.T) {
	for _, tc := range faultCases() {
		t.Run(tc.kind.String(), func(t *testing.T) {
			// GPU 1 runs a process that keeps it fully busy.
			fp := fakeProc{t: t, root: t.TempDir()}
			clk := newFakeClock()
			sim, s, _ := newTestSim(t, "dgx-h100", SimOptions{Now: clk.Now, CPUNow: clk.Now, ProcRoot: fp.root})
			s.procRoot = fp.root
			const pid = 77
			ticks := uint64(0)
			fp.set(pid, ticks, 100, 0, 0, 0, 0)
			if err := sim.SetProcesses(1, []uint32{pid}); err != nil {
				t.Fatal(err)
			}
			step := func(t *testing.T, s *Sampler, clk *fakeClock) []*api.GPUSample {
				t.Helper()
				ticks += procfs.ClockTicks
				fp.set(pid, ticks, 100, 0, 0, 0, 0)
				return step(t, s, clk)
			}
			step(t, s, clk)
			before := step(t, s, clk)
			if before[1].SmClockMhz != profiles["dgx-h100"].maxSM || before[1].UtilGpuPercent != 100 {
				t.Fatalf("GPU 1 not busy before the fault: %v", before[1])
			}
			c := collect(t, s)
			if err := sim.Inject(1, tc.kind); err != nil {
				t.Fatalf("Inject: %v", err)
			}
			var got []*api.GPUSample
			for i := 0; ; i++ {
				got = step(t, s, clk)
				if tc.check(got[1]) {
					break
				}
				if i == 30 {
					t.Fatalf("fault never showed in GPU 1's samples; last %v", got[1])
				}
			}
			for i, g := range got {
				if i != 1 && (g.Lost || g.ThrottleReasons != before[i].ThrottleReasons || g.Ecc.GetVolatileUncorrected() != 0) {
					t.Errorf("fault on GPU 1 touched GPU %d: %v", i, g)
				}
			}
			for i, pred := range tc.events {
				c.waitFor(t, fmt.Sprintf("%s #%d", tc.kind, i), pred)
			}

			// A marker event on another GPU, queued after everything the
			// samples so far produced, shows all of it has been delivered.
			if err := sim.Inject(7, api.FaultKind_FAULT_KIND_GPU_LOST); err != nil {
				t.Fatal(err)
			}
			step(t, s, clk)
			c.waitFor(t, "marker", func(e *api.Event) bool { return e.GpuIndex == 7 && e.Kind == api.EventKind_EVENT_KIND_GPU_LOST })
			if n := len(c.matching(func(e *api.Event) bool { return e.GpuIndex == 1 && e.Kind == api.EventKind_EVENT_KIND_XID })); tc.noXID && n != 0 {
				t.Errorf("%d Xid events for a fault without an Xid", n)
			}
			for i, pred := range tc.events {
				if n := len(c.matching(pred)); n != 1 {
					t.Errorf("event #%d of %s reported %d times, want once", i, tc.kind, n)
				}
			}

			if err := sim.Inject(1, api.FaultKind_FAULT_KIND_CLEAR); err != nil {
				t.Fatal(err)
			}
			for i := 0; ; i++ {
				got = step(t, s, clk)
				if tc.recovers(got[1]) {
					break
				}
				if i == 60 {
					t.Fatalf("GPU 1 did not recover after CLEAR; last %v", got[1])
				}
			}
			if tc.kind == api.FaultKind_FAULT_KIND_XID79 || tc.kind == api.FaultKind_FAULT_KIND_GPU_LOST {
				c.waitFor(t, "recovered", func(e *api.Event) bool {
					return e.GpuIndex == 1 && e.Kind == api.EventKind_EVENT_KIND_GPU_LOST && e.Attrs["state"] == "recovered"
				})
			}
			if tc.kind == api.FaultKind_FAULT_KIND_THERMAL {
				c.waitFor(t, "throttle ended", func(e *api.Event) bool {
					return e.GpuIndex == 1 && e.Kind == api.EventKind_EVENT_KIND_THROTTLE && e.Attrs["state"] == "ended"
				})
			}
		})
	}
}

func TestXIDCountsAccumulate(t *testing.T) {
	sim, s, clk := newTestSim(t, "dgx-a100", SimOptions{})
	c := collect(t, s)
	step(t, s, clk)
	for range 3 {
		if err := sim.Inject(5, api.FaultKind_FAULT_KIND_XID48); err != nil {
			t.Fatal(err)
		}
	}
	c.waitFor(t, "third Xid 48", func(e *api.Event) bool { return e.Xid == 48 && e.Count == 3 && e.GpuIndex == 5 })
	got := step(t, s, clk)
	if got[5].Ecc.GetVolatileUncorrected() != 3 {
		t.Errorf("volatile uncorrectable %d, want 3", got[5].Ecc.GetVolatileUncorrected())
	}
}

func TestInjectRejectsBadInput(t *testing.T) {
	sim, err := NewSim("dgx-h100", SimOptions{})
	if err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		gpu  int
		kind api.FaultKind
		want string
	}{
		{8, api.FaultKind_FAULT_KIND_XID79, "GPUs 0-7"},
		{-1, api.FaultKind_FAULT_KIND_CLEAR, "GPUs 0-7"},
		{0, api.FaultKind_FAULT_KIND_UNSPECIFIED, "XID79, XID48"},
		{0, api.FaultKind(99), "XID79, XID48"},
	}
	for _, tc := range tests {
		if err := sim.Inject(tc.gpu, tc.kind); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("Inject(%d, %s): err %v, want one mentioning %q", tc.gpu, tc.kind, err, tc.want)
		}
	}
	if err := sim.SetProcesses(9, nil); err == nil || !strings.Contains(err.Error(), "GPUs 0-7") {
		t.Errorf("SetProcesses on GPU 9: err %v", err)
	}
}

// Values a GPU does not offer, or fails to give, are zero; the rest of the
// sample is still filled and nothing fails.
func TestUnsupportedValuesLeaveZero(t *testing.T) {
	sim, s, clk := newTestSim(t, "dgx-h100", SimOptions{})
	d := sim.gpus[0].dev
	ns := nvml.ERROR_NOT_SUPPORTED
	d.GetPowerUsageFunc = func() (uint32, nvml.Return) { return 0, ns }
	d.GetTotalEnergyConsumptionFunc = func() (uint64, nvml.Return) { return 0, ns }
	d.GetTotalEccErrorsFunc = func(nvml.MemoryErrorType, nvml.EccCounterType) (uint64, nvml.Return) { return 0, ns }
	d.GetRemappedRowsFunc = func() (int, int, bool, bool, nvml.Return) { return 0, 0, false, false, ns }
	d.GetFieldValuesFunc = func([]nvml.FieldValue) nvml.Return { return ns }
	d.GetPcieThroughputFunc = func(nvml.PcieUtilCounter) (uint32, nvml.Return) { return 0, ns }
	d.GetComputeRunningProcessesFunc = func() ([]nvml.ProcessInfo, nvml.Return) { return nil, ns }
	d.GetCurrentClocksEventReasonsFunc = func() (uint64, nvml.Return) { return 0, nvml.ERROR_FUNCTION_NOT_FOUND }
	d.GetCurrentClocksThrottleReasonsFunc = func() (uint64, nvml.Return) { return nvml.ClocksEventReasonGpuIdle, nvml.SUCCESS }
	// An unexpected error is logged, not fatal.
	d.GetTemperatureFunc = func(nvml.TemperatureSensors) (uint32, nvml.Return) { return 0, nvml.ERROR_UNKNOWN }

	got := step(t, s, clk)
	got = step(t, s, clk)
	g := got[0]
	if g.Lost || g.PowerMw != 0 || g.EnergyMj != 0 || g.Ecc != nil || g.TempC != 0 || g.RemappedRowsUncorrectable != 0 ||
		g.NvlinkTxBytesPerSec != 0 || g.PcieTxBytesPerSec != 0 || g.Processes != nil {
		t.Errorf("unsupported values not zero: %v", g)
	}
	if g.SmClockMhz == 0 || g.Uuid == "" || g.MemTotalBytes == 0 || !slices.Equal(g.ThrottleNames, []string{"gpu_idle"}) {
		t.Errorf("supported values missing: %v", g)
	}
	if got[1].PowerMw == 0 || got[1].Ecc == nil || got[1].TempC == 0 {
		t.Errorf("GPU 1 lost values: %v", got[1])
	}
}

func TestEventsCloseOnCancel(t *testing.T) {
	_, s, _ := newTestSim(t, "dgx-h100", SimOptions{})
	ctx, cancel := context.WithCancel(context.Background())
	ch := s.Events(ctx)
	if again := s.Events(ctx); again != ch {
		t.Error("second Events call returned another channel")
	}
	cancel()
	deadline := time.After(10 * time.Second)
	for {
		select {
		case _, ok := <-ch:
			if !ok {
				return
			}
		case <-deadline:
			t.Fatal("event channel not closed after cancel")
		}
	}
}

// Nobody reading events must not grow memory without bound.
func TestEventQueueBounded(t *testing.T) {
	_, s, _ := newTestSim(t, "dgx-h100", SimOptions{})
	for i := range maxQueuedEvents + 10 {
		s.enqueue(&api.Event{Seq: uint64(i)})
	}
	s.qmu.Lock()
	n, first := len(s.queue), s.queue[0].Seq
	s.qmu.Unlock()
	if n != maxQueuedEvents || first != 10 || s.DroppedEvents() != 10 {
		t.Errorf("queue %d events from seq %d, dropped %d", n, first, s.DroppedEvents())
	}
}

// A process that reports kernel time in the kernel dir loads its GPU by
// that time, not by its CPU time: a rank sleeping through its "compute"
// keeps the GPU busy. The larger of the two counts, and the report is
// removed when the process exits.
func TestKernelTimeLoadsGPU(t *testing.T) {
	cases := []struct {
		name       string
		cpuPerSec  uint64  // CPU ticks a second
		kernelFrac float64 // kernel seconds a second
		wantUtil   uint32
	}{
		{"kernel time, idle CPU", 0, 0.8, 80},
		{"CPU time larger than kernel time", procfs.ClockTicks * 9 / 10, 0.3, 90},
		{"neither", 0, 0, 0},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			fp := fakeProc{t: t, root: t.TempDir()}
			kdir := t.TempDir()
			clk := newFakeClock()
			sim, err := NewSim("dgx-h100", SimOptions{Now: clk.Now, CPUNow: clk.Now, ProcRoot: fp.root, KernelDir: kdir, Logger: testLogger(t)})
			if err != nil {
				t.Fatal(err)
			}
			s := NewSampler(sim.NVML(), testLogger(t), WithClock(clk.Now), WithProcRoot(fp.root))
			const pid = 777
			report := filepath.Join(kdir, fmt.Sprint(pid))
			kernel := func(sec int) {
				ns := uint64(float64(sec) * c.kernelFrac * 1e9)
				if err := os.WriteFile(report, []byte(fmt.Sprintf("%d\n", ns)), 0o644); err != nil {
					t.Fatal(err)
				}
			}
			fp.set(pid, 0, 100, 0, 0, 0, 0)
			kernel(0)
			if err := sim.SetProcesses(2, []uint32{pid}); err != nil {
				t.Fatal(err)
			}
			step(t, s, clk)
			var got []*api.GPUSample
			for i := 1; i <= 5; i++ {
				fp.set(pid, uint64(i)*c.cpuPerSec, 100, 0, 0, 0, 0)
				kernel(i)
				got = step(t, s, clk)
			}
			if u := got[2].UtilGpuPercent; u != c.wantUtil {
				t.Errorf("GPU 2 util %d %%, want %d", u, c.wantUtil)
			}
			if u := got[1].UtilGpuPercent; u != 0 {
				t.Errorf("GPU 1 (no process) util %d %%", u)
			}
			fp.exit(pid)
			step(t, s, clk)
			if _, err := os.Stat(report); !errors.Is(err, fs.ErrNotExist) {
				t.Errorf("kernel report of an exited process left behind: %v", err)
			}
		})
	}
}

// A slow GPU's loaded clock drops to its factor with the hardware slowdown
// reason, and the speed its ranks follow (gpu-<N>.speed) says the same; a
// slow link writes link.speed; CLEAR restores both; a factor outside
// (0, 1] is refused saying what to give.
func TestSlowFaultsWriteSpeeds(t *testing.T) {
	fp := fakeProc{t: t, root: t.TempDir()}
	kdir := t.TempDir()
	// A speed left by an earlier run is replaced at start.
	for _, f := range []string{"gpu-2.speed", "link.speed"} {
		if err := os.WriteFile(filepath.Join(kdir, f), []byte("0.3\n"), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	clk := newFakeClock()
	sim, err := NewSim("dgx-h100", SimOptions{Now: clk.Now, CPUNow: clk.Now, ProcRoot: fp.root, KernelDir: kdir, Logger: testLogger(t)})
	if err != nil {
		t.Fatal(err)
	}
	s := NewSampler(sim.NVML(), testLogger(t), WithClock(clk.Now), WithProcRoot(fp.root))
	speed := func(name string) string {
		t.Helper()
		b, err := os.ReadFile(filepath.Join(kdir, name))
		if err != nil {
			t.Fatal(err)
		}
		return strings.TrimSpace(string(b))
	}
	if got, gotLink := speed("gpu-2.speed"), speed("link.speed"); got != "1.0000" || gotLink != "1.0000" {
		t.Errorf("at start: gpu-2.speed %s, link.speed %s; want 1.0000 both", got, gotLink)
	}
	// Keep GPU 2 busy through reported kernel time.
	const pid = 778
	fp.set(pid, 0, 100, 0, 0, 0, 0)
	if err := sim.SetProcesses(2, []uint32{pid}); err != nil {
		t.Fatal(err)
	}
	busy := func(sec int) {
		if err := os.WriteFile(filepath.Join(kdir, fmt.Sprint(pid)), []byte(fmt.Sprintf("%d\n", uint64(sec)*900_000_000)), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	busy(0)
	step(t, s, clk)
	busy(1)
	got := step(t, s, clk)
	maxSM := profiles["dgx-h100"].maxSM
	if got[2].SmClockMhz != maxSM {
		t.Fatalf("busy GPU 2 runs at %d MHz before the fault, want boost %d", got[2].SmClockMhz, maxSM)
	}

	if err := sim.InjectFactor(2, api.FaultKind_FAULT_KIND_SLOW, 0.7); err != nil {
		t.Fatal(err)
	}
	if got := speed("gpu-2.speed"); got != "0.7000" {
		t.Errorf("gpu-2.speed after slow 0.7 = %s, want 0.7000", got)
	}
	if got := speed("gpu-1.speed"); got != "1.0000" {
		t.Errorf("gpu-1.speed (not slowed) = %s, want 1.0000", got)
	}
	busy(2)
	got = step(t, s, clk)
	if want := uint32(float64(maxSM) * 0.7); got[2].SmClockMhz != want || !slices.Contains(got[2].ThrottleNames, "hw_slowdown") {
		t.Errorf("slow GPU 2: %d MHz, reasons %v; want %d MHz with hw_slowdown", got[2].SmClockMhz, got[2].ThrottleNames, want)
	}

	if err := sim.InjectFactor(0, api.FaultKind_FAULT_KIND_LINK_SLOW, 0.5); err != nil {
		t.Fatal(err)
	}
	if got := speed("link.speed"); got != "0.5000" {
		t.Errorf("link.speed after link-slow 0.5 = %s, want 0.5000", got)
	}

	for _, f := range []float64{0, -1, 1.5, math.NaN()} {
		err := sim.InjectFactor(3, api.FaultKind_FAULT_KIND_SLOW, f)
		if err == nil || !strings.Contains(err.Error(), "(0, 1]") {
			t.Errorf("factor %g: err %v, want one naming the range (0, 1]", f, err)
		}
	}

	if err := sim.Inject(2, api.FaultKind_FAULT_KIND_CLEAR); err != nil {
		t.Fatal(err)
	}
	if got, gotLink := speed("gpu-2.speed"), speed("link.speed"); got != "1.0000" || gotLink != "1.0000" {
		t.Errorf("after clear: gpu-2.speed %s, link.speed %s; want 1.0000 both", got, gotLink)
	}

	// Thermal throttling slows the ranks too: clocks halve once hot.
	if err := sim.Inject(2, api.FaultKind_FAULT_KIND_THERMAL); err != nil {
		t.Fatal(err)
	}
	for i := 3; i < 30; i++ {
		busy(i)
		step(t, s, clk)
	}
	if got := speed("gpu-2.speed"); got > "0.5000" {
		t.Errorf("gpu-2.speed of a hot GPU = %s, want at most 0.5000", got)
	}
}
