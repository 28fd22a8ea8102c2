package costmodel

import "math"

// stepTimes is the step of a plan, put together from the engine's costs.
type stepTimes struct {
	step, pipe float64
	// busy is the stage whose micro-batch time bounds the pipeline; tail
	// the stage whose post-pipeline work (gradient reduction, optimizer)
	// finishes last.
	busy, tail int
	perStage   []float64 // per micro-batch, each stage
	m          float64

	// Of the tail stage: the data-parallel gradient reduction and
	// parameter gather, ZeRO-3's gathers and scatters, the optimizer.
	gradComm, gradExp, paramComm, paramExp, z3Comm, z3Exp, opt float64
}

// stageKernels returns a stage's kernel time and forward kernel time per
// micro-batch, and its blocks.
func (e *engine) stageKernels(r int, layers int) (kern, fwd float64) {
	kern = float64(layers) * e.blk.kernels()
	fwd = float64(layers) * e.blk.fwd
	if r == 0 {
		kern += e.emb.gemm + e.emb.elem
		fwd += e.emb.fwd
	}
	if r == e.p.PP-1 {
		kern += e.out.gemm + e.out.elem
		fwd += e.out.fwd
	}
	return kern, fwd
}

// stageTime is a stage's time per micro-batch: its kernels plus exposed
// tensor-, context-parallel and pipeline communication.
func (e *engine) stageTime(r, layers int) float64 {
	t := float64(layers) * e.blk.total()
	if r == 0 {
		t += e.emb.total()
	}
	if r == e.p.PP-1 {
		t += e.out.total()
	}
	return t + float64(e.p.VirtualStages)*e.p2pE
}

// stageParams is the parameter count one GPU of stage r holds before any
// ZeRO sharding: its blocks, the embedding table on the first stage, the
// output layer on the last (a second copy of tied embeddings when the two
// are on different stages), split over tp.
func (e *engine) stageParams(r, layers int) float64 {
	m := e.c.Model
	n := float64(layers) * m.LayerParams()
	vh := float64(m.Vocab) * float64(m.Hidden)
	if r == 0 {
		n += vh
		if m.LearnedPositions {
			n += float64(m.SeqLen) * float64(m.Hidden)
		}
	}
	if r == e.p.PP-1 {
		if !m.TiedEmbeddings || e.p.PP > 1 {
			n += vh
		}
		n += float64(m.Hidden)
	}
	return n / e.t
}

// step puts the stages together under the 1F1B schedule. With m
// micro-batches and per-micro-batch stage times C_r, the plain schedule
// takes Σ C_r + (m−1)·max C_r (fill, steady state, drain: (m + p − 1)·C
// when the stages are equal), the interleaved one m·max C_r +
// (Σ C_r − max C_r)/v. Then the gradient reduction and the optimizer step
// finish the step on every stage; the last to finish bounds it.
func (e *engine) step() stepTimes {
	c, p, tu := e.c, e.p, e.c.Tunables
	st := stepTimes{m: float64(p.NumMicroBatches), perStage: make([]float64, p.PP)}
	layers := e.lay.stageLayers()
	var sum, cmax float64
	for r := range p.PP {
		st.perStage[r] = e.stageTime(r, layers[r])
		sum += st.perStage[r]
		if st.perStage[r] > cmax {
			cmax, st.busy = st.perStage[r], r
		}
	}
	st.pipe = st.m*cmax + (sum-cmax)/float64(p.VirtualStages)

	g, k := c.dpGroup(p)
	zero := c.Training.ZeROStage
	var tailMax float64
	for r := range p.PP {
		n := e.stageParams(r, layers[r])
		kern, fwd := e.stageKernels(r, layers[r])
		bwd := kern - fwd
		var gradComm, gradExp, paramComm, paramExp, z3Comm, z3Exp float64
		switch {
		case g <= 1:
		case zero == 3:
			// Every micro-batch gathers the parameters for the forward
			// pass and again for the backward pass, and reduce-scatters
			// its gradients: per-layer collectives that reach only a share
			// of the ring's bandwidth.
			per := (2*c.ring(n*tu.ParamBytes, g, k)+c.ring(n*tu.GradBytes, g, k))/tu.ZeRO3Efficiency +
				float64(layers[r])*float64(g-1)*tu.ZeRO3Latency.Seconds()
			z3Comm = st.m * per
			z3Exp = math.Max(0, z3Comm-tu.ZeRO3Overlap*st.m*kern)
		case zero >= 1:
			// Reduce-scatter of the gradients after the last backward pass,
			// all-gather of the updated parameters before the next forward.
			gradComm = c.ring(n*tu.GradBytes, g, k)
			paramComm = c.ring(n*tu.ParamBytes, g, k)
			gradExp = math.Max(0, gradComm-tu.DPGradOverlap*bwd)
			paramExp = math.Max(0, paramComm-tu.DPParamOverlap*fwd)
		default:
			gradComm = 2 * c.ring(n*tu.GradBytes, g, k)
			gradExp = math.Max(0, gradComm-tu.DPGradOverlap*bwd)
		}
		shard := 1.0
		if zero >= 1 {
			shard = float64(g)
		}
		// Adam reads fp32 gradients, master weights and both moments and
		// writes all but the gradients plus the bf16 weights: 28 bytes per
		// parameter it owns.
		opt := c.elemTime(n / shard * 28)
		if tail := gradExp + paramExp + z3Exp + opt; tail > tailMax || r == 0 {
			tailMax, st.tail = tail, r
			st.gradComm, st.gradExp, st.paramComm, st.paramExp = gradComm, gradExp, paramComm, paramExp
			st.z3Comm, st.z3Exp, st.opt = z3Comm, z3Exp, opt
		}
	}
	st.step = st.pipe + tailMax + c.Hardware.StepOverheadSec
	return st
}

// fill copies the step's breakdown into ev: kernel and communication time
// of the busiest stage over all micro-batches, the bubble, and the tail
// stage's reduction and optimizer step.
func (st stepTimes) fill(ev *Evaluation, e *engine) {
	layers := e.lay.stageLayers()
	r := st.busy
	l := float64(layers[r])
	m := st.m
	b := e.blk
	ev.GEMMSec = m * l * b.gemm
	ev.AttentionSec = m * l * b.attn
	ev.ElementwiseSec = m * l * b.elem
	ev.RecomputeSec = m * l * b.recompute
	ev.TPCommSec = m * l * b.tpComm
	ev.TPExposedSec = m * l * b.tpExp
	ev.CPCommSec = m * l * b.cpComm
	ev.CPExposedSec = m * l * b.cpExp
	if r == 0 {
		ev.GEMMSec += m * e.emb.gemm
		ev.ElementwiseSec += m * e.emb.elem
		ev.TPCommSec += m * e.emb.tpComm
		ev.TPExposedSec += m * e.emb.tpExp
	}
	if r == e.p.PP-1 {
		ev.GEMMSec += m * e.out.gemm
		ev.ElementwiseSec += m * e.out.elem
		ev.TPCommSec += m * e.out.tpComm
		ev.TPExposedSec += m * e.out.tpExp
	}
	ev.ComputeSec = ev.GEMMSec + ev.AttentionSec + ev.ElementwiseSec
	v := float64(e.p.VirtualStages)
	ev.PPCommSec = m * v * e.p2p
	ev.PPExposedSec = m * v * e.p2pE
	ev.BubbleSec = st.pipe - m*st.perStage[r]
	ev.DPGradCommSec, ev.DPGradExposedSec = st.gradComm, st.gradExp
	ev.DPParamCommSec, ev.DPParamExposedSec = st.paramComm, st.paramExp
	ev.DPCommSec, ev.DPExposedSec = st.gradComm+st.paramComm, st.gradExp+st.paramExp
	ev.ZeRO3CommSec, ev.ZeRO3ExposedSec = st.z3Comm, st.z3Exp
	ev.OptimizerSec = st.opt
	ev.StepOverheadSec = e.c.Hardware.StepOverheadSec
	// FLOP-weighted GEMM efficiency of one block: FLOPs over the time they
	// take against peak.
	if b.gemm > 0 {
		ev.GEMMEfficiency = b.flops / (b.gemm * e.c.peakFLOPs())
	}
	ev.StageLayers = layers
	for _, n := range layers {
		ev.LayersPerStage = max(ev.LayersPerStage, n)
	}
}
