package agent

import (
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"

	"github.com/gpuctl/gpuctl/api"
)

// metricsAgent is an agent with only its metrics, fed one sampling batch:
// GPU 0 runs rank 3 of j-1a2b3c, GPU 1 idles; GPU 1 reported XID 79 twice
// and XID 48 once.
func metricsAgent(t *testing.T, now time.Time) *Agent {
	t.Helper()
	inv := func() ([]*api.GPUInfo, string, string, error) {
		return []*api.GPUInfo{
			{Index: 0, Uuid: "GPU-a", Model: "NVIDIA H100 80GB HBM3", PciBusId: "00000000:18:00.0", MemTotalBytes: 80 << 30},
			{Index: 1, Uuid: "GPU-b", Model: "NVIDIA H100 80GB HBM3", PciBusId: "00000000:2A:00.0", MemTotalBytes: 80 << 30},
		}, "550.54.15", "12.4", nil
	}
	m := newMetrics("node-00", func() int { return 2 }, inv)
	m.now = func() time.Time { return now }
	m.observe(&api.Telemetry{
		Gpus: []*api.GPUSample{
			{Index: 0, Uuid: "GPU-a", TimeUnixNano: now.UnixNano(), UtilGpuPercent: 97, UtilMemPercent: 40, MemUsedBytes: 10 << 30,
				MemTotalBytes: 80 << 30, PowerMw: 612500, EnergyMj: 123456789, TempC: 66, SmClockMhz: 1980, MemClockMhz: 2619,
				Ecc: &api.ECCCounts{VolatileCorrected: 2, AggregateUncorrected: 1}, NvlinkTxBytesPerSec: 5e9, PcieRxBytesPerSec: 1e6,
				Processes: []*api.GPUProcess{{Pid: 4242, UsedMemBytes: 8 << 30}}},
			{Index: 1, Uuid: "GPU-b", TimeUnixNano: now.UnixNano(), MemTotalBytes: 80 << 30, RemapPending: true},
		},
		Ranks: []*api.RankStatus{{Job: "j-1a2b3c", Rank: 3, Pid: 4242}},
		Collectives: []*api.CollectiveRecord{
			{Job: "j-1a2b3c", Rank: 3, Op: api.NCCLOp_NCCL_OP_ALL_REDUCE, Bytes: 1 << 20, DurationNs: int64(2 * time.Millisecond)},
			{Job: "j-1a2b3c", Rank: 3, Op: api.NCCLOp_NCCL_OP_ALL_REDUCE, Bytes: 1 << 20, DurationNs: int64(3 * time.Millisecond)},
			{Job: "j-1a2b3c", Rank: 3, Op: api.NCCLOp_NCCL_OP_ALL_REDUCE, Bytes: 1 << 20, DurationNs: int64(time.Second), InProgress: true},
		},
		Flows:           []*api.NetFlowSample{{Job: "j-1a2b3c", Rank: 3, Protocol: "tcp", TxBytes: 1000, RxBytes: 2000, Retransmits: 1}},
		LostCollectives: 5,
	})
	for _, code := range []uint32{79, 79, 48} {
		m.event(&api.Event{Kind: api.EventKind_EVENT_KIND_XID, GpuIndex: 1, GpuUuid: "GPU-b", Xid: code})
	}
	m.event(&api.Event{Kind: api.EventKind_EVENT_KIND_THROTTLE, GpuIndex: 1})
	return &Agent{metrics: m}
}

func scrape(t *testing.T, h http.Handler, accept string) (string, string) {
	t.Helper()
	srv := httptest.NewServer(h)
	defer srv.Close()
	req, _ := http.NewRequest("GET", srv.URL, nil)
	req.Header.Set("Accept", accept)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return resp.Header.Get("Content-Type"), string(b)
}

// series finds the sample of family name whose labels include want.
func series(t *testing.T, fams map[string]*dto.MetricFamily, name string, want map[string]string) *dto.Metric {
	t.Helper()
	f, ok := fams[name]
	if !ok {
		t.Fatalf("no metric %s", name)
	}
next:
	for _, m := range f.GetMetric() {
		have := map[string]string{}
		for _, l := range m.GetLabel() {
			have[l.GetName()] = l.GetValue()
		}
		for k, v := range want {
			if have[k] != v {
				continue next
			}
		}
		return m
	}
	t.Fatalf("no %s series with labels %v", name, want)
	return nil
}

func value(m *dto.Metric) float64 {
	switch {
	case m.GetGauge() != nil:
		return m.GetGauge().GetValue()
	case m.GetCounter() != nil:
		return m.GetCounter().GetValue()
	}
	return m.GetUntyped().GetValue()
}

// TestMetricsDCGMNames checks the GPU metrics against dcgm-exporter's
// names, units and labels, and gpuctl's own.
func TestMetricsDCGMNames(t *testing.T) {
	now := time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)
	a := metricsAgent(t, now)
	_, body := scrape(t, a.MetricsHandler(), "text/plain")
	p := expfmt.NewTextParser(model.UTF8Validation)
	fams, err := p.TextToMetricFamilies(strings.NewReader(body))
	if err != nil {
		t.Fatalf("%v\n%s", err, body)
	}
	gpu0 := map[string]string{"gpu": "0", "UUID": "GPU-a", "pci_bus_id": "00000000:18:00.0", "device": "nvidia0",
		"modelName": "NVIDIA H100 80GB HBM3", "Hostname": "node-00", "DCGM_FI_DRIVER_VERSION": "550.54.15", "hpc_job": "j-1a2b3c", "rank": "3"}
	gpu1 := map[string]string{"gpu": "1", "UUID": "GPU-b", "Hostname": "node-00", "hpc_job": "", "rank": ""}
	tests := []struct {
		name   string
		labels map[string]string
		want   float64
		typ    dto.MetricType
	}{
		{"DCGM_FI_DEV_GPU_UTIL", gpu0, 97, dto.MetricType_GAUGE},
		{"DCGM_FI_DEV_MEM_COPY_UTIL", gpu0, 40, dto.MetricType_GAUGE},
		{"DCGM_FI_DEV_FB_USED", gpu0, 10 * 1024, dto.MetricType_GAUGE}, // MiB
		{"DCGM_FI_DEV_FB_FREE", gpu0, 70 * 1024, dto.MetricType_GAUGE},
		{"DCGM_FI_DEV_POWER_USAGE", gpu0, 612.5, dto.MetricType_GAUGE},                    // W
		{"DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION", gpu0, 123456789, dto.MetricType_COUNTER}, // mJ
		{"DCGM_FI_DEV_GPU_TEMP", gpu0, 66, dto.MetricType_GAUGE},
		{"DCGM_FI_DEV_SM_CLOCK", gpu0, 1980, dto.MetricType_GAUGE},
		{"DCGM_FI_DEV_MEM_CLOCK", gpu0, 2619, dto.MetricType_GAUGE},
		{"DCGM_FI_DEV_ECC_SBE_VOL_TOTAL", gpu0, 2, dto.MetricType_COUNTER},
		{"DCGM_FI_DEV_ECC_DBE_AGG_TOTAL", gpu0, 1, dto.MetricType_COUNTER},
		{"DCGM_FI_DEV_ROW_REMAP_PENDING", gpu1, 1, dto.MetricType_GAUGE},
		{"DCGM_FI_PROF_NVLINK_TX_BYTES", gpu0, 5e9, dto.MetricType_GAUGE},
		{"DCGM_FI_PROF_PCIE_RX_BYTES", gpu0, 1e6, dto.MetricType_GAUGE},
		{"DCGM_FI_DEV_XID_ERRORS", map[string]string{"gpu": "1", "err_code": "79", "err_msg": "GPU has fallen off the bus (reboot the node)"}, 2, dto.MetricType_COUNTER},
		{"DCGM_FI_DEV_XID_ERRORS", map[string]string{"gpu": "1", "err_code": "48"}, 1, dto.MetricType_COUNTER},
		{"gpuctl_gpu_last_sample_timestamp_seconds", gpu0, float64(now.Unix()), dto.MetricType_GAUGE},
		{"gpuctl_nccl_calls_total", map[string]string{"Hostname": "node-00", "hpc_job": "j-1a2b3c", "rank": "3", "op": "allreduce"}, 2, dto.MetricType_COUNTER},
		{"gpuctl_nccl_bytes_total", map[string]string{"op": "allreduce"}, 2 << 20, dto.MetricType_COUNTER},
		{"gpuctl_net_transmit_bytes_total", map[string]string{"hpc_job": "j-1a2b3c", "protocol": "tcp"}, 1000, dto.MetricType_COUNTER},
		{"gpuctl_net_retransmits_total", map[string]string{"rank": "3"}, 1, dto.MetricType_COUNTER},
		{"gpuctl_nccl_calls_lost_total", map[string]string{"Hostname": "node-00"}, 5, dto.MetricType_COUNTER},
		{"gpuctl_events_unacknowledged", nil, 2, dto.MetricType_GAUGE},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			if typ := fams[tc.name].GetType(); typ != tc.typ {
				t.Errorf("type %s, want %s", typ, tc.typ)
			}
			if got := value(series(t, fams, tc.name, tc.labels)); got != tc.want {
				t.Errorf("value %g, want %g", got, tc.want)
			}
		})
	}
	h := series(t, fams, "gpuctl_nccl_call_duration_seconds", map[string]string{"op": "allreduce"}).GetHistogram()
	if h.GetSampleCount() != 2 || h.GetSampleSum() < 0.0049 || h.GetSampleSum() > 0.0051 {
		t.Errorf("call duration histogram: count %d sum %g, want 2 calls in 5ms (the call in progress not counted)", h.GetSampleCount(), h.GetSampleSum())
	}
	if n := len(fams["DCGM_FI_DEV_GPU_UTIL"].GetMetric()); n != 2 {
		t.Errorf("%d DCGM_FI_DEV_GPU_UTIL series, want one per GPU (2)", n)
	}
}

// TestMetricsOpenMetrics checks that an OpenMetrics scrape sees the same
// names: dcgm-exporter's counters have no _total, which OpenMetrics would
// otherwise append.
func TestMetricsOpenMetrics(t *testing.T) {
	a := metricsAgent(t, time.Now())
	ct, body := scrape(t, a.MetricsHandler(), "application/openmetrics-text;version=1.0.0")
	if !strings.HasPrefix(ct, "application/openmetrics-text") {
		t.Fatalf("content type %q, want OpenMetrics", ct)
	}
	for _, want := range []string{
		"\nDCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION{",
		"\nDCGM_FI_DEV_XID_ERRORS{",
		"\nDCGM_FI_DEV_GPU_UTIL{",
		"\ngpuctl_nccl_calls_total{",
		"# TYPE gpuctl_nccl_calls counter",
		"\n# EOF\n",
	} {
		if !strings.Contains(body, want) {
			t.Errorf("OpenMetrics scrape lacks %q", want)
		}
	}
	for _, bad := range []string{"DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION_total", "DCGM_FI_DEV_XID_ERRORS_total"} {
		if strings.Contains(body, bad) {
			t.Errorf("OpenMetrics scrape renames a dcgm-exporter counter: %s", bad)
		}
	}
}

// TestMetricsForgetIdleRanks checks that NCCL and flow series of ranks
// that stopped reporting go away, so finished jobs do not pile up.
func TestMetricsForgetIdleRanks(t *testing.T) {
	now := time.Now()
	a := metricsAgent(t, now)
	a.metrics.now = func() time.Time { return now.Add(idleExpiry + time.Second) }
	_, body := scrape(t, a.MetricsHandler(), "text/plain")
	for _, gone := range []string{"gpuctl_nccl_calls_total{", "gpuctl_net_transmit_bytes_total{"} {
		if strings.Contains(body, gone) {
			t.Errorf("%s still exported after %s without calls", gone, idleExpiry)
		}
	}
	if !strings.Contains(body, "DCGM_FI_DEV_XID_ERRORS{") {
		t.Error("XID counters must outlive idle ranks")
	}
}
