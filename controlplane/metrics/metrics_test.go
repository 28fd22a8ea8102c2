package metrics

import (
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
	"google.golang.org/protobuf/proto"

	"github.com/gpuctl/gpuctl/api"
)

// fakeSource is a cluster whose answers a test changes between scrapes.
type fakeSource struct {
	nodes    []*api.NodeStatus
	jobs     []*api.Job
	stalls   []*api.Stall
	stallErr error
	shed     *api.TelemetryShed
	readOnly error
}

func (f *fakeSource) ReadOnly() error { return f.readOnly }

func (f *fakeSource) TelemetryShed() *api.TelemetryShed { return f.shed }

func (f *fakeSource) Nodes() []*api.NodeStatus { return f.nodes }
func (f *fakeSource) Jobs() []*api.Job         { return f.jobs }
func (f *fakeSource) Stalls(job string) ([]*api.Stall, error) {
	return f.stalls, f.stallErr
}

type clock struct{ t time.Time }

func (c *clock) now() time.Time { return c.t }

var t0 = time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)

func fixture() *fakeSource {
	gpus := func(n int, unhealthy, lost int) []*api.GPUStatus {
		var out []*api.GPUStatus
		for i := 0; i < n; i++ {
			g := &api.GPUStatus{Info: &api.GPUInfo{Index: uint32(i)}, Healthy: true, Last: &api.GPUSample{}}
			if i < unhealthy {
				g.Healthy = false
			}
			if i < lost {
				g.Last.Lost = true
			}
			out = append(out, g)
		}
		return out
	}
	return &fakeSource{
		nodes: []*api.NodeStatus{
			{Registration: &api.NodeRegistration{Name: "node-00"}, State: api.NodeState_NODE_STATE_READY, Gpus: gpus(8, 0, 0)},
			{Registration: &api.NodeRegistration{Name: "node-01"}, State: api.NodeState_NODE_STATE_READY, Cordoned: true, Gpus: gpus(8, 2, 1)},
			{Registration: &api.NodeRegistration{Name: "node-02"}, State: api.NodeState_NODE_STATE_DOWN, Cordoned: true, Draining: true, Gpus: gpus(8, 0, 0)},
			// A server before protocol v1.1 reports a cordon as a state.
			{Registration: &api.NodeRegistration{Name: "node-03"}, State: api.NodeState_NODE_STATE_DRAINING, Gpus: gpus(8, 0, 0)},
		},
		jobs: []*api.Job{
			{Id: "j-1a2b3c", Name: "ring", Tenant: "lab", State: api.JobState_JOB_STATE_RUNNING, Step: 100, LastCheckpointStep: 50,
				Plan:    &api.JobPlan{Tp: 1, Pp: 1, Dp: 4, StepSeconds: 0.1, MeasuredStepSeconds: 0.125},
				Goodput: 0.9, Restarts: 2, LostSteps: 17, CheckpointSeconds: 1.5, Checkpoints: 3, EnergyJoules: 4000, Co2EGrams: proto.Float64(0.4),
				StartUnixNano: t0.Add(-time.Hour).UnixNano(), FirstStartUnixNano: t0.Add(-2 * time.Hour).UnixNano()},
			{Id: "j-4d5e6f", Name: "fresh", State: api.JobState_JOB_STATE_RUNNING, Plan: &api.JobPlan{Tp: 1, Pp: 1, Dp: 2},
				StartUnixNano: t0.Add(-10 * time.Minute).UnixNano()},
			{Id: "j-777777", Name: "crash", State: api.JobState_JOB_STATE_FAILED, Plan: &api.JobPlan{Tp: 1, Pp: 1, Dp: 2}},
			{Id: "j-888888", Name: "waits", State: api.JobState_JOB_STATE_PENDING, Plan: &api.JobPlan{Tp: 8, Pp: 1, Dp: 8}},
		},
		stalls: []*api.Stall{{Job: "j-1a2b3c", Comm: 0x10}},
	}
}

func gather(t *testing.T, m *Metrics) map[string]*dto.MetricFamily {
	t.Helper()
	srv := httptest.NewServer(m.Handler())
	defer srv.Close()
	resp, err := http.Get(srv.URL)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != 200 {
		t.Fatalf("scrape: %s\n%s", resp.Status, body)
	}
	p := expfmt.NewTextParser(model.UTF8Validation)
	fams, err := p.TextToMetricFamilies(strings.NewReader(string(body)))
	if err != nil {
		t.Fatal(err)
	}
	return fams
}

// sample returns the value of name's series with labels, and whether
// there is one.
func sample(fams map[string]*dto.MetricFamily, name string, labels ...string) (float64, bool) {
next:
	for _, m := range fams[name].GetMetric() {
		have := map[string]string{}
		for _, l := range m.GetLabel() {
			have[l.GetName()] = l.GetValue()
		}
		for i := 0; i+1 < len(labels); i += 2 {
			if have[labels[i]] != labels[i+1] {
				continue next
			}
		}
		switch {
		case m.GetGauge() != nil:
			return m.GetGauge().GetValue(), true
		case m.GetCounter() != nil:
			return m.GetCounter().GetValue(), true
		case m.GetHistogram() != nil:
			return float64(m.GetHistogram().GetSampleCount()), true
		}
	}
	return 0, false
}

func TestClusterMetrics(t *testing.T) {
	src, c := fixture(), &clock{t: t0}
	m := New(src, Options{Now: c.now})
	m.ObserveSchedulerPass(3*time.Millisecond, 1)
	m.ObserveSchedulerPass(5*time.Millisecond, 2)
	m.ObserveRecoveryStep("validate", 4*time.Second)
	first := gather(t, m)

	// Ten seconds and 40 steps later, with a new checkpoint at step 150.
	c.t = t0.Add(10 * time.Second)
	src.jobs[0].Step, src.jobs[0].LastCheckpointStep = 140, 100
	c.t = t0.Add(10 * time.Second)
	second := gather(t, m)
	c.t = t0.Add(25 * time.Second)
	third := gather(t, m)

	tests := []struct {
		name   string
		fams   map[string]*dto.MetricFamily
		metric string
		labels []string
		want   float64
		absent bool
	}{
		{"ready nodes", first, "gpuctl_nodes", []string{"state", "ready"}, 3, false},
		{"down nodes", first, "gpuctl_nodes", []string{"state", "down"}, 1, false},
		{"cordoned, v1.0 draining state included", first, "gpuctl_nodes_cordoned", nil, 3, false},
		{"draining", first, "gpuctl_nodes_draining", nil, 2, false},
		{"node ready", first, "gpuctl_node_ready", []string{"Hostname", "node-02"}, 0, false},
		{"node cordoned", first, "gpuctl_node_cordoned", []string{"Hostname", "node-01"}, 1, false},
		{"healthy GPUs", first, "gpuctl_gpus", []string{"health", "healthy"}, 30, false},
		{"unhealthy GPUs", first, "gpuctl_gpus", []string{"health", "unhealthy"}, 1, false},
		{"lost GPUs", first, "gpuctl_gpus", []string{"health", "lost"}, 1, false},
		{"running jobs", first, "gpuctl_jobs", []string{"state", "running"}, 2, false},
		{"cancelled jobs (none, still a series)", first, "gpuctl_jobs", []string{"state", "cancelled"}, 0, false},
		{"job info", first, "gpuctl_job_info", []string{"hpc_job", "j-1a2b3c", "job_name", "ring", "tenant", "lab", "state", "running"}, 1, false},
		{"finished jobs have no job series", first, "gpuctl_job_info", []string{"hpc_job", "j-777777"}, 0, true},
		{"gpus", first, "gpuctl_job_gpus", []string{"hpc_job", "j-888888"}, 64, false},
		{"no rate from one reading", first, "gpuctl_job_steps_per_second", []string{"hpc_job", "j-1a2b3c"}, 0, false},
		{"step rate", second, "gpuctl_job_steps_per_second", []string{"hpc_job", "j-1a2b3c"}, 4, false},
		{"step stalled", third, "gpuctl_job_steps_per_second", []string{"hpc_job", "j-1a2b3c"}, 0, false},
		{"step", second, "gpuctl_job_step", []string{"hpc_job", "j-1a2b3c"}, 140, false},
		{"measured", first, "gpuctl_job_measured_step_seconds", []string{"hpc_job", "j-1a2b3c"}, 0.125, false},
		{"predicted", first, "gpuctl_job_predicted_step_seconds", []string{"hpc_job", "j-1a2b3c"}, 0.1, false},
		{"not predicted", first, "gpuctl_job_predicted_step_seconds", []string{"hpc_job", "j-4d5e6f"}, 0, true},
		{"goodput", first, "gpuctl_job_goodput_ratio", []string{"hpc_job", "j-1a2b3c"}, 0.9, false},
		{"restarts", first, "gpuctl_job_restarts_total", []string{"hpc_job", "j-1a2b3c"}, 2, false},
		{"lost steps", first, "gpuctl_job_lost_steps_total", []string{"hpc_job", "j-1a2b3c"}, 17, false},
		{"energy", first, "gpuctl_job_energy_joules_total", []string{"hpc_job", "j-1a2b3c"}, 4000, false},
		{"emissions", first, "gpuctl_job_co2e_grams_total", []string{"hpc_job", "j-1a2b3c"}, 0.4, false},
		{"no carbon-intensity source: no emissions series", first, "gpuctl_job_co2e_grams_total", []string{"hpc_job", "j-4d5e6f"}, 0, true},
		{"checkpoint age unknown at first sight", first, "gpuctl_job_checkpoint_age_seconds", []string{"hpc_job", "j-1a2b3c"}, 0, true},
		{"checkpoint age after a change", third, "gpuctl_job_checkpoint_age_seconds", []string{"hpc_job", "j-1a2b3c"}, 15, false},
		{"no checkpoint yet: age since start", first, "gpuctl_job_checkpoint_age_seconds", []string{"hpc_job", "j-4d5e6f"}, 600, false},
		{"checkpoint duration", first, "gpuctl_job_checkpoint_duration_seconds", []string{"hpc_job", "j-1a2b3c"}, 1.5, false},
		{"stalls", first, "gpuctl_stalls", nil, 1, false},
		{"stalled communicators", first, "gpuctl_job_stalled_communicators", []string{"hpc_job", "j-1a2b3c"}, 1, false},
		{"scheduler passes", first, "gpuctl_scheduler_pass_duration_seconds", nil, 2, false},
		{"queue", first, "gpuctl_scheduler_queue_length", nil, 2, false},
		{"recovery steps", first, "gpuctl_recovery_step_duration_seconds", []string{"step", "validate"}, 1, false},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got, ok := sample(tc.fams, tc.metric, tc.labels...)
			if tc.absent {
				if ok {
					t.Fatalf("%s%v = %g, want no series", tc.metric, tc.labels, got)
				}
				return
			}
			if !ok || got != tc.want {
				t.Fatalf("%s%v = %g (present %v), want %g", tc.metric, tc.labels, got, ok, tc.want)
			}
		})
	}
}

// TestStepRateRestart checks that a step going back (a restart from a
// checkpoint) starts a fresh reading instead of a negative rate.
func TestStepRateRestart(t *testing.T) {
	src, c := fixture(), &clock{t: t0}
	m := New(src, Options{Now: c.now})
	gather(t, m)
	c.t = t0.Add(2 * time.Second)
	src.jobs[0].Step = 60
	if v, _ := sample(gather(t, m), "gpuctl_job_steps_per_second", "hpc_job", "j-1a2b3c"); v != 0 {
		t.Fatalf("rate after restart = %g, want 0", v)
	}
	c.t = t0.Add(4 * time.Second)
	src.jobs[0].Step = 70
	if v, _ := sample(gather(t, m), "gpuctl_job_steps_per_second", "hpc_job", "j-1a2b3c"); v != 5 {
		t.Fatalf("rate = %g, want 5", v)
	}
}

// TestStoreReadOnly: gpuctl_store_readonly is 1 exactly while the
// control plane refuses changes.
func TestStoreReadOnly(t *testing.T) {
	src := fixture()
	m := New(src, Options{})
	if v, ok := sample(gather(t, m), "gpuctl_store_readonly"); !ok || v != 0 {
		t.Fatalf("gpuctl_store_readonly = %g (exported %v) with the store up, want 0", v, ok)
	}
	src.readOnly = errors.New("the store (etcd at http://127.0.0.1:2379) is unreachable")
	if v, _ := sample(gather(t, m), "gpuctl_store_readonly"); v != 1 {
		t.Fatalf("gpuctl_store_readonly = %g while read-only, want 1", v)
	}
	src.readOnly = nil
	if v, _ := sample(gather(t, m), "gpuctl_store_readonly"); v != 0 {
		t.Fatalf("gpuctl_store_readonly = %g once the store is back, want 0", v)
	}
}

// TestStallsError checks that a failing source fails the scrape loudly
// rather than exporting a wrong zero.
func TestStallsError(t *testing.T) {
	src := fixture()
	src.stallErr = errors.New("boom")
	srv := httptest.NewServer(New(src, Options{}).Handler())
	defer srv.Close()
	resp, err := http.Get(srv.URL)
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusInternalServerError || !strings.Contains(string(body), "list stalls: boom") {
		t.Fatalf("%s: %s", resp.Status, body)
	}
}

func TestNames(t *testing.T) {
	names := strings.Join(Names(), " ")
	for _, want := range []string{"gpuctl_nodes", "gpuctl_job_steps_per_second", "gpuctl_scheduler_pass_duration_seconds",
		"gpuctl_recovery_step_duration_seconds", "process_resident_memory_bytes"} {
		if !strings.Contains(" "+names+" ", " "+want+" ") {
			t.Errorf("Names() lacks %s: %s", want, names)
		}
	}
}

// slowSource is a fake source that runs the fail-slow analysis.
type slowSource struct {
	*fakeSource
	sl Slowness
}

func (s slowSource) Slowness() Slowness { return s.sl }

// The fail-slow figures: findings by class, each rank's lateness, each
// job's slowdown; a source without the analysis exports none of them.
func TestSlownessMetrics(t *testing.T) {
	c := &clock{t: t0}
	src := slowSource{fakeSource: fixture(), sl: Slowness{
		Findings: map[string]int{"compute-slow": 1, "communication-slow": 0, "job-wide": 0},
		Quiet:    map[string]int{"communication-slow": 1},
		Lateness: map[string]map[int32]float64{"j-1a2b3c": {0: 0.001, 3: 0.042}},
		Slowdown: map[string]float64{"j-1a2b3c": 1.4},
	}}
	src.jobs[0].SlowExclusionsUnixNano = []int64{t0.UnixNano()}
	fams := gather(t, New(src, Options{Now: c.now}))
	for _, w := range []struct {
		name   string
		labels []string
		want   float64
	}{
		{"gpuctl_slow_findings", []string{"class", "compute-slow"}, 1},
		{"gpuctl_slow_findings", []string{"class", "job-wide"}, 0},
		{"gpuctl_slow_findings_quiet", []string{"class", "communication-slow"}, 1},
		{"gpuctl_slow_findings_quiet", []string{"class", "compute-slow"}, 0},
		{"gpuctl_job_slow_exclusions_total", []string{"hpc_job", "j-1a2b3c"}, 1},
		{"gpuctl_rank_lateness_seconds", []string{"hpc_job", "j-1a2b3c", "rank", "3"}, 0.042},
		{"gpuctl_rank_lateness_seconds", []string{"hpc_job", "j-1a2b3c", "rank", "0"}, 0.001},
		{"gpuctl_job_slowdown_ratio", []string{"hpc_job", "j-1a2b3c"}, 1.4},
	} {
		if v, ok := sample(fams, w.name, w.labels...); !ok || v != w.want {
			t.Errorf("%s%v = %v (present %v), want %v", w.name, w.labels, v, ok, w.want)
		}
	}
	plain := gather(t, New(fixture(), Options{Now: c.now}))
	if _, ok := plain["gpuctl_slow_findings"]; ok {
		t.Errorf("a source without the fail-slow analysis exported gpuctl_slow_findings")
	}
}
