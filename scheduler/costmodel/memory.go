package costmodel

// blockActivation is what one block stores for the backward pass, per
// micro-batch, following Korthikanti et al. 2022 (Table 2) element by
// element: norm inputs, GEMM inputs, q/k/v, the attention output, the MLP
// intermediate values and dropout masks; with unfused attention also the
// softmax output (and its dropout). Sequence parallelism splits what
// tensor parallelism does not. For GPT-3 shapes this is s·b·h·(34 +
// 5·a·s/h) without parallelism.
func (e *engine) blockActivation(r Recompute) float64 {
	m, tr := e.c.Model, e.c.Training
	t, T := e.t, e.tok
	h, f := float64(m.Hidden), float64(m.ffn())
	kv := float64(m.kvHeads()) * h / float64(m.Heads)
	hs := h
	if tr.SequenceParallel {
		hs = h / t
	}
	if r == RecomputeFull {
		return T * 2 * hs // the block's input only
	}
	mask := 0.0
	if m.Dropout {
		mask = hs
	}
	in := 1.0
	if m.GatedMLP {
		in = 2
	}
	perTok := 2*hs + 2*hs + 2*h/t + 4*kv/t + 2*h/t + mask // attention
	perTok += 2*hs + 2*hs + 2*in*f/t + 2*f/t + mask       // MLP
	if tr.attention() == AttentionUnfused && r != RecomputeSelective {
		per := 2.0
		if m.Dropout {
			per = 5
		}
		perTok += per * float64(m.Heads) / t * float64(m.SeqLen)
	}
	return T * perTok
}

// memory fills ev's memory terms for the fullest stage: model state under
// the ZeRO stage, the activations of every micro-batch the schedule keeps
// in flight on each chunk, communication buffers, the reserve and the
// fragmentation allowance.
func (e *engine) memory(ev *Evaluation) {
	c, p, tu, m := e.c, e.p, e.c.Tunables, e.c.Model
	g, _ := c.dpGroup(p)
	zero := c.Training.ZeROStage
	h := float64(m.Hidden)
	hs := h
	if c.Training.SequenceParallel {
		hs = h / e.t
	}
	blk := e.blockActivation(c.Training.Recompute)
	full := 0.0
	if c.Training.Recompute == RecomputeFull {
		// Recomputing one block in the backward pass needs its full
		// activations once more.
		full = e.blockActivation(RecomputeNone)
	}
	embAct := e.tok * 3 * hs
	outAct := e.tok * (2*hs + 2*h + 6*float64(m.Vocab)/e.t)
	last := len(e.lay.seg) - 1

	var buffers float64
	if p.PP > 1 {
		buffers += 4 * e.tok * h * 2 / e.t // send and receive, both directions
	}
	if p.cp() > 1 {
		kv := float64(m.kvHeads()) * h / float64(m.Heads)
		buffers += 2 * e.tok * 2 * kv / e.t * 2
	}
	if zero == 3 && g > 1 {
		buffers += e.zero3Live() / e.t * tu.ParamBytes
	}
	frag := float64(c.Hardware.HBMBytes) * tu.FragmentationPercent / 100

	layers := e.lay.stageLayers()
	best := -1.0
	for r := range p.PP {
		n := e.stageParams(r, layers[r])
		w, gr, o := c.shardedState(n, g)
		var act float64
		for j := range p.VirtualStages {
			k := j*p.PP + r
			a := float64(e.lay.seg[k]) * blk
			if k == 0 {
				a += embAct
			}
			if k == last {
				a += outAct
			}
			act += float64(e.lay.inFlight(r, j, p.NumMicroBatches)) * a
		}
		if layers[r] > 0 {
			act += full
		}
		total := w + gr + o + act + buffers + float64(tu.ReservedBytes) + frag
		if total > best {
			best = total
			ev.MemoryStage = r
			ev.WeightBytes, ev.GradBytes, ev.OptimizerB = int64(w), int64(gr), int64(o)
			ev.ActivationB = int64(act)
		}
	}
	ev.CommBufferBytes = int64(buffers)
	ev.ReservedBytes = tu.ReservedBytes
	ev.FragmentationBytes = int64(frag)
	ev.MemPerGPUBytes = ev.WeightBytes + ev.GradBytes + ev.OptimizerB + ev.ActivationB + ev.CommBufferBytes + ev.ReservedBytes + ev.FragmentationBytes
	ev.Fits = ev.MemPerGPUBytes <= c.Hardware.HBMBytes
}

// zero3Live is how many parameters ZeRO-3 keeps gathered at once: the
// block being computed and the prefetched next, but no more than
// zero3_live_params (DeepSpeed's stage3_max_live_parameters) unless one
// weight matrix alone is larger — a parameter is gathered whole.
func (e *engine) zero3Live() float64 {
	m := e.c.Model
	h, f := float64(m.Hidden), float64(m.ffn())
	kv := float64(m.kvHeads()) * h / float64(m.Heads)
	in := 1.0
	if m.GatedMLP {
		in = 2
	}
	largest := max(h*(h+2*kv), in*h*f)
	live := 2 * m.LayerParams()
	if cap := e.c.Tunables.ZeRO3LiveParams; cap > 0 {
		live = min(live, cap)
	}
	return max(live, largest)
}

// stateBytes is weights + gradients + optimizer state + reserves of the
// fullest stage under the plain schedule, the memory no micro-batch choice
// can reduce.
func (c Config) stateBytes(p Plan) int64 {
	p.CP = max(p.CP, 1)
	e := &engine{c: c, p: p, lay: newLayout(c.Model.Layers, p.PP, 1), t: float64(p.TP), cp: float64(p.CP)}
	g, _ := c.dpGroup(p)
	tu := c.Tunables
	var most float64
	for r, l := range e.lay.stageLayers() {
		n := e.stageParams(r, l)
		w, gr, o := c.shardedState(n, g)
		most = max(most, w+gr+o)
	}
	frag := float64(c.Hardware.HBMBytes) * tu.FragmentationPercent / 100
	return int64(most) + tu.ReservedBytes + int64(frag)
}

// shardedState is the weights, gradients and optimizer state of n
// parameters on one GPU, each divided over the data-parallel group g from
// the ZeRO stage that shards it (1: optimizer, 2: gradients, 3: weights).
func (c Config) shardedState(n float64, g int) (w, gr, o float64) {
	tu, zero, gd := c.Tunables, c.Training.ZeROStage, float64(g)
	w, gr, o = n*tu.ParamBytes, n*tu.GradBytes, n*tu.OptimizerBytes
	if zero >= 1 {
		o /= gd
	}
	if zero >= 2 {
		gr /= gd
	}
	if zero >= 3 {
		w /= gd
	}
	return w, gr, o
}
