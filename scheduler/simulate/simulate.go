// Package simulate replays a job trace through the scheduler in virtual
// time: a discrete-event simulation that calls the same scheduler.Schedule,
// policies and placer the control plane uses, on a synthetic cluster.
//
// Failures: a trace job's Failures are execution offsets at which an
// attempt died. Jobs checkpoint every CheckpointInterval seconds of running
// (default 30 min); a failure loses the work since the attempt's last
// checkpoint and requeues the job, which resumes from that checkpoint. A
// trace's Runtime is its recorded execution, failed attempts included, so
// the job's failure-free work is Runtime minus what each recorded failure
// lost under the same checkpoint model: replayed without interruption, a
// job spends exactly the trace's recorded GPU time. A preempted job that
// checkpoints loses nothing; it checkpoints within the policy's grace.
package simulate

import (
	"cmp"
	"container/heap"
	"errors"
	"fmt"
	"hash/fnv"
	"math"
	"slices"

	"github.com/gpuctl/gpuctl/scheduler"
	"github.com/gpuctl/gpuctl/scheduler/carbon"
	"github.com/gpuctl/gpuctl/scheduler/predict"
	"github.com/gpuctl/gpuctl/scheduler/trace"
)

// Config is one simulation.
type Config struct {
	// Nodes and GPUsPerNode size the cluster; Nodes 0 picks ClusterSize.
	Nodes, GPUsPerNode int
	// RackSize is nodes per rack (default 32); RacksPerSwitch racks share
	// a switch (default 4).
	RackSize, RacksPerSwitch int
	Policy                   scheduler.Policy
	// CheckpointInterval is seconds of running between checkpoints
	// (default 1800).
	CheckpointInterval int64
	// Tenants assigns jobs without a tenant to this many synthetic tenants
	// by a hash of the job id (0: leave them all in one).
	Tenants int
	// NoEstimates hides runtimes from the scheduler; otherwise each job's
	// estimate is its exact remaining failure-free work, or, with
	// Estimate, what that says of the job (a runtime model's prediction,
	// a user's limit), less what the job has run (predict.Remaining).
	NoEstimates bool
	Estimate    func(trace.Job) int64
	// Sites labels the nodes site=<name>: the cluster is cut into
	// len(Sites) equal runs of nodes in name order, one per site.
	Sites []string
	// Intensity is the carbon intensity by node label, for the emissions
	// the result reports (and for a carbon-aware Policy to decide on).
	// Virtual time 0 is 00:00 UTC of the curves' day.
	Intensity *carbon.Intensities
	// Deferrable is the fraction of jobs made deferrable, chosen by a hash
	// of Seed and the job id; each must finish by its submit time plus its
	// work plus DeferSlack (default 12 h).
	Deferrable float64
	DeferSlack int64
	Seed       uint64
	// GPUPowerKW is a busy GPU's draw (default 0.7 kW, an H100 SXM's TDP).
	GPUPowerKW float64
	// Mix, when set, makes the cluster heterogeneous and lets every job
	// run on any of its models at its rate there.
	Mix *Mix
}

// Result is what a simulation measured. Times are seconds.
type Result struct {
	Policy            string
	Nodes, GPUs       int
	Jobs              int
	Makespan          int64
	MeanJCT           float64
	P50JCT            float64
	P95JCT            float64
	P99JCT            float64
	MeanQueue         float64
	Utilization       float64
	Restarts          int
	Preemptions       int
	LostGPUHours      float64
	Events            int
	SchedulingPasses  int
	BackfilledStarts  int
	CheckpointSeconds int64
	// EnergyKWh is busy GPUs' energy; KgCO2e its emissions under
	// Intensity (GPUs on nodes without a curve add energy only).
	EnergyKWh float64
	KgCO2e    float64
	// DeferrableKgCO2e is the part of KgCO2e the deferrable jobs emitted.
	DeferrableKgCO2e float64
	// DeferrableJobs were made deferrable; Holds counts the holds the
	// policy decided; MissedDeadlines counts deferrable jobs that ended
	// after their deadline.
	DeferrableJobs  int
	Holds           int
	MissedDeadlines int
	// Fairness is Jain's index of the jobs' normalised rates (the job's
	// work at its fastest model's speed over its JCT, 1 for a job that
	// never waits and runs on its best model): 1 when every job gets the
	// same share of its best.
	Fairness float64
	// BestTypeShare is the fraction of GPU-seconds run on the job's
	// fastest model (1 without a Mix).
	BestTypeShare float64
}

// ClusterSize is the default cluster for a trace: the smallest number of
// nodes on which every job fits and whose GPUs cover the trace's mean
// offered load (recorded GPU-seconds over the submission span), so the
// queue stays bounded over the trace while the cluster is still busy.
func ClusterSize(jobs []trace.Job, gpusPerNode int) int {
	if gpusPerNode < 1 || len(jobs) == 0 {
		return 0
	}
	var maxG int
	var gpuSec float64
	first, last := jobs[0].Submit, jobs[0].Submit
	for _, j := range jobs {
		maxG = max(maxG, j.GPUs)
		gpuSec += float64(j.GPUs) * float64(j.Runtime)
		first, last = min(first, j.Submit), max(last, j.Submit)
	}
	nodes := (maxG + gpusPerNode - 1) / gpusPerNode
	if span := last - first; span > 0 {
		load := gpuSec / float64(span)
		nodes = max(nodes, int(math.Ceil(load/float64(gpusPerNode))))
	}
	return nodes
}

// NewCluster builds nodes named node0000… with H100 GPUs, racks of
// rackSize nodes and racksPerSwitch racks per switch, and, with sites
// given, a site label cutting the nodes into equal runs.
func NewCluster(nodes, gpusPerNode, rackSize, racksPerSwitch int, sites ...string) []scheduler.Node {
	out := make([]scheduler.Node, nodes)
	for i := range out {
		rack := i / rackSize
		n := scheduler.Node{
			Name:     fmt.Sprintf("node%04d", i),
			Labels:   map[string]string{scheduler.LabelRack: fmt.Sprintf("rack%03d", rack), scheduler.LabelSwitch: fmt.Sprintf("sw%02d", rack/racksPerSwitch)},
			GPUModel: "H100",
			GPUs:     make([]scheduler.GPU, gpusPerNode),
		}
		for g := range n.GPUs {
			n.GPUs[g] = scheduler.GPU{Index: g, Healthy: true}
		}
		if len(sites) > 0 {
			n.Labels[LabelSite] = sites[i*len(sites)/nodes]
		}
		out[i] = n
	}
	return out
}

// LabelSite is the node label Config.Sites sets.
const LabelSite = "site"

type eventKind int

const (
	evEnd eventKind = iota // finish or failure of an attempt
	evStop
	evArrive
	evWake // a held job's cleaner window starts
)

type event struct {
	at      int64
	kind    eventKind
	job     int
	attempt int
	seq     int
}

type eventHeap []event

func (h eventHeap) Len() int { return len(h) }
func (h eventHeap) Less(i, j int) bool {
	a, b := h[i], h[j]
	if a.at != b.at {
		return a.at < b.at
	}
	if a.kind != b.kind {
		return a.kind < b.kind
	}
	return a.seq < b.seq
}
func (h eventHeap) Swap(i, j int) { h[i], h[j] = h[j], h[i] }
func (h *eventHeap) Push(x any)   { *h = append(*h, x.(event)) }
func (h *eventHeap) Pop() any {
	old := *h
	e := old[len(old)-1]
	*h = old[:len(old)-1]
	return e
}

// sjob is a job's simulation state.
type sjob struct {
	tj       trace.Job
	work     int64 // failure-free work, seconds
	progress int64 // work saved at the last checkpoint
	exec     int64 // execution so far, failed and preempted attempts included
	nextFail int
	attained float64

	attempt    int
	running    bool
	failing    bool // the current attempt ends in a failure
	start      int64
	firstStart int64
	finish     int64
	placement  scheduler.Placement
	checkpoint bool  // a stop checkpoints first
	until      int64 // deferrable: finish by; 0 when not
	wakeAt     int64 // the pending wake event, when held

	rates     []float64 // per Mix model; nil without a Mix
	speed     float64   // work per second on the current attempt's model
	startedOn string    // the model of the first attempt
}

// sim is the simulation's mutable world.
type sim struct {
	cfg    Config
	jobs   []sjob
	snap   scheduler.Snapshot
	nodeIx map[string]int
	runIx  map[int]int // job → index in snap.Running
	penIx  map[int]int // job → index in snap.Pending
	byID   map[string]int
	events eventHeap
	seq    int
	res    Result
	busy   float64         // GPU-seconds of running
	onBest float64         // GPU-seconds on the job's fastest model
	curves []*carbon.Curve // by node index; nil where none applies
}

// Run simulates the jobs under cfg.
func Run(jobs []trace.Job, cfg Config) (Result, error) {
	if len(jobs) == 0 {
		return Result{}, errors.New("simulate: the trace has no jobs")
	}
	if cfg.Policy == nil {
		return Result{}, errors.New("simulate: no policy; pick one with scheduler.PolicyByName")
	}
	if cfg.GPUsPerNode < 1 {
		return Result{}, fmt.Errorf("simulate: %d GPUs per node; need at least 1", cfg.GPUsPerNode)
	}
	if cfg.Nodes == 0 {
		cfg.Nodes = ClusterSize(jobs, cfg.GPUsPerNode)
	}
	if cfg.Nodes < 1 {
		return Result{}, fmt.Errorf("simulate: %d nodes; need at least 1", cfg.Nodes)
	}
	cfg.RackSize = cmp.Or(cfg.RackSize, 32)
	cfg.RacksPerSwitch = cmp.Or(cfg.RacksPerSwitch, 4)
	cfg.CheckpointInterval = cmp.Or(cfg.CheckpointInterval, 1800)
	if cfg.CheckpointInterval < 0 {
		return Result{}, fmt.Errorf("simulate: negative checkpoint interval %d", cfg.CheckpointInterval)
	}
	cfg.DeferSlack = cmp.Or(cfg.DeferSlack, 12*3600)
	cfg.GPUPowerKW = cmp.Or(cfg.GPUPowerKW, 0.7)
	if cfg.Deferrable < 0 || cfg.Deferrable > 1 {
		return Result{}, fmt.Errorf("simulate: deferrable fraction %g; give 0 to 1", cfg.Deferrable)
	}
	total := cfg.Nodes * cfg.GPUsPerNode
	s := &sim{
		cfg:    cfg,
		jobs:   make([]sjob, len(jobs)),
		nodeIx: map[string]int{},
		runIx:  map[int]int{},
		penIx:  map[int]int{},
		byID:   map[string]int{},
	}
	s.snap.Nodes = NewCluster(cfg.Nodes, cfg.GPUsPerNode, cfg.RackSize, cfg.RacksPerSwitch, cfg.Sites...)
	if m := cfg.Mix; m != nil {
		if len(m.Models) < 2 || m.Rates == nil {
			return Result{}, errors.New("simulate: a mixed cluster needs two or more models and the jobs' rates on them")
		}
		for i := range s.snap.Nodes {
			s.snap.Nodes[i].GPUModel = m.Models[i*len(m.Models)/len(s.snap.Nodes)]
		}
	}
	s.curves = make([]*carbon.Curve, len(s.snap.Nodes))
	for i, n := range s.snap.Nodes {
		s.nodeIx[n.Name] = i
		s.curves[i] = cfg.Intensity.Curve(n.Labels)
	}
	for i, tj := range jobs {
		if tj.GPUs > total {
			return Result{}, fmt.Errorf("simulate: job %s needs %d GPUs but the cluster has %d; use more nodes", tj.ID, tj.GPUs, total)
		}
		if m := cfg.Mix; m != nil && tj.GPUs > total/len(m.Models) {
			return Result{}, fmt.Errorf("simulate: job %s needs %d GPUs but each model has %d; use more nodes", tj.ID, tj.GPUs, total/len(m.Models))
		}
		if _, dup := s.byID[tj.ID]; dup {
			return Result{}, fmt.Errorf("simulate: job id %s appears twice", tj.ID)
		}
		s.byID[tj.ID] = i
		s.jobs[i] = sjob{tj: tj, work: s.failureFreeWork(tj), firstStart: -1, speed: 1}
		if m := cfg.Mix; m != nil {
			r := m.Rates(tj)
			if len(r) != len(m.Models) || slices.Min(r) <= 0 {
				return Result{}, fmt.Errorf("simulate: job %s: rates %v; want one positive rate per model %v", tj.ID, r, m.Models)
			}
			s.jobs[i].rates = r
		}
		if deferrable(cfg.Seed, tj.ID, cfg.Deferrable) {
			s.jobs[i].until = tj.Submit + s.jobs[i].work + cfg.DeferSlack
		}
		s.push(tj.Submit, evArrive, i, 0)
	}
	s.res = Result{Policy: cfg.Policy.Name(), Nodes: cfg.Nodes, GPUs: total, Jobs: len(jobs), CheckpointSeconds: cfg.CheckpointInterval}
	first := jobs[0].Submit
	for _, j := range jobs {
		first = min(first, j.Submit)
	}
	done := 0
	for s.events.Len() > 0 {
		now := s.events[0].at
		s.snap.Now = now
		changed := false
		for s.events.Len() > 0 && s.events[0].at == now {
			e := heap.Pop(&s.events).(event)
			s.res.Events++
			switch e.kind {
			case evArrive:
				s.enqueue(e.job)
				changed = true
			case evWake:
				if j := &s.jobs[e.job]; j.wakeAt == now {
					j.wakeAt = 0
					changed = true
				}
			case evEnd:
				if j := &s.jobs[e.job]; j.running && j.attempt == e.attempt {
					if s.end(e.job, now) {
						done++
					}
					changed = true
				}
			case evStop:
				if j := &s.jobs[e.job]; j.running && j.attempt == e.attempt {
					s.stop(e.job, now)
					changed = true
				}
			}
		}
		if changed && len(s.snap.Pending) > 0 {
			if err := s.schedule(now); err != nil {
				return Result{}, err
			}
		}
	}
	if done != len(jobs) {
		return Result{}, fmt.Errorf("simulate: %d of %d jobs never ran under %s; %d still queued",
			len(jobs)-done, len(jobs), cfg.Policy.Name(), len(s.snap.Pending))
	}
	s.summarise(first)
	return s.res, nil
}

// failureFreeWork removes from Runtime what each recorded failure lost.
func (s *sim) failureFreeWork(tj trace.Job) int64 {
	w, prev := tj.Runtime, int64(0)
	for _, f := range tj.Failures {
		seg := f - prev
		w -= seg % s.cfg.CheckpointInterval
		prev = f
	}
	return w
}

func (s *sim) push(at int64, k eventKind, job, attempt int) {
	s.seq++
	heap.Push(&s.events, event{at: at, kind: k, job: job, attempt: attempt, seq: s.seq})
}

func (s *sim) tenant(tj trace.Job) string {
	if tj.Tenant != "" || s.cfg.Tenants <= 0 {
		return tj.Tenant
	}
	h := fnv.New32a()
	h.Write([]byte(tj.ID))
	return fmt.Sprintf("tenant%d", h.Sum32()%uint32(s.cfg.Tenants))
}

func (s *sim) enqueue(i int) {
	j := &s.jobs[i]
	req := scheduler.JobRequest{
		ID: j.tj.ID, Tenant: s.tenant(j.tj), Priority: j.tj.Priority, Submit: j.tj.Submit,
		GPUs: j.tj.GPUs, Attained: j.attained, Preemptible: true, Checkpoint: true, Until: j.until,
	}
	if m := s.cfg.Mix; m != nil {
		req.Types = m.types(j.tj.ID, j.tj.GPUs, j.rates)
		req.StartedOn, req.Reshardable = j.startedOn, m.Reshardable
	}
	switch {
	case s.cfg.NoEstimates:
	case s.cfg.Estimate != nil:
		req.Estimate = predict.Remaining(s.cfg.Estimate(j.tj), j.progress)
	default:
		req.Estimate = j.work - j.progress
	}
	s.penIx[i] = len(s.snap.Pending)
	s.snap.Pending = append(s.snap.Pending, req)
}

func (s *sim) schedule(now int64) error {
	s.res.SchedulingPasses++
	for _, d := range scheduler.Schedule(&s.snap, s.cfg.Policy) {
		switch d := d.(type) {
		case scheduler.Start:
			if d.Backfilled {
				s.res.BackfilledStarts++
			}
			s.start(s.byID[d.Job], d.Placement, now)
		case scheduler.Preempt:
			s.preempt(s.byID[d.Job], d, now)
		case scheduler.Hold:
			s.res.Holds++
			if j := &s.jobs[s.byID[d.Job]]; j.wakeAt != d.At {
				j.wakeAt = d.At
				s.push(d.At, evWake, s.byID[d.Job], 0)
			}
		case scheduler.Reject:
			return fmt.Errorf("simulate: scheduler rejected job %s: %w", d.Job, d.Err)
		}
	}
	return nil
}

func (s *sim) start(i int, p scheduler.Placement, now int64) {
	j := &s.jobs[i]
	k := s.penIx[i]
	req := s.snap.Pending[k]
	s.removePending(i)
	for _, sl := range p.Ranks {
		s.snap.Nodes[s.nodeIx[sl.Node]].GPUs[sl.GPU].Job = req.ID
	}
	j.running, j.start, j.placement = true, now, p
	j.attempt++
	if j.firstStart < 0 {
		j.firstStart = now
		j.startedOn = p.Model
	}
	s.runIx[i] = len(s.snap.Running)
	s.snap.Running = append(s.snap.Running, scheduler.RunningJob{Request: req, Placement: p, Start: now})
	j.speed = 1
	if m := s.cfg.Mix; m != nil {
		j.speed = m.speed(j.rates, p.Model)
	}
	remaining := int64(math.Ceil(float64(j.work-j.progress) / j.speed))
	j.failing = false
	if j.nextFail < len(j.tj.Failures) {
		if toFail := j.tj.Failures[j.nextFail] - j.exec; toFail < remaining {
			j.failing = true
			s.push(now+max(toFail, 0), evEnd, i, j.attempt)
			return
		}
	}
	s.push(now+remaining, evEnd, i, j.attempt)
}

func (s *sim) preempt(i int, d scheduler.Preempt, now int64) {
	j := &s.jobs[i]
	rj := &s.snap.Running[s.runIx[i]]
	rj.Stopping, rj.StopBy = true, now+d.Grace
	j.checkpoint = d.CheckpointFirst
	s.res.Preemptions++
	s.push(now+d.Grace, evStop, i, j.attempt)
}

// end finishes or fails the running attempt; it reports a finished job.
func (s *sim) end(i int, now int64) bool {
	j := &s.jobs[i]
	ran := now - j.start
	s.release(i, ran)
	if !j.failing {
		j.progress = j.work
		j.finish = now
		return true
	}
	c := s.cfg.CheckpointInterval
	saved := ran / c * c
	lost := ran - saved
	j.progress = j.done(saved)
	j.nextFail++
	s.res.Restarts++
	s.res.LostGPUHours += float64(lost) * float64(j.tj.GPUs) / 3600
	s.enqueue(i)
	return false
}

// stop ends a preempted attempt: a checkpoint first saves all progress.
func (s *sim) stop(i int, now int64) {
	j := &s.jobs[i]
	ran := now - j.start
	s.release(i, ran)
	if j.checkpoint {
		j.progress = j.done(ran)
	} else {
		c := s.cfg.CheckpointInterval
		j.progress = j.done(ran / c * c)
		s.res.LostGPUHours += float64(ran%c) * float64(j.tj.GPUs) / 3600
	}
	s.enqueue(i)
}

// done is the job's saved work once ran seconds of this attempt are saved.
func (j *sjob) done(ran int64) int64 {
	return min(j.progress+int64(float64(ran)*j.speed), j.work)
}

func (s *sim) release(i int, ran int64) {
	j := &s.jobs[i]
	for _, sl := range j.placement.Ranks {
		s.snap.Nodes[s.nodeIx[sl.Node]].GPUs[sl.GPU].Job = ""
	}
	s.account(j, ran)
	j.running = false
	j.exec += ran
	j.attained += float64(ran) * float64(len(j.placement.Ranks))
	s.busy += float64(ran) * float64(len(j.placement.Ranks))
	if j.rates == nil || j.rates[0]*j.speed >= slices.Max(j.rates)*(1-1e-9) {
		s.onBest += float64(ran) * float64(len(j.placement.Ranks))
	}
	k := s.runIx[i]
	last := len(s.snap.Running) - 1
	if k != last {
		s.snap.Running[k] = s.snap.Running[last]
		s.runIx[s.byID[s.snap.Running[k].Request.ID]] = k
	}
	s.snap.Running = s.snap.Running[:last]
	delete(s.runIx, i)
}

// account adds an attempt's energy and emissions, per rank on its node's
// curve.
func (s *sim) account(j *sjob, ran int64) {
	kW := s.cfg.GPUPowerKW
	s.res.EnergyKWh += kW * float64(ran) * float64(len(j.placement.Ranks)) / 3600
	for _, sl := range j.placement.Ranks {
		if c := s.curves[s.nodeIx[sl.Node]]; c != nil {
			kg := c.Grams(kW, j.start, j.start+ran) / 1000
			s.res.KgCO2e += kg
			if j.until > 0 {
				s.res.DeferrableKgCO2e += kg
			}
		}
	}
}

// deferrable picks a fraction of jobs by a hash of seed and id, so a seed
// replays the same choice under every policy.
func deferrable(seed uint64, id string, fraction float64) bool {
	if fraction <= 0 {
		return false
	}
	return float64(mixHash(seed, id)>>11)/(1<<53) < fraction
}

func (s *sim) removePending(i int) {
	k := s.penIx[i]
	last := len(s.snap.Pending) - 1
	if k != last {
		s.snap.Pending[k] = s.snap.Pending[last]
		s.penIx[s.byID[s.snap.Pending[k].ID]] = k
	}
	s.snap.Pending = s.snap.Pending[:last]
	delete(s.penIx, i)
}

func (s *sim) summarise(first int64) {
	jct := make([]float64, len(s.jobs))
	rate := make([]float64, len(s.jobs))
	var sumJCT, sumQ float64
	var end int64
	for i := range s.jobs {
		j := &s.jobs[i]
		jct[i] = float64(j.finish - j.tj.Submit)
		best := float64(max(j.work, 1))
		if j.rates != nil {
			best *= j.rates[0] / slices.Max(j.rates)
		}
		rate[i] = best / max(jct[i], 1)
		sumJCT += jct[i]
		sumQ += float64(j.firstStart - j.tj.Submit)
		end = max(end, j.finish)
		if j.until > 0 {
			s.res.DeferrableJobs++
			if j.finish > j.until {
				s.res.MissedDeadlines++
			}
		}
	}
	slices.Sort(jct)
	n := float64(len(jct))
	s.res.MeanJCT = sumJCT / n
	s.res.MeanQueue = sumQ / n
	s.res.P50JCT = percentile(jct, 50)
	s.res.P95JCT = percentile(jct, 95)
	s.res.P99JCT = percentile(jct, 99)
	s.res.Makespan = end - first
	s.res.Fairness = jain(rate)
	s.res.BestTypeShare = 1
	if s.busy > 0 {
		s.res.BestTypeShare = s.onBest / s.busy
	}
	if s.res.Makespan > 0 {
		s.res.Utilization = s.busy / (float64(s.res.GPUs) * float64(s.res.Makespan))
	}
}

// percentile is the nearest-rank percentile of sorted values.
func percentile(sorted []float64, p float64) float64 {
	if len(sorted) == 0 {
		return 0
	}
	k := int(math.Ceil(p/100*float64(len(sorted)))) - 1
	return sorted[min(max(k, 0), len(sorted)-1)]
}
