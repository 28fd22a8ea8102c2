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
	ReasonSeqNotDivisible      Reason = "sequence not divisible by cp"
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
	// TP, CP, PP and DP fix a dimension when positive.
	TP, CP, PP, DP int
	// MaxCP bounds context parallelism tried (powers of two); 0 tries it
	// while each rank keeps at least 4K tokens of the sequence, up to 16.
	MaxCP int
	// MicroBatchSizes are the micro-batch sizes tried; nil means 1, 2, 4, 8.
	MicroBatchSizes []int
	// MaxVirtualStages bounds interleaving; 0 means 1 (no interleaving).
	MaxVirtualStages int
	// AllowUnevenPipeline lets pp·v not divide the layer count: the first
	// and last stages then also count the embedding and output layers
	// (see newLayout), with or without interleaving.
	AllowUnevenPipeline bool
	// Top keeps only the best Top plans in ranked; the rest become
	// ReasonSlower rejections. 0 keeps all.
	Top int
}

// Search enumerates tp (powers of two within a node that divide the heads)
// × cp (for long sequences) × pp × dp = gpus/(tp·cp·pp) × micro-batch size
// × interleaving, keeps the plans that fit in memory, and ranks them by
// predicted step time (fastest first), or by the step time failures make
// when an MTBF is set. Every plan or family of plans that lost is in
// rejected, with why.
//
// Pruning: a (tp, cp, pp, dp) whose model state alone overflows the GPU
// skips all its micro-batch sizes, and a micro-batch size that overflows
// with the plain schedule ends the larger ones (activations only grow with
// it).
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
	layers := model.Layers

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
		for _, cp := range cpCandidates(model, gpus/tp, opt) {
			base := Plan{TP: tp, CP: cp}
			if (gpus/tp)%cp != 0 {
				reject(base, ReasonGPUsNotDivisible, "tp %d × cp %d does not divide %d GPUs", tp, cp, gpus)
				continue
			}
			if model.SeqLen%(2*cp) != 0 && cp > 1 {
				reject(base, ReasonSeqNotDivisible, "cp %d needs the sequence length %d to split into 2×%d chunks", cp, model.SeqLen, cp)
				continue
			}
			for _, pp := range ppCandidates(model, gpus/(tp*cp), opt.PP) {
				base := Plan{TP: tp, CP: cp, PP: pp}
				if (gpus/(tp*cp))%pp != 0 {
					reject(base, ReasonGPUsNotDivisible, "tp %d × cp %d × pp %d does not divide %d GPUs", tp, cp, pp, gpus)
					continue
				}
				if pp > layers {
					reject(base, ReasonLayersNotDivisible, "pp %d exceeds %d layers", pp, layers)
					continue
				}
				if layers%pp != 0 && !opt.AllowUnevenPipeline {
					reject(base, ReasonLayersNotDivisible, "pp %d does not divide %d layers (allow an uneven pipeline to try it)", pp, layers)
					continue
				}
				dp := gpus / (tp * cp * pp)
				base.DP = dp
				if opt.DP > 0 && dp != opt.DP {
					reject(base, ReasonGPUsNotDivisible, "tp %d × cp %d × pp %d × dp %d = %d, not %d GPUs", tp, cp, pp, opt.DP, tp*cp*pp*opt.DP, gpus)
					continue
				}
				// Model state alone (no activations) must fit.
				if state := c.stateBytes(base); state > hw.HBMBytes {
					rejected = append(rejected, Rejection{Plan: base, Reason: ReasonOutOfMemory, MemPerGPUBytes: state,
						Detail: fmt.Sprintf("model state alone needs %s of %s", FormatBytes(state), FormatBytes(hw.HBMBytes))})
					continue
				}
				ranked, rejected = c.searchMicroBatches(base, mbsList, maxV, opt, ranked, rejected)
			}
		}
	}

	key := func(e *Evaluation) float64 {
		if e.Goodput != nil {
			return e.Goodput.EffectiveStepSec
		}
		return e.StepSeconds
	}
	slices.SortFunc(ranked, func(a, b Evaluation) int {
		return cmp.Or(
			cmp.Compare(key(&a), key(&b)),
			cmp.Compare(a.MemPerGPUBytes, b.MemPerGPUBytes),
			cmp.Compare(a.TP, b.TP), cmp.Compare(a.CP, b.CP), cmp.Compare(a.PP, b.PP),
			cmp.Compare(a.MicroBatch, b.MicroBatch), cmp.Compare(a.VirtualStages, b.VirtualStages))
	})
	if opt.Top > 0 && len(ranked) > opt.Top {
		best := key(&ranked[0])
		for _, ev := range ranked[opt.Top:] {
			e := ev
			rejected = append(rejected, Rejection{Plan: ev.Plan, Reason: ReasonSlower, Evaluation: &e,
				Detail: fmt.Sprintf("slower by %.1f%%", (key(&e)/best-1)*100)})
		}
		ranked = ranked[:opt.Top]
	}
	return ranked, rejected
}

// searchMicroBatches tries every micro-batch size and interleaving of one
// (tp, cp, pp, dp).
func (c Config) searchMicroBatches(base Plan, mbsList []int, maxV int, opt Options, ranked []Evaluation, rejected []Rejection) ([]Evaluation, []Rejection) {
	layers, dp, pp := c.Model.Layers, base.DP, base.PP
	hw := c.Hardware
mbs:
	for _, mbs := range mbsList {
		p := base
		p.MicroBatch = mbs
		if c.Training.GlobalBatch%(dp*mbs) != 0 {
			rejected = append(rejected, Rejection{Plan: p, Reason: ReasonBatchNotDivisible,
				Detail: fmt.Sprintf("global batch %d is not divisible by dp %d × micro-batch %d", c.Training.GlobalBatch, dp, mbs)})
			continue
		}
		p.NumMicroBatches = c.Training.GlobalBatch / (dp * mbs)
		for _, v := range virtualCandidates(layers, pp, maxV) {
			q := p
			q.VirtualStages = v
			if v > 1 {
				even := layers%(pp*v) == 0
				if pp < 2 || (!even && !opt.AllowUnevenPipeline) || pp*v > layers+2 {
					continue // not a candidate shape; not worth a line
				}
				if q.NumMicroBatches%pp != 0 {
					rejected = append(rejected, Rejection{Plan: q, Reason: ReasonInterleaveImpossible,
						Detail: fmt.Sprintf("%d micro-batches are not a multiple of pp %d", q.NumMicroBatches, pp)})
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
			// Only plans that fit carry their overlap terms: the search
			// evaluates many more than it ranks.
			ev.Overlaps = c.Tunables.overlaps(&ev)
			ranked = append(ranked, ev)
		}
	}
	return ranked, rejected
}

// virtualCandidates are the interleavings tried on a pp-stage pipeline:
// 1 to maxV, and the one-block-per-chunk layouts beyond it, with pp·v equal
// to the layers (Megatron-Core's published H100 runs) or to the layers plus
// the embedding and output layers as chunks of their own (Llama 3 405B:
// 126 layers on 16 stages × 8 chunks). Those are the finest interleavings,
// with the smallest bubble, so a bound on v must not hide them.
func virtualCandidates(layers, pp, maxV int) []int {
	out := make([]int, 0, maxV+2)
	for v := 1; v <= maxV; v++ {
		out = append(out, v)
	}
	for _, chunks := range []int{layers, layers + 2} {
		if v := chunks / pp; chunks%pp == 0 && v > maxV && !slices.Contains(out, v) {
			out = append(out, v)
		}
	}
	return out
}

// cpCandidates are the fixed cp, or 1 and powers of two that leave each
// rank at least 4K tokens of the sequence (NeMo's recipes split 8K
// sequences in two), up to 16, or up to MaxCP.
func cpCandidates(m Model, rest int, opt Options) []int {
	if opt.CP > 0 {
		return []int{opt.CP}
	}
	limit := opt.MaxCP
	if limit == 0 {
		limit = min(16, m.SeqLen/4096)
	}
	out := []int{1}
	for cp := 2; cp <= limit && cp <= rest; cp *= 2 {
		out = append(out, cp)
	}
	return out
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
