// Package metrics exports the cluster as gpuctl serve sees it to
// Prometheus: nodes, GPUs and jobs by state, each live job's progress
// (step rate, measured and predicted step time, goodput, restarts, lost
// steps, checkpoint age), NCCL stalls, and the latencies of the
// scheduler's passes and recovery's steps. It reads the server through
// Source, so it depends on nothing of the control plane but its answers.
package metrics

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"regexp"
	"sort"
	"strconv"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/gpuctl/gpuctl/api"
)

// Source is what the exporter reads at every scrape; *controlplane.Server
// implements it.
type Source interface {
	Nodes() []*api.NodeStatus
	Jobs() []*api.Job
	Stalls(job string) ([]*api.Stall, error)
	// TelemetryShed is what the server's ingest dropped to keep up.
	TelemetryShed() *api.TelemetryShed
	// ReadOnly is why the control plane refuses changes now (its store
	// is unreachable), nil while it does not.
	ReadOnly() error
}

// Slowness is what the fail-slow analysis says now.
type Slowness struct {
	// Findings counts the findings standing now by class (every class
	// present, zero included).
	Findings map[string]int
	// Quiet counts, by class, the findings standing now that an operator
	// acknowledged or silenced (not in Findings).
	Quiet map[string]int
	// Lateness is each running job's ranks' rolling lateness in seconds:
	// how far after the median of their peers they enter collectives.
	Lateness map[string]map[int32]float64
	// Slowdown is each running job's step time over its baseline.
	Slowdown map[string]float64
}

// SlowSource is a Source that runs the fail-slow analysis; the exporter
// reads it when the Source offers it.
type SlowSource interface {
	Slowness() Slowness
}

// Metrics is the server's exporter: a Prometheus collector over a Source,
// and the observer of what is not state (scheduler passes, recovery
// steps).
type Metrics struct {
	src Source
	now func() time.Time
	reg *prometheus.Registry

	schedPass *prometheus.HistogramVec
	queue     prometheus.Gauge
	recovery  *prometheus.HistogramVec

	mu    sync.Mutex
	steps map[string]*stepReading // by job id
	ckpts map[string]*ckptReading
}

// stepReading is a job's step at one scrape, and the rate between the
// last two scrapes at which it moved or a window passed.
type stepReading struct {
	step int64
	at   time.Time
	rate float64
	seen time.Time
}

// ckptReading is when a job's last checkpoint step was first seen at its
// current value.
type ckptReading struct {
	step    int64
	changed time.Time // zero until seen to change
	seen    time.Time
}

// Options tune an exporter; the zero value is the default.
type Options struct {
	// Now is the clock, time.Now by default (tests inject theirs).
	Now func() time.Time
}

// New returns the exporter of src. Its Handler serves it; the server calls
// ObserveSchedulerPass and ObserveRecoveryStep as those happen.
func New(src Source, opts Options) *Metrics {
	if opts.Now == nil {
		opts.Now = time.Now
	}
	m := &Metrics{
		src: src, now: opts.Now, reg: prometheus.NewRegistry(),
		schedPass: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "gpuctl_scheduler_pass_duration_seconds",
			Help:    "Time one scheduling pass took: snapshot, policy, placement.",
			Buckets: prometheus.ExponentialBuckets(50e-6, 4, 10),
		}, nil),
		queue: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "gpuctl_scheduler_queue_length",
			Help: "Jobs waiting in the queue after the last scheduling pass.",
		}),
		recovery: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "gpuctl_recovery_step_duration_seconds",
			Help:    "Time each recovery step took (stop, validate, relaunch, …), per step.",
			Buckets: prometheus.ExponentialBuckets(0.1, 2, 12),
		}, []string{"step"}),
		steps: map[string]*stepReading{}, ckpts: map[string]*ckptReading{},
	}
	m.reg.MustRegister(m, m.schedPass, m.queue, m.recovery,
		collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}), collectors.NewGoCollector())
	return m
}

// ObserveSchedulerPass records one scheduling pass: how long it took and
// how many jobs it left queued.
func (m *Metrics) ObserveSchedulerPass(d time.Duration, queued int) {
	m.schedPass.WithLabelValues().Observe(d.Seconds())
	m.queue.Set(float64(queued))
}

// ObserveRecoveryStep records one recovery step (as its recovery event
// names it) and how long it took.
func (m *Metrics) ObserveRecoveryStep(step string, d time.Duration) {
	m.recovery.WithLabelValues(step).Observe(d.Seconds())
}

// Handler serves the exporter for Prometheus, in OpenMetrics when the
// scraper asks for it.
func (m *Metrics) Handler() http.Handler {
	return promhttp.HandlerFor(m.reg, promhttp.HandlerOpts{EnableOpenMetrics: true})
}

// Serve listens on addr (TCP) and serves Handler at /metrics until ctx
// ends. It returns once the address is bound, with the bound address, so
// a taken port is an error at start.
func (m *Metrics) Serve(ctx context.Context, addr string, log *slog.Logger) (net.Addr, error) {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("metrics: %w", err)
	}
	mux := http.NewServeMux()
	mux.Handle("/metrics", m.Handler())
	srv := &http.Server{Handler: mux, ReadHeaderTimeout: 5 * time.Second}
	go func() {
		if err := srv.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) && log != nil {
			log.Error("metrics endpoint", "addr", addr, "err", err)
		}
	}()
	context.AfterFunc(ctx, func() { srv.Close() })
	return ln.Addr(), nil
}

var (
	jobLabels = []string{"hpc_job"}

	nodesDesc         = prometheus.NewDesc("gpuctl_nodes", "Nodes by liveness: ready or down.", []string{"state"}, nil)
	nodesCordonedDesc = prometheus.NewDesc("gpuctl_nodes_cordoned", "Nodes that take no new work (cordoned, draining included).", nil, nil)
	nodesDrainingDesc = prometheus.NewDesc("gpuctl_nodes_draining", "Cordoned nodes whose jobs are being moved elsewhere.", nil, nil)
	nodeReadyDesc     = prometheus.NewDesc("gpuctl_node_ready", "1 while the node is ready, 0 while it is down.", []string{"Hostname"}, nil)
	nodeCordonedDesc  = prometheus.NewDesc("gpuctl_node_cordoned", "1 while the node takes no new work.", []string{"Hostname"}, nil)
	gpusDesc          = prometheus.NewDesc("gpuctl_gpus", "GPUs by health: healthy, unhealthy (an XID, ECC or other fault) or lost (off the bus).", []string{"health"}, nil)
	jobsDesc          = prometheus.NewDesc("gpuctl_jobs", "Jobs by state.", []string{"state"}, nil)
	stallsDesc        = prometheus.NewDesc("gpuctl_stalls", "NCCL stalls declared now (one per stalled communicator).", nil, nil)
	readOnlyDesc      = prometheus.NewDesc("gpuctl_store_readonly", "1 while the control plane refuses every change because it cannot write its store (etcd unreachable, or its election key lost and campaigning again); running jobs and node sessions go on.", nil, nil)
	paceDesc          = prometheus.NewDesc("gpuctl_telemetry_pace", "How many times less often than their own interval nodes are asked to send telemetry while the server's ingest is behind (1: their own pace).", nil, nil)
	shedDesc          = prometheus.NewDesc("gpuctl_telemetry_shed_total", "Telemetry the server dropped unapplied because its ingest fell behind: GPU samples first, then whole batches (with their NCCL call records); its nodes stay up.", []string{"kind"}, nil)

	jobInfoDesc      = prometheus.NewDesc("gpuctl_job_info", "1 for every job not finished, with its name, tenant and state.", []string{"hpc_job", "job_name", "tenant", "state"}, nil)
	jobGPUsDesc      = prometheus.NewDesc("gpuctl_job_gpus", "GPUs of the job's plan (tp·pp·dp).", jobLabels, nil)
	jobStepDesc      = prometheus.NewDesc("gpuctl_job_step", "The last training step the job's rank 0 reported.", jobLabels, nil)
	jobRateDesc      = prometheus.NewDesc("gpuctl_job_steps_per_second", "Training steps per second, from successive step readings.", jobLabels, nil)
	jobMeasuredDesc  = prometheus.NewDesc("gpuctl_job_measured_step_seconds", "Seconds per step as measured on the running job.", jobLabels, nil)
	jobPredictedDesc = prometheus.NewDesc("gpuctl_job_predicted_step_seconds", "Seconds per step the cost model predicted for the job's plan.", jobLabels, nil)
	jobGoodputDesc   = prometheus.NewDesc("gpuctl_job_goodput_ratio", "Useful step time over wall time since the job first started.", jobLabels, nil)
	jobRestartsDesc  = prometheus.NewDesc("gpuctl_job_restarts_total", "Automatic restarts after failures.", jobLabels, nil)
	jobSlowExclDesc  = prometheus.NewDesc("gpuctl_job_slow_exclusions_total", "Automatic restarts without a node a fail-slow finding blamed (slow_recovery auto).", jobLabels, nil)
	jobPreemptDesc   = prometheus.NewDesc("gpuctl_job_preemptions_total", "Times the scheduler preempted the job.", jobLabels, nil)
	jobLostDesc      = prometheus.NewDesc("gpuctl_job_lost_steps_total", "Steps redone after restarts (run past the checkpoint resumed from).", jobLabels, nil)
	jobDowntimeDesc  = prometheus.NewDesc("gpuctl_job_downtime_seconds_total", "Seconds the job was not running since it first started.", jobLabels, nil)
	jobEnergyDesc    = prometheus.NewDesc("gpuctl_job_energy_joules_total", "Energy of the job's GPUs (NVML energy counters).", jobLabels, nil)
	jobCO2eDesc      = prometheus.NewDesc("gpuctl_job_co2e_grams_total", "Emissions of the job's GPU energy at its nodes' carbon intensity; absent without a carbon-intensity source for all of it.", jobLabels, nil)
	jobCkptsDesc     = prometheus.NewDesc("gpuctl_job_checkpoints_total", "Checkpoints the job's ranks reported.", jobLabels, nil)
	jobCkptAgeDesc   = prometheus.NewDesc("gpuctl_job_checkpoint_age_seconds", "Seconds since the job's last checkpoint step changed (since its first start while it has none); absent until seen.", jobLabels, nil)
	jobCkptTimeDesc  = prometheus.NewDesc("gpuctl_job_checkpoint_duration_seconds", "Mean seconds a checkpoint of the job takes.", jobLabels, nil)
	jobAdvisedDesc   = prometheus.NewDesc("gpuctl_job_advised_checkpoint_interval_seconds", "Young–Daly checkpoint interval advised from checkpoint time and the cluster's failure rate.", jobLabels, nil)
	jobStalledDesc   = prometheus.NewDesc("gpuctl_job_stalled_communicators", "The job's communicators with an NCCL stall declared now.", jobLabels, nil)
	slowFindingsDesc = prometheus.NewDesc("gpuctl_slow_findings", "Fail-slow findings standing now and alerting (neither acknowledged nor silenced), by class (compute-slow, communication-slow, job-wide).", []string{"class"}, nil)
	slowQuietDesc    = prometheus.NewDesc("gpuctl_slow_findings_quiet", "Fail-slow findings standing now that an operator acknowledged or silenced, by class.", []string{"class"}, nil)
	rankLatenessDesc = prometheus.NewDesc("gpuctl_rank_lateness_seconds", "How far after the median of its peers the rank enters collectives (a rolling average).", []string{"hpc_job", "rank"}, nil)
	jobSlowdownDesc  = prometheus.NewDesc("gpuctl_job_slowdown_ratio", "The job's step time (the cadence of its busiest communicator) over its baseline.", jobLabels, nil)

	stateDescs = []*prometheus.Desc{nodesDesc, nodesCordonedDesc, nodesDrainingDesc, nodeReadyDesc, nodeCordonedDesc, gpusDesc, jobsDesc,
		stallsDesc, readOnlyDesc, shedDesc, paceDesc, jobInfoDesc, jobGPUsDesc, jobStepDesc, jobRateDesc, jobMeasuredDesc, jobPredictedDesc, jobGoodputDesc,
		jobRestartsDesc, jobSlowExclDesc, jobPreemptDesc, jobLostDesc, jobDowntimeDesc, jobEnergyDesc, jobCO2eDesc, jobCkptsDesc, jobCkptAgeDesc, jobCkptTimeDesc,
		jobAdvisedDesc, jobStalledDesc, slowFindingsDesc, slowQuietDesc, rankLatenessDesc, jobSlowdownDesc}
)

// Describe implements prometheus.Collector.
func (m *Metrics) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range stateDescs {
		ch <- d
	}
}

// Liveness is a node's liveness, ready or down, and whether it takes new
// work, from protocol v1.1's fields or, for a server that still reports
// cordoned and draining as states, from those.
func Liveness(n *api.NodeStatus) (state string, cordoned, draining bool) {
	cordoned, draining = n.GetCordoned(), n.GetDraining()
	switch n.GetState() {
	case api.NodeState_NODE_STATE_DOWN:
		return "down", cordoned, draining
	case api.NodeState_NODE_STATE_CORDONED:
		return "ready", true, draining
	case api.NodeState_NODE_STATE_DRAINING:
		return "ready", true, true
	}
	return "ready", cordoned || draining, draining
}

var jobStates = []api.JobState{api.JobState_JOB_STATE_PENDING, api.JobState_JOB_STATE_RUNNING, api.JobState_JOB_STATE_RECOVERING,
	api.JobState_JOB_STATE_SUCCEEDED, api.JobState_JOB_STATE_FAILED, api.JobState_JOB_STATE_CANCELLED}

// JobStateName is a job state as metrics and scripts name it.
func JobStateName(s api.JobState) string { return s.Short() }

// rateWindow is the least time between two step readings a rate is taken
// over, so two scrapes close together do not make a noisy rate.
const rateWindow = time.Second

// Collect implements prometheus.Collector.
func (m *Metrics) Collect(ch chan<- prometheus.Metric) {
	now := m.now()
	gauge := func(d *prometheus.Desc, v float64, l ...string) {
		ch <- prometheus.MustNewConstMetric(d, prometheus.GaugeValue, v, l...)
	}
	counter := func(d *prometheus.Desc, v float64, l ...string) {
		ch <- prometheus.MustNewConstMetric(d, prometheus.CounterValue, v, l...)
	}

	byState := map[string]int{"ready": 0, "down": 0}
	var cordoned, draining int
	health := map[string]int{"healthy": 0, "unhealthy": 0, "lost": 0}
	for _, n := range m.src.Nodes() {
		name := n.GetRegistration().GetName()
		state, c, d := Liveness(n)
		byState[state]++
		gauge(nodeReadyDesc, boolValue(state == "ready"), name)
		gauge(nodeCordonedDesc, boolValue(c), name)
		if c {
			cordoned++
		}
		if d {
			draining++
		}
		for _, g := range n.GetGpus() {
			switch {
			case g.GetLast().GetLost():
				health["lost"]++
			case !g.GetHealthy():
				health["unhealthy"]++
			default:
				health["healthy"]++
			}
		}
	}
	for _, s := range sortedKeys(byState) {
		gauge(nodesDesc, float64(byState[s]), s)
	}
	gauge(nodesCordonedDesc, float64(cordoned))
	gauge(nodesDrainingDesc, float64(draining))
	for _, h := range sortedKeys(health) {
		gauge(gpusDesc, float64(health[h]), h)
	}

	readOnly := 0.0
	if m.src.ReadOnly() != nil {
		readOnly = 1
	}
	gauge(readOnlyDesc, readOnly)

	shed := m.src.TelemetryShed()
	counter(shedDesc, float64(shed.GetBatches()), "batches")
	counter(shedDesc, float64(shed.GetGpuSamples()), "gpu_samples")
	counter(shedDesc, float64(shed.GetCollectives()), "collectives")
	gauge(paceDesc, float64(max(shed.GetPace(), 1)))

	stalls, err := m.src.Stalls("")
	if err != nil {
		ch <- prometheus.NewInvalidMetric(stallsDesc, fmt.Errorf("list stalls: %w", err))
	} else {
		gauge(stallsDesc, float64(len(stalls)))
	}
	stalledComms := map[string]int{}
	for _, s := range stalls {
		stalledComms[s.GetJob()]++
	}
	if ss, ok := m.src.(SlowSource); ok {
		sl := ss.Slowness()
		for class, n := range sl.Findings {
			gauge(slowFindingsDesc, float64(n), class)
			gauge(slowQuietDesc, float64(sl.Quiet[class]), class)
		}
		for job, ranks := range sl.Lateness {
			for r, sec := range ranks {
				gauge(rankLatenessDesc, sec, job, strconv.Itoa(int(r)))
			}
		}
		for job, v := range sl.Slowdown {
			gauge(jobSlowdownDesc, v, job)
		}
	}

	jobs := m.src.Jobs()
	counts := map[api.JobState]int{}
	live := map[string]bool{}
	m.mu.Lock()
	defer m.mu.Unlock()
	for _, j := range jobs {
		counts[j.GetState()]++
		if j.GetState().Ended() {
			continue
		}
		id := j.GetId()
		live[id] = true
		p := j.GetPlan()
		gauge(jobInfoDesc, 1, id, j.GetName(), j.GetTenant(), JobStateName(j.GetState()))
		gauge(jobGPUsDesc, float64(p.GPUs()), id)
		gauge(jobStepDesc, float64(j.GetStep()), id)
		gauge(jobRateDesc, m.stepRate(id, j.GetStep(), now), id)
		if v := p.GetMeasuredStepSeconds(); v > 0 {
			gauge(jobMeasuredDesc, v, id)
		}
		if v := p.GetStepSeconds(); v > 0 {
			gauge(jobPredictedDesc, v, id)
		}
		gauge(jobGoodputDesc, j.GetGoodput(), id)
		counter(jobRestartsDesc, float64(j.GetRestarts()), id)
		counter(jobSlowExclDesc, float64(len(j.GetSlowExclusionsUnixNano())), id)
		counter(jobPreemptDesc, float64(j.GetPreemptions()), id)
		counter(jobLostDesc, float64(j.GetLostSteps()), id)
		counter(jobDowntimeDesc, j.GetDowntimeSeconds(), id)
		counter(jobEnergyDesc, j.GetEnergyJoules(), id)
		if j.Co2EGrams != nil {
			counter(jobCO2eDesc, j.GetCo2EGrams(), id)
		}
		counter(jobCkptsDesc, float64(j.GetCheckpoints()), id)
		if age, ok := m.checkpointAge(j, now); ok {
			gauge(jobCkptAgeDesc, age, id)
		}
		if v := j.GetCheckpointSeconds(); v > 0 {
			gauge(jobCkptTimeDesc, v, id)
		}
		if v := j.GetAdvisedCheckpointIntervalSeconds(); v > 0 {
			gauge(jobAdvisedDesc, v, id)
		}
		gauge(jobStalledDesc, float64(stalledComms[id]), id)
	}
	for _, s := range jobStates {
		gauge(jobsDesc, float64(counts[s]), JobStateName(s))
	}
	// Forget jobs that finished or went away.
	for id := range m.steps {
		if !live[id] {
			delete(m.steps, id)
		}
	}
	for id := range m.ckpts {
		if !live[id] {
			delete(m.ckpts, id)
		}
	}
}

// stepRate returns the job's steps per second between the reading kept
// from an earlier scrape and this one; the reading moves on once
// rateWindow has passed. A step that went back (a restart from a
// checkpoint) starts a new reading.
func (m *Metrics) stepRate(id string, step int64, now time.Time) float64 {
	r := m.steps[id]
	if r == nil || step < r.step {
		m.steps[id] = &stepReading{step: step, at: now}
		return 0
	}
	if d := now.Sub(r.at); d >= rateWindow {
		r.rate = float64(step-r.step) / d.Seconds()
		r.step, r.at = step, now
	}
	return r.rate
}

// checkpointAge is now less the time the job's checkpoint step was seen
// to change; while the job has no checkpoint, now less its first start.
// A checkpoint already there when the exporter first saw the job has no
// known time: no age until the next one.
func (m *Metrics) checkpointAge(j *api.Job, now time.Time) (float64, bool) {
	step := j.GetLastCheckpointStep()
	c := m.ckpts[j.GetId()]
	if c == nil {
		c = &ckptReading{step: step}
		m.ckpts[j.GetId()] = c
	} else if step != c.step {
		c.step, c.changed = step, now
	}
	switch {
	case !c.changed.IsZero():
		return now.Sub(c.changed).Seconds(), true
	case step == 0 && j.GetFirstStartUnixNano() > 0:
		return now.Sub(time.Unix(0, j.GetFirstStartUnixNano())).Seconds(), true
	case step == 0 && j.GetStartUnixNano() > 0:
		return now.Sub(time.Unix(0, j.GetStartUnixNano())).Seconds(), true
	}
	return 0, false
}

func boolValue(b bool) float64 {
	if b {
		return 1
	}
	return 0
}

func sortedKeys(m map[string]int) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	sort.Strings(out)
	return out
}

var fqName = regexp.MustCompile(`fqName: "([^"]+)"`)

// Names lists the metric names the exporter serves (histograms by their
// family name), for checking dashboards and alerts against.
func Names() []string {
	m := New(emptySource{}, Options{})
	seen := map[string]bool{}
	ch := make(chan *prometheus.Desc, 64)
	go func() {
		for _, c := range []prometheus.Collector{m, m.schedPass, m.queue, m.recovery} {
			c.Describe(ch)
		}
		close(ch)
	}()
	for d := range ch {
		if s := fqName.FindStringSubmatch(d.String()); s != nil {
			seen[s[1]] = true
		}
	}
	// The process and Go runtime collectors always have samples.
	if fams, err := m.reg.Gather(); err == nil {
		for _, f := range fams {
			seen[f.GetName()] = true
		}
	}
	out := make([]string, 0, len(seen))
	for n := range seen {
		out = append(out, n)
	}
	sort.Strings(out)
	return out
}

type emptySource struct{}

func (emptySource) Nodes() []*api.NodeStatus            { return nil }
func (emptySource) Jobs() []*api.Job                    { return nil }
func (emptySource) Stalls(string) ([]*api.Stall, error) { return nil, nil }
func (emptySource) TelemetryShed() *api.TelemetryShed   { return nil }
func (emptySource) ReadOnly() error                     { return nil }
