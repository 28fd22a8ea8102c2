package scheduler

import (
	"cmp"
	"fmt"
	"slices"
	"strings"
)

// Policy is the queue-sort stage: it orders pending jobs into the order in
// which Schedule tries to start them. Order sorts in place and must be a
// pure, deterministic function of the snapshot.
type Policy interface {
	Name() string
	Order(s *Snapshot, pending []*JobRequest)
}

// Backfiller is implemented by policies that let later jobs start while the
// first blocked job waits, without delaying that job's reservation.
type Backfiller interface {
	Backfills() bool
}

// Preemptor is implemented by policies that may stop running jobs to make
// room for a waiting one.
type Preemptor interface {
	// Preempts reports whether preemption is switched on.
	Preempts() bool
	// Outranks reports whether waiting may preempt running.
	Outranks(s *Snapshot, waiting *JobRequest, running *RunningJob) bool
	// Grace is how long (seconds) a preempted job has to checkpoint and stop.
	Grace() int64
}

// keyed sorts pending by a key computed once per job, ties broken by submit
// time then id, so orders are total and replayable.
type keyed struct {
	k1 float64
	k2 float64
	r  *JobRequest
}

func sortKeyed(pending []*JobRequest, key func(r *JobRequest) (float64, float64)) {
	ks := make([]keyed, len(pending))
	for i, r := range pending {
		a, b := key(r)
		ks[i] = keyed{a, b, r}
	}
	slices.SortFunc(ks, func(x, y keyed) int {
		if c := cmp.Compare(x.k1, y.k1); c != 0 {
			return c
		}
		if c := cmp.Compare(x.k2, y.k2); c != 0 {
			return c
		}
		if c := cmp.Compare(x.r.Submit, y.r.Submit); c != 0 {
			return c
		}
		return cmp.Compare(x.r.ID, y.r.ID)
	})
	for i := range ks {
		pending[i] = ks[i].r
	}
}

// FIFO starts jobs in submission order.
type FIFO struct{}

// Name returns "fifo".
func (FIFO) Name() string { return "fifo" }

// Order sorts by submit time.
func (FIFO) Order(_ *Snapshot, pending []*JobRequest) {
	sortKeyed(pending, func(r *JobRequest) (float64, float64) { return float64(r.Submit), 0 })
}

// SJF starts the job with the shortest runtime estimate first. Jobs without
// an estimate go after all jobs with one, in submission order: SJF trusts
// only what a job says of itself (use LAS when nobody estimates).
type SJF struct{}

// Name returns "sjf".
func (SJF) Name() string { return "sjf" }

// Order sorts by estimate, unknown last.
func (SJF) Order(_ *Snapshot, pending []*JobRequest) {
	sortKeyed(pending, func(r *JobRequest) (float64, float64) {
		if r.Estimate <= 0 {
			return 1, 0
		}
		return 0, float64(r.Estimate)
	})
}

// LAS is Tiresias-style discretised least-attained-service: a job's queue is
// how many Thresholds (GPU-seconds) its attained service has passed; lower
// queues go first, FIFO inside a queue. It needs no estimates. With Preempt,
// a waiting job preempts running jobs of a strictly higher queue that have
// run at least MinRun seconds, which bounds thrashing.
type LAS struct {
	Thresholds []float64
	Preempt    bool
	GraceSec   int64
	MinRun     int64
}

// DefaultLAS returns LAS with queues split at 1, 10 and 100 GPU-hours and
// preemption on (5 min grace, 10 min minimum run).
func DefaultLAS() LAS {
	return LAS{Thresholds: []float64{3600, 36000, 360000}, Preempt: true, GraceSec: 300, MinRun: 600}
}

// Name returns "las".
func (LAS) Name() string { return "las" }

func (l LAS) queue(attained float64) int {
	q := 0
	for _, t := range l.Thresholds {
		if attained >= t {
			q++
		}
	}
	return q
}

// Order sorts by queue, then submission.
func (l LAS) Order(_ *Snapshot, pending []*JobRequest) {
	sortKeyed(pending, func(r *JobRequest) (float64, float64) { return float64(l.queue(r.Attained)), 0 })
}

// Preempts reports whether preemption is on.
func (l LAS) Preempts() bool { return l.Preempt }

// Outranks reports whether waiting sits in a lower queue than running.
func (l LAS) Outranks(s *Snapshot, waiting *JobRequest, running *RunningJob) bool {
	if s.Now-running.Start < l.MinRun {
		return false
	}
	return l.queue(waiting.Attained) < l.queue(running.AttainedAt(s.Now))
}

// Grace returns the checkpoint grace in seconds.
func (l LAS) Grace() int64 { return l.GraceSec }

// PriorityAging starts higher priorities first; a waiting job gains
// AgingPerHour priority points per hour in the queue, so an old
// low-priority job eventually overtakes newer high-priority ones (no
// starvation). Preemption compares base priorities only, so aging never
// makes jobs preempt each other back and forth.
type PriorityAging struct {
	AgingPerHour float64
	Preempt      bool
	GraceSec     int64
}

// DefaultPriority returns priority with one point of aging per hour and
// preemption on (5 min grace).
func DefaultPriority() PriorityAging {
	return PriorityAging{AgingPerHour: 1, Preempt: true, GraceSec: 300}
}

// Name returns "priority".
func (PriorityAging) Name() string { return "priority" }

// Effective returns the job's aged priority at time now.
func (p PriorityAging) Effective(r *JobRequest, now int64) float64 {
	wait := max(now-r.Submit, 0)
	return float64(r.Priority) + p.AgingPerHour*float64(wait)/3600
}

// Order sorts by effective priority, highest first.
func (p PriorityAging) Order(s *Snapshot, pending []*JobRequest) {
	sortKeyed(pending, func(r *JobRequest) (float64, float64) { return -p.Effective(r, s.Now), 0 })
}

// Preempts reports whether preemption is on.
func (p PriorityAging) Preempts() bool { return p.Preempt }

// Outranks reports whether waiting's base priority is higher.
func (p PriorityAging) Outranks(_ *Snapshot, waiting *JobRequest, running *RunningJob) bool {
	return waiting.Priority > running.Request.Priority
}

// Grace returns the checkpoint grace in seconds.
func (p PriorityAging) Grace() int64 { return p.GraceSec }

// FairShare orders jobs by weighted dominant-resource share (DRF): the
// resources are each GPU model's pool plus the cluster's GPUs as a whole; a
// tenant's share is its largest fraction of any pool divided by its weight.
// Order fills progressively: the tenant with the lowest share gets its next
// job (FIFO within a tenant), and that job's GPUs count toward its share
// before the next pick, so one tenant's backlog cannot take a whole pass.
type FairShare struct{}

// Name returns "fair".
func (FairShare) Name() string { return "fair" }

// Order interleaves tenants by dominant share.
func (FairShare) Order(s *Snapshot, pending []*JobRequest) {
	// Pools: 0 is the whole cluster, then one per GPU model.
	poolOf := map[string]int{}
	capacity := []float64{0}
	nodePool := make(map[string]int, len(s.Nodes))
	for i := range s.Nodes {
		n := &s.Nodes[i]
		k, ok := poolOf[n.GPUModel]
		if !ok {
			k = len(capacity)
			poolOf[n.GPUModel] = k
			capacity = append(capacity, 0)
		}
		capacity[k] += float64(len(n.GPUs))
		capacity[0] += float64(len(n.GPUs))
		nodePool[n.Name] = k
	}
	tenantOf := map[string]int{}
	var tenants []string
	for _, r := range pending {
		if _, ok := tenantOf[r.Tenant]; !ok {
			tenantOf[r.Tenant] = len(tenants)
			tenants = append(tenants, r.Tenant)
		}
	}
	// Tenants in name order so ties break the same way every pass.
	slices.Sort(tenants)
	for i, t := range tenants {
		tenantOf[t] = i
	}
	usage := make([][]float64, len(tenants))
	for i := range usage {
		usage[i] = make([]float64, len(capacity))
	}
	for i := range s.Running {
		j := &s.Running[i]
		t, ok := tenantOf[j.Request.Tenant]
		if !ok {
			continue // nothing queued: its share orders nothing
		}
		for _, sl := range j.Placement.Ranks {
			usage[t][nodePool[sl.Node]]++
			usage[t][0]++
		}
	}
	weight := make([]float64, len(tenants))
	for i, t := range tenants {
		weight[i] = s.tenantWeight(t)
	}
	share := func(t int) float64 {
		var d float64
		for k, u := range usage[t] {
			if capacity[k] > 0 {
				d = max(d, u/capacity[k])
			}
		}
		return d / weight[t]
	}
	queues := make([][]*JobRequest, len(tenants))
	for _, r := range pending {
		t := tenantOf[r.Tenant]
		queues[t] = append(queues[t], r)
	}
	shares := make([]float64, len(tenants))
	for t := range tenants {
		FIFO{}.Order(s, queues[t])
		shares[t] = share(t)
	}
	out := make([]*JobRequest, 0, len(pending))
	for len(out) < len(pending) {
		bi := -1
		for t := range tenants {
			if len(queues[t]) > 0 && (bi < 0 || shares[t] < shares[bi]) {
				bi = t
			}
		}
		r := queues[bi][0]
		queues[bi] = queues[bi][1:]
		g := float64(r.Size())
		if k, ok := poolOf[r.GPUModel]; ok && r.GPUModel != "" {
			usage[bi][k] += g
		}
		usage[bi][0] += g
		shares[bi] = share(bi)
		out = append(out, r)
	}
	copy(pending, out)
}

// EASY adds EASY backfill to a base order: when the first job in order does
// not fit, it gets a reservation at its shadow time (when running jobs'
// estimated ends free enough GPUs for it), and later jobs may start only if
// they end before the shadow time or use none of the reserved GPUs.
type EASY struct {
	Base Policy
}

// Name returns "backfill" over FIFO, else base+backfill.
func (e EASY) Name() string {
	if _, ok := e.Base.(FIFO); ok {
		return "backfill"
	}
	return e.Base.Name() + "+backfill"
}

// Order delegates to the base policy.
func (e EASY) Order(s *Snapshot, pending []*JobRequest) { e.Base.Order(s, pending) }

// Backfills reports true.
func (EASY) Backfills() bool { return true }

// Preempts delegates to the base policy.
func (e EASY) Preempts() bool { return preempts(e.Base) }

// Outranks delegates to the base policy.
func (e EASY) Outranks(s *Snapshot, w *JobRequest, r *RunningJob) bool {
	return outranks(e.Base, s, w, r)
}

// Grace delegates to the base policy.
func (e EASY) Grace() int64 { return grace(e.Base) }

// wrapped is a policy option around a base policy: it orders, backfills,
// preempts, defers and allocates types as the base does, except where the
// option defines its own. Options therefore stack in any order.
type wrapped struct {
	Base Policy
}

// Order delegates to the base policy.
func (w wrapped) Order(s *Snapshot, pending []*JobRequest) { w.Base.Order(s, pending) }

// Backfills delegates to the base policy.
func (w wrapped) Backfills() bool {
	b, ok := w.Base.(Backfiller)
	return ok && b.Backfills()
}

// Preempts delegates to the base policy.
func (w wrapped) Preempts() bool { return preempts(w.Base) }

// Outranks delegates to the base policy.
func (w wrapped) Outranks(s *Snapshot, waiting *JobRequest, r *RunningJob) bool {
	return outranks(w.Base, s, waiting, r)
}

// Grace delegates to the base policy.
func (w wrapped) Grace() int64 { return grace(w.Base) }

// Deferral delegates to the base policy; nil when it defers nothing.
func (w wrapped) Deferral(s *Snapshot) func(r *JobRequest) (Hold, *Preference, bool) {
	if d, ok := w.Base.(Deferrer); ok {
		return d.Deferral(s)
	}
	return nil
}

// Allocate delegates to the base policy; nil when it allocates no types.
func (w wrapped) Allocate(s *Snapshot, queue []*JobRequest) map[string]Allocation {
	if a, ok := w.Base.(Allocator); ok {
		return a.Allocate(s, queue)
	}
	return nil
}

// preempts, outranks and grace are a wrapping policy's Preemptor methods:
// its base's, or no preemption when the base has none.
func preempts(base Policy) bool {
	p, ok := base.(Preemptor)
	return ok && p.Preempts()
}

func outranks(base Policy, s *Snapshot, w *JobRequest, r *RunningJob) bool {
	p, ok := base.(Preemptor)
	return ok && p.Outranks(s, w, r)
}

func grace(base Policy) int64 {
	if p, ok := base.(Preemptor); ok {
		return p.Grace()
	}
	return 0
}

// DefaultPolicy is the queue policy gpuctl serve and gpuctl simulate use
// when none is named: priority order with EASY backfill.
const DefaultPolicy = "priority+backfill"

// PolicyNames lists the names PolicyByName accepts.
func PolicyNames() []string {
	return []string{"fifo", "sjf", "las", "priority", "fair", "backfill", "sjf+backfill", "las+backfill", "fair+backfill", "priority+backfill",
		"learned", "learned+backfill"}
}

// PolicyByName returns the named policy with default settings; a
// "+backfill" suffix adds EASY backfill to any base. "learned" needs
// weights: PolicyWithWeights.
func PolicyByName(name string) (Policy, error) {
	return PolicyWithWeights(name, nil)
}

// PolicyWithWeights is PolicyByName that can also make "learned" (and
// "learned+backfill"): a Scored policy with weights w.
func PolicyWithWeights(name string, w *ScoreWeights) (Policy, error) {
	base, bf := strings.CutSuffix(name, "+backfill")
	var p Policy
	switch base {
	case "learned":
		if w == nil {
			return nil, fmt.Errorf("policy %q needs its weights: give --policy-weights FILE (learn them with `gpuctl simulate train --policy-out FILE`)", name)
		}
		p = Scored{Weights: *w}
	case "fifo":
		p = FIFO{}
	case "sjf":
		p = SJF{}
	case "las":
		p = DefaultLAS()
	case "priority":
		p = DefaultPriority()
	case "fair":
		p = FairShare{}
	case "backfill":
		if bf {
			return nil, fmt.Errorf("unknown policy %q: use one of %s", name, strings.Join(PolicyNames(), ", "))
		}
		return EASY{Base: FIFO{}}, nil
	default:
		return nil, fmt.Errorf("unknown policy %q: use one of %s", name, strings.Join(PolicyNames(), ", "))
	}
	if bf {
		return EASY{Base: p}, nil
	}
	return p, nil
}
