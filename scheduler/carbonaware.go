package scheduler

import (
	"fmt"

	"github.com/gpuctl/gpuctl/scheduler/carbon"
)

// Carbon-aware defaults: a job waits only for a window at least 5% cleaner
// than the cleanest site now, and the cleaner site weighs more than an extra
// rack in a placement's score but less than an extra switch.
const (
	DefaultCarbonMinSaving = 0.05
	carbonSiteWeight       = 20
)

// Hold keeps a deferrable job queued until At, when a cleaner window
// starts; the job is not blocked by and does not block others.
type Hold struct {
	Job    string
	At     int64
	Reason string
}

// JobID returns the job.
func (d Hold) JobID() string { return d.Job }

// Deferrer is implemented by policies that may hold deferrable jobs back.
// Deferral prepares one pass over s and returns the per-job rule.
type Deferrer interface {
	Deferral(s *Snapshot) func(r *JobRequest) (Hold, *Preference, bool)
}

// CarbonAware adds carbon-aware deferral to a base policy: a deferrable job
// (JobRequest.Until set) with a runtime estimate waits while a start at a
// cleaner hour or site (carbon.Decide) still lets it finish by Until, and
// otherwise prefers the cleanest site it can run on now. Jobs that are not
// deferrable are never held, so the base order, backfill and preemption
// are otherwise unchanged.
type CarbonAware struct {
	wrapped
	Intensity *carbon.Intensities
	// MinSaving is the fraction by which a later window must be cleaner.
	MinSaving float64
}

// WithCarbon wraps p with carbon-aware deferral over in.
func WithCarbon(p Policy, in *carbon.Intensities) CarbonAware {
	return CarbonAware{wrapped: wrapped{p}, Intensity: in, MinSaving: DefaultCarbonMinSaving}
}

// Name returns the base's name with "+carbon".
func (c CarbonAware) Name() string { return c.Base.Name() + "+carbon" }

// Deferral finds, once per pass, the curves of the ready nodes of each GPU
// model (the sites a job of that model could run on), then decides per job.
func (c CarbonAware) Deferral(s *Snapshot) func(r *JobRequest) (Hold, *Preference, bool) {
	if c.Intensity == nil || len(c.Intensity.Sources) == 0 {
		return nil
	}
	src := c.Intensity.Sources
	type sites struct {
		seen   []bool
		curves []*carbon.Curve
		index  []int // into src
	}
	add := func(ss *sites, i int) {
		if ss.seen == nil {
			ss.seen = make([]bool, len(src))
		}
		if !ss.seen[i] {
			ss.seen[i] = true
			ss.curves = append(ss.curves, src[i].Curve)
			ss.index = append(ss.index, i)
		}
	}
	var all sites
	byModel := map[string]*sites{}
	for i := range s.Nodes {
		n := &s.Nodes[i]
		if n.State != NodeReady {
			continue
		}
		k, ok := c.Intensity.For(n.Labels)
		if !ok {
			continue
		}
		m := byModel[n.GPUModel]
		if m == nil {
			m = &sites{}
			byModel[n.GPUModel] = m
		}
		add(m, k)
		add(&all, k)
	}
	return func(r *JobRequest) (Hold, *Preference, bool) {
		if r.Until <= 0 {
			return Hold{}, nil, false
		}
		ss := &all
		if r.GPUModel != "" {
			if ss = byModel[r.GPUModel]; ss == nil {
				return Hold{}, nil, false
			}
		}
		if len(ss.curves) == 0 || r.Estimate <= 0 {
			return Hold{}, nil, false
		}
		d := carbon.Decide(ss.curves, s.Now, r.Until, r.Estimate, c.MinSaving)
		at := src[ss.index[d.Best.Site]]
		if d.Hold {
			return Hold{Job: r.ID, At: d.Best.Start, Reason: fmt.Sprintf(
				"deferrable: waits for a cleaner window at %s (%.0f gCO2e/kWh over its run, %.0f now)",
				at.Selector(), d.Best.Mean, d.Now.Mean)}, nil, true
		}
		if len(ss.curves) == 1 {
			return Hold{}, nil, false
		}
		return Hold{}, &Preference{Key: at.Key, Value: at.Value, Weight: carbonSiteWeight}, false
	}
}
