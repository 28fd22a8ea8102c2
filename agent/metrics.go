package agent

import (
	"regexp"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/gpuctl/gpuctl/api"
	nvmlprobe "github.com/gpuctl/gpuctl/probes/nvml"
)

// metrics exposes nodemon's samples to Prometheus. GPU counters carry the
// names, units and labels of NVIDIA's dcgm-exporter (its default counters
// CSV), so the dashboards and alerts operators already run work
// unchanged; what dcgm-exporter has no name for (NCCL calls, flows,
// nodemon's own health) is under gpuctl_. It is a collector over the last
// telemetry batch, so a scrape costs no NVML call and is as fresh as the
// sampling interval (1 s by default).
type metrics struct {
	node      string
	queued    func() int
	inventory func() ([]*api.GPUInfo, string, string, error)
	now       func() time.Time

	mu     sync.Mutex
	info   map[uint32]*api.GPUInfo // by GPU index, loaded on first use
	driver string
	gpus   []*api.GPUSample
	// Ranks by pid, from the last sampling batch: which rank runs on a GPU.
	ranks map[uint32]*api.RankStatus
	// XIDs seen per GPU and code since nodemon started.
	xids map[xidKey]uint64
	nccl map[ncclKey]*ncclAgg
	net  map[flowKey]*flowAgg
	// Cumulative counters since start.
	lostCalls, lostNet, dropped uint64
}

type xidKey struct {
	gpu  int32
	uuid string
	code uint32
}

// ncclKey and flowKey group traced calls and flows per rank; their
// aggregates are forgotten once unchanged for idleExpiry, so series of
// finished jobs do not pile up.
type ncclKey struct {
	job  string
	rank int32
	op   string
}

type ncclAgg struct {
	calls, bytes uint64
	seconds      float64
	buckets      []uint64 // cumulative counts per ncclBuckets bound
	last         time.Time
}

type flowKey struct {
	job      string
	rank     int32
	protocol string
}

type flowAgg struct {
	tx, rx, retransmits uint64
	last                time.Time
}

const idleExpiry = 10 * time.Minute

// ncclBuckets bound NCCL call durations: 10 µs to about 10 s, ×4 apart.
var ncclBuckets = prometheus.ExponentialBuckets(10e-6, 4, 11)

// gpuLabels are dcgm-exporter's labels of a GPU metric, in its order, plus
// the gpuctl job (hpc_job, dcgm-exporter's name for the HPC job on a GPU;
// "job" itself is Prometheus's scrape job label) and rank running there.
var gpuLabels = []string{"gpu", "UUID", "pci_bus_id", "device", "modelName", "Hostname", "DCGM_FI_DRIVER_VERSION", "hpc_job", "rank"}

// dcgmField describes one dcgm-exporter field: its name and help as
// dcgm-exporter gives them, whether it is a counter, and how to read it
// from a sample.
type dcgmField struct {
	name, help string
	counter    bool
	value      func(*api.GPUSample, *api.GPUInfo) float64
}

const mib = 1 << 20

// dcgmFields are the dcgm-exporter fields nodemon has a reading for, with
// dcgm-exporter's units: FB in MiB, power in W, energy in mJ, clocks in
// MHz, PCIe and NVLink throughput in bytes per second. XIDs are apart
// (one counter per code).
var dcgmFields = []dcgmField{
	{"DCGM_FI_DEV_GPU_UTIL", "GPU utilization (in %).", false, func(s *api.GPUSample, _ *api.GPUInfo) float64 { return float64(s.GetUtilGpuPercent()) }},
	{"DCGM_FI_DEV_MEM_COPY_UTIL", "Memory utilization (in %).", false, func(s *api.GPUSample, _ *api.GPUInfo) float64 { return float64(s.GetUtilMemPercent()) }},
	{"DCGM_FI_DEV_FB_USED", "Framebuffer memory used (in MiB).", false, func(s *api.GPUSample, _ *api.GPUInfo) float64 { return float64(s.GetMemUsedBytes() / mib) }},
	{"DCGM_FI_DEV_FB_FREE", "Framebuffer memory free (in MiB).", false, func(s *api.GPUSample, i *api.GPUInfo) float64 {
		total := s.GetMemTotalBytes()
		if total == 0 {
			total = i.GetMemTotalBytes()
		}
		if total < s.GetMemUsedBytes() {
			return 0
		}
		return float64((total - s.GetMemUsedBytes()) / mib)
	}},
	{"DCGM_FI_DEV_POWER_USAGE", "Power draw (in W).", false, func(s *api.GPUSample, _ *api.GPUInfo) float64 { return float64(s.GetPowerMw()) / 1000 }},
	{"DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION", "Total energy consumption since boot (in mJ).", true, func(s *api.GPUSample, _ *api.GPUInfo) float64 { return float64(s.GetEnergyMj()) }},
	{"DCGM_FI_DEV_GPU_TEMP", "GPU temperature (in C).", false, func(s *api.GPUSample, _ *api.GPUInfo) float64 { return float64(s.GetTempC()) }},
	{"DCGM_FI_DEV_SM_CLOCK", "SM clock frequency (in MHz).", false, func(s *api.GPUSample, _ *api.GPUInfo) float64 { return float64(s.GetSmClockMhz()) }},
	{"DCGM_FI_DEV_MEM_CLOCK", "Memory clock frequency (in MHz).", false, func(s *api.GPUSample, _ *api.GPUInfo) float64 { return float64(s.GetMemClockMhz()) }},
	{"DCGM_FI_DEV_CLOCKS_EVENT_REASONS", "Current clock event (throttle) reasons, NVML's bitmask.", false, func(s *api.GPUSample, _ *api.GPUInfo) float64 { return float64(s.GetThrottleReasons()) }},
	{"DCGM_FI_DEV_ECC_SBE_VOL_TOTAL", "Total number of single-bit volatile ECC errors.", true, func(s *api.GPUSample, _ *api.GPUInfo) float64 { return float64(s.GetEcc().GetVolatileCorrected()) }},
	{"DCGM_FI_DEV_ECC_DBE_VOL_TOTAL", "Total number of double-bit volatile ECC errors.", true, func(s *api.GPUSample, _ *api.GPUInfo) float64 { return float64(s.GetEcc().GetVolatileUncorrected()) }},
	{"DCGM_FI_DEV_ECC_SBE_AGG_TOTAL", "Total number of single-bit persistent ECC errors.", true, func(s *api.GPUSample, _ *api.GPUInfo) float64 { return float64(s.GetEcc().GetAggregateCorrected()) }},
	{"DCGM_FI_DEV_ECC_DBE_AGG_TOTAL", "Total number of double-bit persistent ECC errors.", true, func(s *api.GPUSample, _ *api.GPUInfo) float64 { return float64(s.GetEcc().GetAggregateUncorrected()) }},
	{"DCGM_FI_DEV_RETIRED_SBE", "Total number of retired pages due to single-bit errors.", true, func(s *api.GPUSample, _ *api.GPUInfo) float64 { return float64(s.GetRetiredPagesSbe()) }},
	{"DCGM_FI_DEV_RETIRED_DBE", "Total number of retired pages due to double-bit errors.", true, func(s *api.GPUSample, _ *api.GPUInfo) float64 { return float64(s.GetRetiredPagesDbe()) }},
	{"DCGM_FI_DEV_CORRECTABLE_REMAPPED_ROWS", "Number of remapped rows for correctable errors", true, func(s *api.GPUSample, _ *api.GPUInfo) float64 { return float64(s.GetRemappedRowsCorrectable()) }},
	{"DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS", "Number of remapped rows for uncorrectable errors", true, func(s *api.GPUSample, _ *api.GPUInfo) float64 { return float64(s.GetRemappedRowsUncorrectable()) }},
	{"DCGM_FI_DEV_ROW_REMAP_FAILURE", "Whether remapping of rows has failed", false, func(s *api.GPUSample, _ *api.GPUInfo) float64 { return boolValue(s.GetRemapFailure()) }},
	{"DCGM_FI_DEV_ROW_REMAP_PENDING", "Whether remapping of rows is pending (a GPU reset applies it)", false, func(s *api.GPUSample, _ *api.GPUInfo) float64 { return boolValue(s.GetRemapPending()) }},
	{"DCGM_FI_PROF_PCIE_TX_BYTES", "The rate of data transmitted over the PCIe bus - including both protocol headers and data payloads - in bytes per second.", false, func(s *api.GPUSample, _ *api.GPUInfo) float64 { return float64(s.GetPcieTxBytesPerSec()) }},
	{"DCGM_FI_PROF_PCIE_RX_BYTES", "The rate of data received over the PCIe bus - including both protocol headers and data payloads - in bytes per second.", false, func(s *api.GPUSample, _ *api.GPUInfo) float64 { return float64(s.GetPcieRxBytesPerSec()) }},
	{"DCGM_FI_PROF_NVLINK_TX_BYTES", "The rate of data transmitted over NVLink, not including protocol headers, in bytes per second.", false, func(s *api.GPUSample, _ *api.GPUInfo) float64 { return float64(s.GetNvlinkTxBytesPerSec()) }},
	{"DCGM_FI_PROF_NVLINK_RX_BYTES", "The rate of data received over NVLink, not including protocol headers, in bytes per second.", false, func(s *api.GPUSample, _ *api.GPUInfo) float64 { return float64(s.GetNvlinkRxBytesPerSec()) }},
}

// The descriptors of everything nodemon exports besides dcgmFields.
var (
	xidDesc = prometheus.NewDesc("DCGM_FI_DEV_XID_ERRORS",
		"XID errors reported by the driver since nodemon started, per code (err_code, err_msg as dcgm-exporter labels them).",
		append(append([]string{}, gpuLabels...), "err_code", "err_msg"), nil)
	sampleTimeDesc = prometheus.NewDesc("gpuctl_gpu_last_sample_timestamp_seconds", "When the GPU was last sampled (Unix time).", gpuLabels, nil)
	gpuLostDesc    = prometheus.NewDesc("gpuctl_gpu_lost", "1 while the GPU no longer answers NVML (fell off the bus).", gpuLabels, nil)

	ncclRankLabels = []string{"Hostname", "hpc_job", "rank", "op"}
	ncclCallsDesc  = prometheus.NewDesc("gpuctl_nccl_calls_total", "NCCL calls traced by eBPF, per rank and op.", ncclRankLabels, nil)
	ncclBytesDesc  = prometheus.NewDesc("gpuctl_nccl_bytes_total", "Bytes the traced NCCL calls moved (count × datatype size), per rank and op.", ncclRankLabels, nil)
	ncclTimeDesc   = prometheus.NewDesc("gpuctl_nccl_call_duration_seconds", "Time inside traced NCCL calls, per rank and op.", ncclRankLabels, nil)

	flowLabels     = []string{"Hostname", "hpc_job", "rank", "protocol"}
	netTxDesc      = prometheus.NewDesc("gpuctl_net_transmit_bytes_total", "Bytes the job's ranks sent over sockets, traced by eBPF.", flowLabels, nil)
	netRxDesc      = prometheus.NewDesc("gpuctl_net_receive_bytes_total", "Bytes the job's ranks received over sockets, traced by eBPF.", flowLabels, nil)
	netRetransDesc = prometheus.NewDesc("gpuctl_net_retransmits_total", "TCP retransmits on the job's ranks' sockets, traced by eBPF.", flowLabels, nil)
	nodeLabels     = []string{"Hostname"}
	lostCallsDesc  = prometheus.NewDesc("gpuctl_nccl_calls_lost_total", "NCCL call records lost to a full eBPF ring buffer.", nodeLabels, nil)
	lostNetDesc    = prometheus.NewDesc("gpuctl_netflow_events_lost_total", "Flow updates lost to a full eBPF map.", nodeLabels, nil)
	droppedDesc    = prometheus.NewDesc("gpuctl_telemetry_batches_dropped_total", "Telemetry batches dropped while the server was unreachable.", nodeLabels, nil)
	queuedDesc     = prometheus.NewDesc("gpuctl_events_unacknowledged", "Events not yet acknowledged by the server.", nodeLabels, nil)
	dcgmFieldDescs = fieldDescs()
)

func fieldDescs() []*prometheus.Desc {
	out := make([]*prometheus.Desc, len(dcgmFields))
	for i, f := range dcgmFields {
		out[i] = prometheus.NewDesc(f.name, f.help, gpuLabels, nil)
	}
	return out
}

// xidMessage is the catalog's description of an XID, as dcgm-exporter's
// err_msg label gives one.
func xidMessage(code uint32) string {
	d := nvmlprobe.DescribeXID(code)
	if _, rest, ok := strings.Cut(d, ": "); ok {
		return rest
	}
	return d
}

func boolValue(b bool) float64 {
	if b {
		return 1
	}
	return 0
}

// newMetrics returns the collector of node; queued counts the events
// awaiting acknowledgement and inventory describes the GPUs (model, PCI
// bus id, driver version for the labels).
func newMetrics(node string, queued func() int, inventory func() ([]*api.GPUInfo, string, string, error)) *metrics {
	return &metrics{
		node: node, queued: queued, inventory: inventory, now: time.Now,
		ranks: map[uint32]*api.RankStatus{}, xids: map[xidKey]uint64{},
		nccl: map[ncclKey]*ncclAgg{}, net: map[flowKey]*flowAgg{},
	}
}

// observe takes in one telemetry batch.
func (m *metrics) observe(t *api.Telemetry) {
	now := m.now()
	m.mu.Lock()
	defer m.mu.Unlock()
	if len(t.GetGpus()) > 0 {
		m.gpus = t.GetGpus()
		// A sampling batch carries every live rank, even none.
		m.ranks = make(map[uint32]*api.RankStatus, len(t.GetRanks()))
		for _, r := range t.GetRanks() {
			m.ranks[r.GetPid()] = r
		}
	}
	for _, c := range t.GetCollectives() {
		// A completion is not another call; dcgm-style call counts stay
		// the calls'.
		if c.GetInProgress() || c.GetCompletion() {
			continue
		}
		k := ncclKey{job: c.GetJob(), rank: c.GetRank(), op: c.GetOp().Short()}
		a := m.nccl[k]
		if a == nil {
			a = &ncclAgg{buckets: make([]uint64, len(ncclBuckets))}
			m.nccl[k] = a
		}
		d := time.Duration(c.GetDurationNs()).Seconds()
		a.calls++
		a.bytes += c.GetBytes()
		a.seconds += d
		for i, b := range ncclBuckets {
			if d <= b {
				a.buckets[i]++
			}
		}
		a.last = now
	}
	for _, f := range t.GetFlows() {
		k := flowKey{job: f.GetJob(), rank: f.GetRank(), protocol: f.GetProtocol()}
		a := m.net[k]
		if a == nil {
			a = &flowAgg{}
			m.net[k] = a
		}
		a.tx += f.GetTxBytes()
		a.rx += f.GetRxBytes()
		a.retransmits += f.GetRetransmits()
		a.last = now
	}
	m.lostCalls, m.lostNet, m.dropped = t.GetLostCollectives(), t.GetLostNetEvents(), t.GetDroppedBatches()
}

// event counts the XIDs among the events nodemon queues for the server.
func (m *metrics) event(e *api.Event) {
	if e.GetKind() != api.EventKind_EVENT_KIND_XID || e.GetXid() == 0 {
		return
	}
	m.mu.Lock()
	m.xids[xidKey{gpu: e.GetGpuIndex(), uuid: e.GetGpuUuid(), code: e.GetXid()}]++
	m.mu.Unlock()
}

// Describe implements prometheus.Collector.
func (m *metrics) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range dcgmFieldDescs {
		ch <- d
	}
	for _, d := range []*prometheus.Desc{xidDesc, sampleTimeDesc, gpuLostDesc, ncclCallsDesc, ncclBytesDesc, ncclTimeDesc,
		netTxDesc, netRxDesc, netRetransDesc, lostCallsDesc, lostNetDesc, droppedDesc, queuedDesc} {
		ch <- d
	}
}

// loadInventoryLocked fills in the GPUs' static facts once.
func (m *metrics) loadInventoryLocked() {
	if m.info != nil || m.inventory == nil {
		return
	}
	gpus, driver, _, err := m.inventory()
	if err != nil {
		return // tried again at the next scrape
	}
	m.info = make(map[uint32]*api.GPUInfo, len(gpus))
	for _, g := range gpus {
		m.info[g.GetIndex()] = g
	}
	m.driver = driver
}

// jobOf names the job and ranks whose processes hold the GPU, as label
// values ("" when none; ranks comma-separated when several share it).
func (m *metrics) jobOf(s *api.GPUSample) (job, rank string) {
	jobs := map[string]bool{}
	var ranks []int
	for _, p := range s.GetProcesses() {
		if r, ok := m.ranks[p.GetPid()]; ok {
			jobs[r.GetJob()] = true
			ranks = append(ranks, int(r.GetRank()))
		}
	}
	names := make([]string, 0, len(jobs))
	for j := range jobs {
		names = append(names, j)
	}
	sort.Strings(names)
	sort.Ints(ranks)
	rs := make([]string, len(ranks))
	for i, r := range ranks {
		rs[i] = strconv.Itoa(r)
	}
	return strings.Join(names, ","), strings.Join(rs, ",")
}

// Collect implements prometheus.Collector.
func (m *metrics) Collect(ch chan<- prometheus.Metric) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.loadInventoryLocked()
	byIndex := map[int32][]string{}
	for _, s := range m.gpus {
		info := m.info[s.GetIndex()]
		job, rank := m.jobOf(s)
		l := []string{strconv.Itoa(int(s.GetIndex())), s.GetUuid(), info.GetPciBusId(), "nvidia" + strconv.Itoa(int(s.GetIndex())),
			info.GetModel(), m.node, m.driver, job, rank}
		byIndex[int32(s.GetIndex())] = l
		if !s.GetLost() {
			for i, f := range dcgmFields {
				typ := prometheus.GaugeValue
				if f.counter {
					typ = prometheus.CounterValue
				}
				ch <- prometheus.MustNewConstMetric(dcgmFieldDescs[i], typ, f.value(s, info), l...)
			}
		}
		ch <- prometheus.MustNewConstMetric(sampleTimeDesc, prometheus.GaugeValue, float64(s.GetTimeUnixNano())/1e9, l...)
		ch <- prometheus.MustNewConstMetric(gpuLostDesc, prometheus.GaugeValue, boolValue(s.GetLost()), l...)
	}
	for k, n := range m.xids {
		l, ok := byIndex[k.gpu]
		if !ok {
			l = []string{strconv.Itoa(int(k.gpu)), k.uuid, "", "nvidia" + strconv.Itoa(int(k.gpu)), "", m.node, m.driver, "", ""}
		}
		l = append(append([]string{}, l...), strconv.Itoa(int(k.code)), xidMessage(k.code))
		ch <- prometheus.MustNewConstMetric(xidDesc, prometheus.CounterValue, float64(n), l...)
	}
	now := m.now()
	for k, a := range m.nccl {
		if now.Sub(a.last) > idleExpiry {
			delete(m.nccl, k)
			continue
		}
		l := []string{m.node, k.job, strconv.Itoa(int(k.rank)), k.op}
		ch <- prometheus.MustNewConstMetric(ncclCallsDesc, prometheus.CounterValue, float64(a.calls), l...)
		ch <- prometheus.MustNewConstMetric(ncclBytesDesc, prometheus.CounterValue, float64(a.bytes), l...)
		buckets := make(map[float64]uint64, len(ncclBuckets))
		for i, b := range ncclBuckets {
			buckets[b] = a.buckets[i]
		}
		ch <- prometheus.MustNewConstHistogram(ncclTimeDesc, a.calls, a.seconds, buckets, l...)
	}
	for k, a := range m.net {
		if now.Sub(a.last) > idleExpiry {
			delete(m.net, k)
			continue
		}
		l := []string{m.node, k.job, strconv.Itoa(int(k.rank)), k.protocol}
		ch <- prometheus.MustNewConstMetric(netTxDesc, prometheus.CounterValue, float64(a.tx), l...)
		ch <- prometheus.MustNewConstMetric(netRxDesc, prometheus.CounterValue, float64(a.rx), l...)
		ch <- prometheus.MustNewConstMetric(netRetransDesc, prometheus.CounterValue, float64(a.retransmits), l...)
	}
	ch <- prometheus.MustNewConstMetric(lostCallsDesc, prometheus.CounterValue, float64(m.lostCalls), m.node)
	ch <- prometheus.MustNewConstMetric(lostNetDesc, prometheus.CounterValue, float64(m.lostNet), m.node)
	ch <- prometheus.MustNewConstMetric(droppedDesc, prometheus.CounterValue, float64(m.dropped), m.node)
	ch <- prometheus.MustNewConstMetric(queuedDesc, prometheus.GaugeValue, float64(m.queued()), m.node)
}

var fqName = regexp.MustCompile(`fqName: "([^"]+)"`)

// MetricNames lists the metric names nodemon serves (histograms by their
// family name), for checking dashboards and alerts against.
func MetricNames() []string {
	m := newMetrics("", func() int { return 0 }, nil)
	ch := make(chan *prometheus.Desc, 64)
	go func() {
		m.Describe(ch)
		close(ch)
	}()
	var out []string
	for d := range ch {
		if s := fqName.FindStringSubmatch(d.String()); s != nil {
			out = append(out, s[1])
		}
	}
	sort.Strings(out)
	return out
}
