package agent

import (
	"strconv"
	"sync"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/gpuctl/gpuctl/api"
)

// metrics exposes nodemon's latest samples to Prometheus. It is a
// collector over the last telemetry batch, so a scrape costs no NVML call.
type metrics struct {
	node string
	mu   sync.Mutex
	gpus []*api.GPUSample
	// Cumulative counters since start.
	calls, lostCalls, lostNet, dropped uint64
	queued                             func() int

	util, mem, power, temp, energy, smClock *prometheus.Desc
	callsD, lostCallsD, lostNetD, droppedD  *prometheus.Desc
	queuedD                                 *prometheus.Desc
}

func newMetrics(node string, queued func() int) *metrics {
	gpu := []string{"gpu", "uuid"}
	c := prometheus.Labels{"node": node}
	return &metrics{
		node: node, queued: queued,
		util:       prometheus.NewDesc("gpuctl_gpu_utilization_percent", "GPU utilization over the last sample period.", gpu, c),
		mem:        prometheus.NewDesc("gpuctl_gpu_memory_used_bytes", "GPU memory in use.", gpu, c),
		power:      prometheus.NewDesc("gpuctl_gpu_power_watts", "GPU power draw.", gpu, c),
		temp:       prometheus.NewDesc("gpuctl_gpu_temperature_celsius", "GPU temperature.", gpu, c),
		energy:     prometheus.NewDesc("gpuctl_gpu_energy_joules_total", "GPU energy since the driver loaded.", gpu, c),
		smClock:    prometheus.NewDesc("gpuctl_gpu_sm_clock_mhz", "GPU SM clock.", gpu, c),
		callsD:     prometheus.NewDesc("gpuctl_nccl_calls_total", "NCCL calls traced.", nil, c),
		lostCallsD: prometheus.NewDesc("gpuctl_nccl_calls_lost_total", "NCCL call records lost to a full eBPF ring buffer.", nil, c),
		lostNetD:   prometheus.NewDesc("gpuctl_netflow_events_lost_total", "Flow updates lost to a full eBPF map.", nil, c),
		droppedD:   prometheus.NewDesc("gpuctl_telemetry_batches_dropped_total", "Telemetry batches dropped while the server was unreachable.", nil, c),
		queuedD:    prometheus.NewDesc("gpuctl_events_unacknowledged", "Events not yet acknowledged by the server.", nil, c),
	}
}

func (m *metrics) observe(t *api.Telemetry) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if len(t.GetGpus()) > 0 {
		m.gpus = t.GetGpus()
	}
	m.calls += uint64(len(t.GetCollectives()))
	m.lostCalls, m.lostNet, m.dropped = t.GetLostCollectives(), t.GetLostNetEvents(), t.GetDroppedBatches()
}

// Describe implements prometheus.Collector.
func (m *metrics) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{m.util, m.mem, m.power, m.temp, m.energy, m.smClock, m.callsD, m.lostCallsD, m.lostNetD, m.droppedD, m.queuedD} {
		ch <- d
	}
}

// Collect implements prometheus.Collector.
func (m *metrics) Collect(ch chan<- prometheus.Metric) {
	m.mu.Lock()
	defer m.mu.Unlock()
	for _, g := range m.gpus {
		l := []string{strconv.Itoa(int(g.GetIndex())), g.GetUuid()}
		ch <- prometheus.MustNewConstMetric(m.util, prometheus.GaugeValue, float64(g.GetUtilGpuPercent()), l...)
		ch <- prometheus.MustNewConstMetric(m.mem, prometheus.GaugeValue, float64(g.GetMemUsedBytes()), l...)
		ch <- prometheus.MustNewConstMetric(m.power, prometheus.GaugeValue, float64(g.GetPowerMw())/1000, l...)
		ch <- prometheus.MustNewConstMetric(m.temp, prometheus.GaugeValue, float64(g.GetTempC()), l...)
		ch <- prometheus.MustNewConstMetric(m.energy, prometheus.CounterValue, float64(g.GetEnergyMj())/1000, l...)
		ch <- prometheus.MustNewConstMetric(m.smClock, prometheus.GaugeValue, float64(g.GetSmClockMhz()), l...)
	}
	ch <- prometheus.MustNewConstMetric(m.callsD, prometheus.CounterValue, float64(m.calls))
	ch <- prometheus.MustNewConstMetric(m.lostCallsD, prometheus.CounterValue, float64(m.lostCalls))
	ch <- prometheus.MustNewConstMetric(m.lostNetD, prometheus.CounterValue, float64(m.lostNet))
	ch <- prometheus.MustNewConstMetric(m.droppedD, prometheus.CounterValue, float64(m.dropped))
	ch <- prometheus.MustNewConstMetric(m.queuedD, prometheus.GaugeValue, float64(m.queued()))
}
