package scheduler

import (
	"cmp"
	"fmt"
	"slices"
)

// Decision is one step of a scheduling plan; the control plane applies it
// (the Bind stage) and may reject it.
type Decision interface {
	// JobID is the job the decision is about.
	JobID() string
}

// Start runs a pending job on a placement now.
type Start struct {
	Job       string
	Placement Placement
	// Backfilled marks a job started ahead of a blocked, reserved job.
	Backfilled bool
	// TypeReason says why a job allowing several models got
	// Placement.Model (the policy's allocation, or the best placement).
	TypeReason string
}

// Preempt stops a running job to make room for For. When CheckpointFirst is
// set the control plane must request a checkpoint and wait up to Grace
// seconds for it before stopping the job; it is never killed first.
type Preempt struct {
	Job             string
	For             string
	Reason          string
	CheckpointFirst bool
	Grace           int64
}

// Reserve records the first blocked job's reservation: it should start at
// At on Placement (Known false when running jobs give no estimates to
// compute it from). Backfilled jobs never take a reserved GPU past At.
type Reserve struct {
	Job       string
	At        int64
	Known     bool
	Placement Placement
}

// Reject drops a request that can never run as written.
type Reject struct {
	Job string
	Err error
}

// JobID returns the job.
func (d Start) JobID() string { return d.Job }

// JobID returns the job.
func (d Preempt) JobID() string { return d.Job }

// JobID returns the job.
func (d Reserve) JobID() string { return d.Job }

// JobID returns the job.
func (d Reject) JobID() string { return d.Job }

// minSize is the fewest GPUs the request can start with.
func (r *JobRequest) minSize() int {
	s := r.shape()
	dp := s.DP
	for _, d := range r.ElasticDP {
		if d >= 1 && d < dp {
			dp = d
		}
	}
	return s.TP * s.PP * dp
}

var quiet = placeOpts{quiet: true}

// ending is a job holding GPUs with a known expected end.
type ending struct {
	at int64
	p  *Placement
}

// Schedule runs one scheduling pass: pending jobs in the policy's order
// start while they fit. The first job that does not fit blocks the queue:
// a Preemptor policy may preempt lower-ranked jobs for it, and it gets a
// Reserve. Only a Backfiller policy goes on past it, starting a later job
// only if it ends (by its estimate) before the reservation or uses none of
// the reserved GPUs, so the blocked job is never delayed. A Deferrer policy
// first holds deferrable jobs back for a cleaner window (a Hold each); they
// neither block nor reserve.
func Schedule(s *Snapshot, p Policy) []Decision {
	if len(s.Pending) == 0 {
		return nil
	}
	var out []Decision
	queue := make([]*JobRequest, 0, len(s.Pending))
	var deferral func(r *JobRequest) (Hold, *Preference, bool)
	if d, ok := p.(Deferrer); ok {
		deferral = d.Deferral(s)
	}
	for i := range s.Pending {
		r := &s.Pending[i]
		if err := r.Validate(); err != nil {
			out = append(out, Reject{Job: r.ID, Err: err})
			continue
		}
		if deferral != nil && r.Until > 0 {
			h, pref, held := deferral(r)
			if held {
				out = append(out, h)
				continue
			}
			if pref != nil {
				// A copy: the snapshot's request stays as the caller gave it.
				c := *r
				c.Prefer = append(slices.Clip(r.Prefer), *pref)
				r = &c
			}
		}
		queue = append(queue, r)
	}
	p.Order(s, queue)
	reasons := allocate(s, p, queue)

	st := newState(s)
	free := st.freeGPUs()
	bf, _ := p.(Backfiller)
	backfill := bf != nil && bf.Backfills()
	var (
		started []ending
		res     *Reserve
		beyond  *state // st without the reserved GPUs
	)
	for _, r := range queue {
		if res == nil {
			if r.minSize() <= free {
				if pl, err := st.place(r, quiet); err == nil {
					st.take(&pl)
					free -= len(pl.Ranks)
					out = append(out, Start{Job: r.ID, Placement: pl, TypeReason: typeReason(r, &pl, reasons)})
					if r.Estimate > 0 {
						pc := pl
						started = append(started, ending{s.Now + r.Estimate, &pc})
					}
					continue
				}
			}
			res = &Reserve{Job: r.ID}
			if pre, ok := p.(Preemptor); ok && pre.Preempts() {
				if ds, pl, ok := preemptFor(s, st, r, pre); ok {
					out = append(out, ds...)
					res.At, res.Known, res.Placement = s.Now+pre.Grace(), true, pl
				}
			}
			if !res.Known {
				res.At, res.Placement, res.Known = shadow(s, st, r, started)
			}
			out = append(out, *res)
			if !backfill || !res.Known {
				break
			}
			beyond = st.clone()
			beyond.take(&res.Placement)
			continue
		}
		if r.minSize() > free {
			continue
		}
		on := beyond
		if r.Estimate > 0 && s.Now+r.Estimate <= res.At {
			on = st
		}
		pl, err := on.place(r, quiet)
		if err != nil {
			continue
		}
		st.take(&pl)
		beyond.take(&pl)
		free -= len(pl.Ranks)
		out = append(out, Start{Job: r.ID, Placement: pl, Backfilled: true, TypeReason: typeReason(r, &pl, reasons)})
	}
	return out
}

// shadow finds when the blocked job could start: running jobs (and jobs
// started in this pass) release their GPUs at their estimated ends, in
// order, until the job places. Jobs without an estimate never release.
func shadow(s *Snapshot, st *state, r *JobRequest, started []ending) (int64, Placement, bool) {
	ends := slices.Clone(started)
	for i := range s.Running {
		j := &s.Running[i]
		if at, ok := j.EstimatedEnd(); ok {
			ends = append(ends, ending{at, &j.Placement})
		}
	}
	slices.SortStableFunc(ends, func(a, b ending) int { return cmp.Compare(a.at, b.at) })
	scratch := st.clone()
	free := scratch.freeGPUs()
	need := r.minSize()
	for i, e := range ends {
		free += scratch.releaseCount(e.p)
		if i+1 < len(ends) && ends[i+1].at == e.at {
			continue
		}
		if free < need {
			continue
		}
		if pl, err := scratch.place(r, quiet); err == nil {
			return max(e.at, s.Now), pl, true
		}
	}
	return 0, Placement{}, false
}

// releaseCount releases p and returns how many GPUs became usable for
// ordinary jobs (ready, non-spare nodes).
func (st *state) releaseCount(p *Placement) int {
	before := 0
	for _, n := range p.Nodes() {
		if i, ok := st.byName[n]; ok && st.nodes[i].node.State == NodeReady && !st.nodes[i].spare {
			before += len(st.nodes[i].free)
		}
	}
	st.release(p)
	after := 0
	for _, n := range p.Nodes() {
		if i, ok := st.byName[n]; ok && st.nodes[i].node.State == NodeReady && !st.nodes[i].spare {
			after += len(st.nodes[i].free)
		}
	}
	return after - before
}

// preemptFor picks the smallest set of outranked, preemptible running jobs
// whose GPUs let r place: candidates lowest priority first, youngest first
// (least work lost), then drops any victim the placement does not need.
func preemptFor(s *Snapshot, st *state, r *JobRequest, pre Preemptor) ([]Decision, Placement, bool) {
	// Jobs already stopping leave anyway: count their GPUs first, so a
	// later pass does not preempt more jobs for the same waiting one.
	var cands, stopping []*RunningJob
	for i := range s.Running {
		j := &s.Running[i]
		if j.Stopping {
			stopping = append(stopping, j)
			continue
		}
		if j.Request.Preemptible && pre.Outranks(s, r, j) {
			cands = append(cands, j)
		}
	}
	if len(cands) == 0 && len(stopping) == 0 {
		return nil, Placement{}, false
	}
	if len(stopping) > 0 {
		base := st.clone()
		for _, j := range stopping {
			base.release(&j.Placement)
		}
		if pl, err := base.place(r, quiet); err == nil {
			return nil, pl, true
		}
		st = base
	}
	if len(cands) == 0 {
		return nil, Placement{}, false
	}
	slices.SortFunc(cands, func(a, b *RunningJob) int {
		if c := cmp.Compare(a.Request.Priority, b.Request.Priority); c != 0 {
			return c
		}
		if c := cmp.Compare(b.Start, a.Start); c != 0 {
			return c
		}
		return cmp.Compare(a.Request.ID, b.Request.ID)
	})
	need := r.minSize()
	scratch := st.clone()
	free := scratch.freeGPUs()
	var victims []*RunningJob
	placed := false
	for _, j := range cands {
		free += scratch.releaseCount(&j.Placement)
		victims = append(victims, j)
		if free < need {
			continue
		}
		if _, err := scratch.place(r, quiet); err == nil {
			placed = true
			break
		}
	}
	if !placed {
		return nil, Placement{}, false
	}
	// Keep only the victims the placement needs, sparing the most valuable
	// (last chosen) first.
	keep := make([]bool, len(victims))
	for i := range keep {
		keep[i] = true
	}
	for i := len(victims) - 1; i >= 0; i-- {
		keep[i] = false
		trial := st.clone()
		for k, v := range victims {
			if keep[k] {
				trial.release(&v.Placement)
			}
		}
		if _, err := trial.place(r, quiet); err != nil {
			keep[i] = true
		}
	}
	final := st.clone()
	var out []Decision
	for k, v := range victims {
		if !keep[k] {
			continue
		}
		final.release(&v.Placement)
		out = append(out, Preempt{
			Job:             v.Request.ID,
			For:             r.ID,
			Reason:          fmt.Sprintf("frees %d GPUs for %s, which outranks it", v.GPUs(), r.ID),
			CheckpointFirst: v.Request.Checkpoint,
			Grace:           pre.Grace(),
		})
	}
	pl, err := final.place(r, quiet)
	if err != nil {
		return nil, Placement{}, false
	}
	return out, pl, true
}
