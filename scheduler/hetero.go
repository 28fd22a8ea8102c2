package scheduler

import (
	"cmp"
	"fmt"
	"maps"
	"slices"
)

// TypeOption is one GPU model a job may run on: the shape of the job's plan
// on that model and the job's throughput there (from the cost model's
// predicted step time of that plan). Only the ratios between one job's
// options matter, so Rate may be steps, samples or tokens per second.
type TypeOption struct {
	Model string
	Shape Shape
	Rate  float64
}

// Objective is what a heterogeneity-aware policy maximises when it hands
// GPU types to the jobs that allow several (Gavel, Narayanan et al.,
// OSDI'20). A job's normalised throughput on a type is its rate there over
// its rate on its own best type, so 1 is the best the job can get.
type Objective string

// Objectives.
const (
	// MaxThroughput maximises the total normalised throughput, each job
	// weighted by its GPUs: the types go where they speed work up most.
	MaxThroughput Objective = "max-throughput"
	// MaxMinFair maximises the smallest normalised throughput, then the
	// next smallest (leximin): no job is sent to a slow type while another
	// allocation would spare it.
	MaxMinFair Objective = "max-min-fair"
)

// Objectives lists the accepted objectives.
var Objectives = []Objective{MaxThroughput, MaxMinFair}

// ParseObjective checks an objective's name.
func ParseObjective(name string) (Objective, error) {
	o := Objective(name)
	if slices.Contains(Objectives, o) {
		return o, nil
	}
	return "", fmt.Errorf("unknown heterogeneity objective %q; use %s or %s", name, MaxThroughput, MaxMinFair)
}

// exchangeRounds bounds the allocation's improvement passes; each pass
// only applies swaps that improve the objective, so it stops earlier once
// none does.
const exchangeRounds = 4

// Allocation is the type a heterogeneity-aware policy gives one job this
// pass: the models to try in order (the allocated one first) and why.
type Allocation struct {
	Models []string
	Reason string
}

// Allocator is implemented by policies that choose, once per pass, the
// GPU type of each pending job allowing several. Schedule places each such
// job on its models in that order; placement, backfill and preemption keep
// their rules.
type Allocator interface {
	Allocate(s *Snapshot, queue []*JobRequest) map[string]Allocation
}

// Hetero adds heterogeneity-aware type allocation to a base policy. Jobs
// that allow one model, or none, are placed as before.
type Hetero struct {
	wrapped
	Objective Objective
}

// WithHetero wraps p with type allocation under o.
func WithHetero(p Policy, o Objective) Hetero { return Hetero{wrapped: wrapped{p}, Objective: o} }

// Name returns the base's name with "+" and the objective.
func (h Hetero) Name() string { return h.Base.Name() + "+" + string(h.Objective) }

// options is the request's type options after its restart rule: a job that
// started on a model and cannot reshard its checkpoint keeps that model.
func (r *JobRequest) options() []TypeOption {
	if r.StartedOn == "" || r.Reshardable {
		return r.Types
	}
	for _, t := range r.Types {
		if t.Model == r.StartedOn {
			return []TypeOption{t}
		}
	}
	return r.Types
}

// flexJob is one job in the allocation: its options' normalised
// throughputs and sizes, and the option it holds.
type flexJob struct {
	r    *JobRequest
	opts []TypeOption
	norm []float64
	at   int // index into opts; -1 when unassigned
}

func (f *flexJob) size(k int) int { return f.opts[k].Shape.Size() }

// Allocate hands types to the pending jobs allowing several models, in
// queue order, against the free GPUs of each model. Jobs bound to one
// model take their GPUs first (in queue order, while they fit); the
// flexible jobs then start on their best types in queue order, and
// exchanges between pairs of them (and moves to a type with room) are
// applied while they improve the objective. Jobs beyond the free GPUs
// get their types by normalised throughput, best first.
func (h Hetero) Allocate(s *Snapshot, queue []*JobRequest) map[string]Allocation {
	var flex []*flexJob
	for _, r := range queue {
		if len(r.options()) > 1 {
			flex = append(flex, newFlexJob(r))
		}
	}
	if len(flex) == 0 {
		return nil
	}
	free := map[string]int{}
	for i := range s.Nodes {
		n := &s.Nodes[i]
		if n.State != NodeReady {
			continue
		}
		for _, g := range n.GPUs {
			if g.Healthy && g.Job == "" {
				free[n.GPUModel]++
			}
		}
	}
	total := 0
	for _, c := range free {
		total += c
	}
	// Queue order decides who is in this pass: walk until the free GPUs are
	// spoken for, fixed jobs taking their model's GPUs.
	in := 0
	for _, r := range queue {
		if total <= 0 {
			break
		}
		if len(r.options()) > 1 {
			in++
			total -= slices.MinFunc(r.options(), func(a, b TypeOption) int { return cmp.Compare(a.Shape.Size(), b.Shape.Size()) }).Shape.Size()
			continue
		}
		m, size := r.GPUModel, r.minSize()
		if o := r.options(); len(o) == 1 {
			m, size = o[0].Model, o[0].Shape.Size()
		}
		if m != "" && free[m] >= size {
			free[m] -= size
		}
		total -= size
	}
	active := flex[:in]
	room := maps.Clone(free)
	for _, f := range active {
		for _, k := range f.byNorm() {
			if free[f.opts[k].Model] >= f.size(k) {
				f.at = k
				free[f.opts[k].Model] -= f.size(k)
				break
			}
		}
	}
	h.exchange(active, free)
	out := make(map[string]Allocation, len(flex))
	for _, f := range flex {
		order := f.byNorm()
		if f.at >= 0 {
			order = append([]int{f.at}, slices.DeleteFunc(order, func(k int) bool { return k == f.at })...)
		}
		a := Allocation{Models: make([]string, len(order))}
		for i, k := range order {
			a.Models[i] = f.opts[k].Model
		}
		a.Reason = f.reason(order[0], h.Objective, room)
		out[f.r.ID] = a
	}
	return out
}

func newFlexJob(r *JobRequest) *flexJob {
	opts := r.options()
	f := &flexJob{r: r, opts: opts, norm: make([]float64, len(opts)), at: -1}
	best := 0.0
	for _, o := range opts {
		best = max(best, o.Rate)
	}
	for k, o := range opts {
		if best > 0 {
			f.norm[k] = o.Rate / best
		}
	}
	return f
}

// byNorm is the option indexes by normalised throughput, best first, ties
// in the job's own order.
func (f *flexJob) byNorm() []int {
	idx := make([]int, len(f.opts))
	for i := range idx {
		idx[i] = i
	}
	slices.SortStableFunc(idx, func(a, b int) int { return cmp.Compare(f.norm[b], f.norm[a]) })
	return idx
}

// reason says which type the job got and how it compares with its others.
// room is each model's free GPUs before the flexible jobs took theirs.
func (f *flexJob) reason(k int, o Objective, room map[string]int) string {
	other := -1
	for j := range f.opts {
		if j != k && (other < 0 || f.norm[j] > f.norm[other]) {
			other = j
		}
	}
	if other < 0 {
		return fmt.Sprintf("%s; %s", f.opts[k].Model, o)
	}
	ratio := f.opts[k].Rate / f.opts[other].Rate
	why := string(o)
	if f.at < 0 {
		why += ", waiting for GPUs"
	} else if f.norm[k] < 1 {
		if b := f.byNorm()[0]; room[f.opts[b].Model] < f.size(b) {
			why += fmt.Sprintf(", no %s free", f.opts[b].Model)
		} else {
			why += ", its faster type is worth more to other jobs"
		}
	}
	return fmt.Sprintf("%s: %.2f× its %s throughput; %s", f.opts[k].Model, ratio, f.opts[other].Model, why)
}

// typePick is one job on one of its options (-1: none).
type typePick struct {
	f *flexJob
	k int
}

// score is the objective over some jobs' picks, compared lexicographically:
// max-throughput is the GPU-weighted sum of normalised throughputs;
// max-min-fair is the smallest of them, then their sum.
func (h Hetero) score(ps ...typePick) [2]float64 {
	var sum float64
	low := 2.0
	for _, p := range ps {
		v, w := 0.0, 1.0
		if p.k >= 0 {
			v = p.f.norm[p.k]
			if h.Objective == MaxThroughput {
				w = float64(p.f.size(p.k))
			}
		}
		sum += v * w
		low = min(low, v)
	}
	if h.Objective == MaxThroughput {
		return [2]float64{sum, 0}
	}
	return [2]float64{low, sum}
}

func better(before, after [2]float64) bool {
	const eps = 1e-9
	return after[0] > before[0]+eps || (after[0] > before[0]-eps && after[1] > before[1]+eps)
}

// exchange improves the allocation by moving one job to a type with room,
// or swapping the types of two jobs where both fit, while the objective
// improves, for at most exchangeRounds passes.
func (h Hetero) exchange(jobs []*flexJob, free map[string]int) {
	for range exchangeRounds {
		changed := false
		for _, a := range jobs {
			for k := range a.opts {
				if k == a.at || free[a.opts[k].Model] < a.size(k) {
					continue
				}
				if better(h.score(typePick{a, a.at}), h.score(typePick{a, k})) {
					a.move(k, free)
					changed = true
				}
			}
		}
		for i, a := range jobs {
			if a.at < 0 {
				continue
			}
			for _, b := range jobs[i+1:] {
				if b.at < 0 || a.opts[a.at].Model == b.opts[b.at].Model {
					continue
				}
				ka, kb := a.option(b.opts[b.at].Model), b.option(a.opts[a.at].Model)
				if ka < 0 || kb < 0 || !better(h.score(typePick{a, a.at}, typePick{b, b.at}), h.score(typePick{a, ka}, typePick{b, kb})) {
					continue
				}
				// Both must fit once each has given back its GPUs.
				ma, mb := a.opts[a.at].Model, b.opts[b.at].Model
				if free[mb]+b.size(b.at) < a.size(ka) || free[ma]+a.size(a.at) < b.size(kb) {
					continue
				}
				free[ma] += a.size(a.at) - b.size(kb)
				free[mb] += b.size(b.at) - a.size(ka)
				a.at, b.at = ka, kb
				changed = true
			}
		}
		if !changed {
			return
		}
	}
}

func (f *flexJob) option(model string) int {
	for k, o := range f.opts {
		if o.Model == model {
			return k
		}
	}
	return -1
}

func (f *flexJob) move(k int, free map[string]int) {
	if f.at >= 0 {
		free[f.opts[f.at].Model] += f.size(f.at)
	}
	free[f.opts[k].Model] -= f.size(k)
	f.at = k
}

// validateTypes checks a request allowing several models.
func (r *JobRequest) validateTypes() error {
	if len(r.Types) == 0 {
		return nil
	}
	switch {
	case r.GPUModel != "":
		return fmt.Errorf("%w: job %s: gpu model %s and a list of types; give one of them", ErrInvalidRequest, r.ID, r.GPUModel)
	case r.AllowMixed:
		return fmt.Errorf("%w: job %s: allow mixed and a list of types; a job on a list runs on one model", ErrInvalidRequest, r.ID)
	case r.Shape != (Shape{}):
		return fmt.Errorf("%w: job %s: a shape and a list of types; each type carries its shape", ErrInvalidRequest, r.ID)
	}
	seen := map[string]bool{}
	for _, t := range r.Types {
		s := t.Shape
		switch {
		case t.Model == "":
			return fmt.Errorf("%w: job %s: a type without a model", ErrInvalidRequest, r.ID)
		case seen[t.Model]:
			return fmt.Errorf("%w: job %s: model %s listed twice", ErrInvalidRequest, r.ID, t.Model)
		case s.TP < 1 || s.PP < 1 || s.DP < 1:
			return fmt.Errorf("%w: job %s: shape %s on %s: tp, pp and dp must each be at least 1", ErrInvalidRequest, r.ID, s, t.Model)
		case r.GPUs != 0 && r.GPUs != s.Size():
			return fmt.Errorf("%w: job %s: gpus %d does not match shape %s on %s", ErrInvalidRequest, r.ID, r.GPUs, s, t.Model)
		case t.Rate <= 0:
			return fmt.Errorf("%w: job %s: throughput %g on %s; must be positive", ErrInvalidRequest, r.ID, t.Rate, t.Model)
		}
		seen[t.Model] = true
	}
	return nil
}

// allocate asks an Allocator policy for this pass's types and puts each
// allocated job's models in that order (a copy: the snapshot's request
// stays as the caller gave it). It returns the reasons by job.
func allocate(s *Snapshot, p Policy, queue []*JobRequest) map[string]string {
	a, ok := p.(Allocator)
	if !ok {
		return nil
	}
	alloc := a.Allocate(s, queue)
	if len(alloc) == 0 {
		return nil
	}
	reasons := make(map[string]string, len(alloc))
	for i, r := range queue {
		al, ok := alloc[r.ID]
		if !ok {
			continue
		}
		c := *r
		opts := r.options()
		c.Types = make([]TypeOption, 0, len(opts))
		for _, m := range al.Models {
			for _, t := range opts {
				if t.Model == m {
					c.Types = append(c.Types, t)
				}
			}
		}
		c.StartedOn, c.ordered = "", true
		queue[i] = &c
		reasons[r.ID] = al.Reason
	}
	return reasons
}

// typeReason is why a started job allowing several models got its model:
// the allocation's reason when it got the allocated one, else the fallback.
func typeReason(r *JobRequest, pl *Placement, reasons map[string]string) string {
	if pl.Model == "" {
		return ""
	}
	if why, ok := reasons[r.ID]; ok {
		if len(r.Types) > 0 && r.Types[0].Model == pl.Model {
			return why
		}
		return fmt.Sprintf("%s: its allocated %s did not fit", pl.Model, r.Types[0].Model)
	}
	if len(r.options()) == 1 {
		return fmt.Sprintf("%s: the model it started on (its checkpoint cannot be resharded)", pl.Model)
	}
	return fmt.Sprintf("%s: best placement; type-agnostic", pl.Model)
}
