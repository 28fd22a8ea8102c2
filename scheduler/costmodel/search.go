package costmodel

import (
	"cmp"
	"fmt"
	"slices"
)

// Reason says why a plan lost; `gpuctl plan` counts them.
type Reason string

// Reasons a plan is rejected.
const (
	ReasonInvalidInput         Reason = "invalid input"
	ReasonTPExceedsNode        Reason = "tp exceeds node"
	ReasonHeadsNotDivisible    Reason = "heads not divisible by tp"
	ReasonGPUsNotDivisible     Reason = "gpus not divisible"
	ReasonLayersNotDivisible   Reason = "layers not divisible by pp"
	ReasonBatchNotDivisible    Reason = "batch not divisible"
	ReasonInterleaveImpossible Reason = "interleaving impossible"
	ReasonOutOfMemory          Reason = "out of memory"
	ReasonSlower               Reason = "slower"
)

// Rejection records one plan (or family of plans: zero fields mean "any")
// that lost and why.
type Rejection struct {
	Plan   Plan   `json:"plan"`
	Reason Reason `json:"reason"`
	Detail string `json:"detail"`
	// MemPerGPUBytes is the memory the plan needs, for out-of-memory
	// rejections (model state alone when the whole family overflows).
	MemPerGPUBytes int64 `json:"mem_per_gpu_bytes,omitempty"`
	// Evaluation holds the full prediction where there is one (out of
	// memory for a complete plan, slower).
	Evaluation *Evaluation `json:"evaluation,omitempty"`
}

// Options steer Search.
type Options struct {
	Training Training
	Tunables Tunables
	// TP, PP and DP fix a dimension when positive.
	TP, PP, DP int
	// MicroBatchSizes are the micro-batch sizes tried; nil means 1, 2, 4, 8.
	MicroBatchSizes []int
	// MaxVirtualStages bounds interleaving; 0 means 1 (no interleaving).
	MaxVirtualStages int
	// AllowUnevenPipeline lets pp not divide the layer count (the busiest
	// stage gets one more block).
	AllowUnevenPipeline bool
	// Top keeps only the best Top plans in ranked; the rest become
	// ReasonSlower rejections. 0 keeps all.
	Top int
}

// Search enumerates tp (powers of two within a node that divide the heads)
// × pp × dp = gpus/(tp·pp) × micro-batch size × interleaving, keeps the
// plans that fit in memory, and ranks them by predicted step time (fastest
// first). Every plan or family of plans that lost is in rejected, with why.
//
// Pruning: a (tp, pp, dp) whose model state alone overflows the GPU skips
// all its micro-batch sizes, and a micro-batch size that overflows ends the
// larger ones (activations only grow with it).
func Search(model Model, hw Hardware, gpus int, opt Options) (ranked []Evaluation, rejected []Rejection) {
	c := Config{Model: model, Hardware: hw, Training: opt.Training, Tunables: opt.Tunables}
	if err := c.Validate(); err != nil {
		return nil, []Rejection{{Reason: ReasonInvalidInput, Detail: err.Error()}}
	}
	if gpus <= 0 {
		return nil, []Rejection{{Reason: ReasonInvalidInput, Detail: fmt.Sprintf("gpus must be positive, got %d", gpus)}}
	}
	mbsList := opt.MicroBatchSizes
	if len(mbsList) == 0 {
		mbsList = []int{1, 2, 4, 8}
	}
	mbsList = slices.Clone(mbsList)
	slices.Sort(mbsList)
	maxV := max(opt.MaxVirtualStages, 1)
	reject := func(p Plan, r Reason, format string, args ...any) {
		rejected = append(rejected, Rejection{Plan: p, Reason: r, Detail: fmt.Sprintf(format, args...)})
	}

	for _, tp := range tpCandidates(model, gpus, opt.TP) {
		base := Plan{TP: tp}
		switch {
		case tp > hw.GPUsPerNode:
			reject(base, ReasonTPExceedsNode, "tp %d exceeds the %d GPUs of one node", tp, hw.GPUsPerNode)
			continue
		case model.Heads%tp != 0 || model.kvHeads()%tp != 0:
			reject(base, ReasonHeadsNotDivisible, "tp %d does not divide %d heads / %d kv heads", tp, model.Heads, model.kvHeads())
			continue
		case gpus%tp != 0:
			reject(base, ReasonGPUsNotDivisible, "tp %d does not divide %d GPUs", tp, gpus)
			continue
		}
		for _, pp := range ppCandidates(model, gpus/tp, opt.PP) {
			base := Plan{TP: tp, PP: pp}
			if (gpus/tp)%pp != 0 {
				reject(base, ReasonGPUsNotDivisible, "tp %d × pp %d does not divide %d GPUs", tp, pp, gpus)
				continue
			}
			if pp > model.Layers {
				reject(base, ReasonLayersNotDivisible, "pp %d exceeds %d layers", pp, model.Layers)
				continue
			}
			if model.Layers%pp != 0 && !opt.AllowUnevenPipeline {
				reject(base, ReasonLayersNotDivisible, "pp %d does not divide %d layers (allow an uneven pipeline to try it)", pp, model.Layers)
				continue
			}
			dp := gpus / (tp * pp)
			base.DP = dp
			if opt.DP > 0 && dp != opt.DP {
				reject(base, ReasonGPUsNotDivisible, "tp %d × pp %d × dp %d = %d, not %d GPUs", tp, pp, opt.DP, tp*pp*opt.DP, gpus)
				continue
			}
			// Model state alone (micro-batch 1, no activations) must fit.
			state := c.stateBytes(base)
			if state > hw.HBMBytes {
				rejected = append(rejected, Rejection{Plan: base, Reason: ReasonOutOfMemory, MemPerGPUBytes: state,
					Detail: fmt.Sprintf("model state alone needs %s of %s", FormatBytes(state), FormatBytes(hw.HBMBytes))})
				continue
			}
		mbs:
			for _, mbs := range mbsList {
				p := base
				p.MicroBatch = mbs
				if opt.Training.GlobalBatch%(dp*mbs) != 0 {
					reject(p, ReasonBatchNotDivisible, "global batch %d is not divisible by dp %d × micro-batch %d", opt.Training.GlobalBatch, dp, mbs)
					continue
				}
				p.NumMicroBatches = opt.Training.GlobalBatch / (dp * mbs)
				for v := 1; v <= maxV; v++ {
					q := p
					q.VirtualStages = v
					if v > 1 {
						if pp < 2 || model.Layers%(pp*v) != 0 {
							continue // not a candidate shape; not worth a line
						}
						if q.NumMicroBatches%pp != 0 {
							reject(q, ReasonInterleaveImpossible, "%d micro-batches are not a multiple of pp %d", q.NumMicroBatches, pp)
							continue
						}
					}
					ev := c.evaluate(q)
					if !ev.Fits {
						e := ev
						rejected = append(rejected, Rejection{Plan: q, Reason: ReasonOutOfMemory, Evaluation: &e, MemPerGPUBytes: ev.MemPerGPUBytes,
							Detail: fmt.Sprintf("needs %s of %s", FormatBytes(ev.MemPerGPUBytes), FormatBytes(hw.HBMBytes))})
						if v == 1 {
							// Interleaving only adds activation memory and a
							// larger micro-batch only adds more: none will fit.
							break mbs
						}
						continue
					}
					ranked = append(ranked, ev)
				}
			}
		}
	}

	slices.SortFunc(ranked, func(a, b Evaluation) int {
		return cmp.Or(
			cmp.Compare(a.StepSeconds, b.StepSeconds),
			cmp.Compare(a.MemPerGPUBytes, b.MemPerGPUBytes),
			cmp.Compare(a.TP, b.TP), cmp.Compare(a.PP, b.PP),
			cmp.Compare(a.MicroBatch, b.MicroBatch), cmp.Compare(a.VirtualStages, b.VirtualStages))
	})
	if opt.Top > 0 && len(ranked) > opt.Top {
		best := ranked[0].StepSeconds
		for _, ev := range ranked[opt.Top:] {
			e := ev
			rejected = append(rejected, Rejection{Plan: ev.Plan, Reason: ReasonSlower, Evaluation: &e,
				Detail: fmt.Sprintf("slower by %.1f%%", (ev.StepSeconds/best-1)*100)})
		}
		ranked = ranked[:opt.Top]
	}
	return ranked, rejected
}

// stateBytes is weights + gradients + optimizer state + reserve for a
// (tp, pp, dp), the memory no micro-batch choice can reduce.
func (c Config) stateBytes(p Plan) int64 {
	lmax := (c.Model.Layers + p.PP - 1) / p.PP
	n := c.paramsPerGPU(p, lmax)
	d := float64(p.DP)
	tu := c.Tunables
	w, g, o := n*tu.ParamBytes, n*tu.GradBytes, n*tu.OptimizerBytes
	if c.Training.ZeROStage >= 1 {
		o /= d
	}
	if c.Training.ZeROStage >= 2 {
		g /= d
	}
	if c.Training.ZeROStage >= 3 {
		w /= d
	}
	return int64(w) + int64(g) + int64(o) + tu.ReservedBytes
}

// tpCandidates are powers of two up to the head count (or the fixed tp).
func tpCandidates(m Model, gpus, fixed int) []int {
	if fixed > 0 {
		return []int{fixed}
	}
	var out []int
	for tp := 1; tp <= min(m.Heads, gpus); tp *= 2 {
		out = append(out, tp)
	}
	return out
}

// ppCandidates are the divisors of the GPUs left after tp, up to the layer
// count (or the fixed pp).
func ppCandidates(m Model, rest, fixed int) []int {
	if fixed > 0 {
		return []int{fixed}
	}
	var out []int
	for _, d := range divisors(rest) {
		if d > m.Layers {
			break
		}
		out = append(out, d)
	}
	return out
}
