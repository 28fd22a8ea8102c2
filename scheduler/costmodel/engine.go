package costmodel

import (
	"math"
)

// engine holds what the time and memory terms of one normalised plan
// share, computed once: the layout, one block's costs, and the costs of
// the embedding and output layers.
type engine struct {
	c   Config
	p   Plan
	lay layout
	t   float64 // tp
	cp  float64
	tok float64 // tokens one GPU processes per micro-batch: b·s/cp

	blk  blockCost
	emb  extraCost // embedding (segment 0)
	out  extraCost // final norm, logits, loss (last segment)
	p2p  float64   // pipeline send/recv per chunk per micro-batch, fwd+bwd
	p2pE float64   // exposed part
}

// blockCost is one transformer block for one micro-batch on one GPU.
type blockCost struct {
	gemm, attn, elem float64 // forward + backward (+ recomputation) kernel time
	fwd              float64 // forward kernels only (overlap windows)
	recompute        float64 // the part of the kernel time recomputation adds
	flops, gemmFLOPs float64 // GEMM FLOPs done, and at 100% of peak the time they take
	tpComm, tpExp    float64
	cpComm, cpExp    float64
}

func (b blockCost) kernels() float64 { return b.gemm + b.attn + b.elem }
func (b blockCost) total() float64   { return b.kernels() + b.tpExp + b.cpExp }

// extraCost is the embedding or the output layer for one micro-batch.
type extraCost struct {
	gemm, elem, fwd float64
	tpComm, tpExp   float64
}

func (e extraCost) total() float64 { return e.gemm + e.elem + e.tpExp }

func (c Config) engine(p Plan) *engine {
	m := c.Model
	e := &engine{c: c, p: p, lay: newLayout(m.Layers, p.PP, p.VirtualStages),
		t: float64(p.TP), cp: float64(p.cp())}
	e.tok = float64(p.MicroBatch) * float64(m.SeqLen) / e.cp
	e.blk = e.block()
	e.emb, e.out = e.embedding(), e.output()
	if p.PP > 1 {
		// One activation forward and one gradient backward per chunk,
		// sharded over the tp ranks (scatter/gather, or sequence
		// parallelism): b·s·h/(cp·tp) bf16 values each.
		bytes := e.tok * float64(m.Hidden) * 2 / e.t
		e.p2p = 2 * bytes / c.p2pBandwidth(p) * c.Tunables.CommScale
		e.p2pE = (1 - c.Tunables.PPOverlap) * e.p2p
	}
	return e
}

// gemmTime is one GEMM of M×K by K×N at its shape's efficiency, and the
// FLOPs it does: in FP8 at the FP8 peak and its own efficiency, otherwise
// in bf16.
func (c Config) gemmTime(m, n, k float64, fp8 bool) (sec, flops float64) {
	hw := c.Hardware
	peak, top := hw.PeakTFLOPS*1e12, hw.GEMMEfficiency
	if fp8 {
		peak, top = hw.PeakFP8TFLOPS*1e12, hw.FP8GEMMEfficiency
	}
	x0 := hw.GEMMHalfDim
	eff := top * m / (m + x0) * n / (n + x0) * k / (k + x0) * c.Tunables.computeScale()
	eff = min(eff, 1)
	flops = 2 * m * n * k
	return flops / (peak * eff), flops
}

// elemTime is the time element-wise kernels take to move bytes.
func (c Config) elemTime(bytes float64) float64 {
	return bytes / (c.Hardware.HBMBytesPerSec * min(c.Hardware.ElementwiseEfficiency*c.Tunables.computeScale(), 1))
}

// block computes one transformer block's kernel and communication time for
// one micro-batch on one GPU: the GEMMs (forward; the backward's two
// GEMMs per weight have the same shapes), attention, the element-wise
// kernels, and recomputation.
func (e *engine) block() blockCost {
	c, m, tr := e.c, e.c.Model, e.c.Training
	t, T := e.t, e.tok
	h, f := float64(m.Hidden), float64(m.ffn())
	kv := float64(m.kvHeads()) * h / float64(m.Heads)
	fp8 := tr.Precision == PrecisionFP8
	bf16 := c.Hardware.PeakTFLOPS * 1e12
	var b blockCost

	// GEMMs, forward: QKV, attention output, MLP in (gate and up fused),
	// MLP out. The backward pass runs each shape twice (data and weight
	// gradients).
	in := 1.0
	if m.GatedMLP {
		in = 2
	}
	var gf, fl float64
	for _, g := range [][3]float64{{T, (h + 2*kv) / t, h}, {T, h, h / t}, {T, in * f / t, h}, {T, h, f / t}} {
		s, n := c.gemmTime(g[0], g[1], g[2], fp8)
		gf += s
		fl += n
	}

	// Attention core, forward.
	var af, aRe, scoreBytesF, scoreBytesB float64
	s := float64(m.SeqLen)
	heads := float64(m.Heads) / t
	dh := h / float64(m.Heads)
	b0 := float64(e.p.MicroBatch)
	if tr.attention() == AttentionFlash {
		// Causal attention does half of 4·b·s²·h/tp, split over cp ranks.
		aflops := 2 * b0 * s * s * (h / t) / e.cp
		af = aflops / (bf16 * min(c.Hardware.FlashAttentionEfficiency*c.Tunables.computeScale(), 1))
	} else {
		// Batched GEMMs per head over the whole (masked) square, then a
		// materialised scale-mask-softmax and dropout on b·a/tp·s² scores.
		qk, _ := c.gemmTime(s/e.cp, s, dh, false)
		av, _ := c.gemmTime(s/e.cp, dh, s, false)
		af = b0 * heads * (qk + av)
		scores := b0 * heads * s / e.cp * s
		perF, perB := 4.0, 6.0
		if m.Dropout {
			perF, perB = 9, 11
		}
		scoreBytesF, scoreBytesB = scores*perF, scores*perB
		af += c.elemTime(scoreBytesF)
		aRe = af // selective recomputation reruns exactly this
	}
	ab := 2 * af
	if tr.attention() == AttentionFlash {
		// FlashAttention's backward recomputes the scores: five GEMMs
		// against two forward.
		ab = 2.5 * af
	} else {
		ab = 2*(af-c.elemTime(scoreBytesF)) + c.elemTime(scoreBytesB)
	}

	// Element-wise kernels per token, forward: two norms (read, write),
	// two fused bias-dropout-residual adds (two reads, one write, a mask),
	// the MLP activation, rotary embeddings on q and k. Norms and residual
	// adds run on the sequence-parallel shard, or whole on every tp rank
	// without sequence parallelism. The backward pass moves about twice.
	hs := h
	if tr.SequenceParallel {
		hs = h / t
	}
	perTok := 2 * 2 * (2 * hs)
	resid := 3 * hs * 2
	if m.Dropout {
		resid += hs
	}
	perTok += 2 * resid
	if m.GatedMLP {
		perTok += 3 * f / t * 2
	} else {
		perTok += 2 * f / t * 2
	}
	if !m.LearnedPositions {
		perTok += 2 * (h + kv) / t * 2
	}
	ef := c.elemTime(T * perTok)

	// FP8 GEMMs take their operands in FP8, each cast and transposed (the
	// backward GEMMs need the other layout) from bf16: read 2 bytes, write
	// 1 + 1 per element. Forward: the inputs of the four GEMMs (the
	// normed ones cast on the sequence-parallel shard, before the
	// all-gather); backward: the gradients of their outputs. Weights are
	// cast once per step (Transformer Engine keeps the FP8 copy across
	// micro-batches): left out, a fraction of a percent of these steps.
	var castF, castB float64
	if fp8 {
		castF = c.elemTime(T * 4 * (hs + h/t + hs + f/t))
		castB = c.elemTime(T * 4 * ((h+2*kv)/t + hs + in*f/t + hs))
	}

	// Fixed per-pass overhead goes with the element-wise kernels.
	ov := c.Hardware.BlockOverheadSec
	ef += ov
	fwd := gf + af + ef + castF
	b.fwd = fwd
	b.gemm = 3 * gf
	b.attn = af + ab
	b.elem = 3*ef + castF + castB
	b.flops = 3 * fl
	switch tr.Recompute {
	case RecomputeFull:
		b.gemm += gf
		b.attn += af
		b.elem += ef + castF
		b.recompute = fwd
		b.flops += fl
	case RecomputeSelective:
		b.attn += aRe
		b.recompute = aRe
	}

	// Tensor parallelism: all-reduces (or all-gather + reduce-scatter with
	// sequence parallelism, the same volume) of the b·s·h activation, two
	// forward and two backward; sequence parallelism gathers the block
	// inputs again in the backward pass (one more); full recomputation
	// repeats the forward two.
	if e.p.TP > 1 {
		n := 4.0
		if tr.SequenceParallel {
			n++
		}
		if tr.Recompute == RecomputeFull {
			n += 2
		}
		b.tpComm = n * c.allReduceNVLink(T*h*2, e.p.TP)
		b.tpExp = (1 - c.Tunables.TPOverlap) * b.tpComm
	}
	// Context parallelism: ring attention passes every rank's keys and
	// values around the cp ring in the forward pass, and keys, values and
	// their gradients in the backward pass, overlapped with the attention
	// blocks it feeds.
	if e.p.cp() > 1 {
		c1 := float64(e.p.cp())
		vol := 3 * (c1 - 1) * T * 2 * kv / t * 2
		b.cpComm = vol / c.cpBandwidth(e.p) * c.Tunables.CommScale
		b.cpExp = math.Max(0, b.cpComm-c.Tunables.CPOverlap*b.attn)
	}
	return b
}

// embedding is the vocabulary-parallel lookup on segment 0: a gather and
// its scatter-add gradient (memory-bound), and one tensor-parallel
// reduction of its output.
func (e *engine) embedding() extraCost {
	c, m := e.c, e.c.Model
	h := float64(m.Hidden)
	var x extraCost
	x.elem = c.elemTime(e.tok * h * 2 * 4)
	x.fwd = x.elem / 2
	if e.p.TP > 1 {
		x.tpComm = c.allReduceNVLink(e.tok*h*2, e.p.TP)
		x.tpExp = (1 - c.Tunables.TPOverlap) * x.tpComm
	}
	return x
}

// output is the final norm, the vocabulary-parallel logits GEMM and the
// fp32 cross-entropy on the last segment.
func (e *engine) output() extraCost {
	c, m := e.c, e.c.Model
	h, t := float64(m.Hidden), e.t
	var x extraCost
	g, _ := c.gemmTime(e.tok, float64(m.Vocab)/t, h, false)
	x.gemm = 3 * g
	// Vocabulary-parallel cross-entropy in fp32, pass by pass: upcast
	// (read 2, write 4), max (4), subtract (8), exp (8), sum (4),
	// normalise (8); backward: subtract the target (8), scale (8), cast
	// back (6): 60 bytes per logit. Plus the final norm.
	x.elem = c.elemTime(e.tok*float64(m.Vocab)/t*60 + e.tok*h*2*6)
	x.fwd = g + x.elem/3
	if e.p.TP > 1 {
		x.tpComm = c.allReduceNVLink(e.tok*h*2, e.p.TP)
		x.tpExp = (1 - c.Tunables.TPOverlap) * x.tpComm
	}
	return x
}

// allReduceNVLink is a ring all-reduce of bytes inside one node: each GPU
// moves 2(n−1)/n of them over NVLink.
func (c Config) allReduceNVLink(bytes float64, n int) float64 {
	if n <= 1 {
		return 0
	}
	nf := float64(n)
	return 2 * (nf - 1) / nf * bytes / (c.Hardware.NVLinkBytesPerSec * c.Hardware.NVLinkEfficiency) * c.Tunables.CommScale
}

// ring is the time of a ring all-gather or reduce-scatter over a group of
// g GPUs, k of them in each node, of bytes per GPU (the full, unsharded
// size). NCCL runs one ring per NIC, so across nodes each GPU's own NIC
// carries 1/k of the traffic while NVLink carries the hops inside the
// node; the two are pipelined and the slower bounds the time.
func (c Config) ring(bytes float64, g, k int) float64 {
	if g <= 1 || bytes <= 0 {
		return 0
	}
	k = max(1, min(k, g))
	gf, kf := float64(g), float64(k)
	share := (gf - 1) / gf * bytes
	hw := c.Hardware
	intra := share * (kf - 1) / kf / (hw.NVLinkBytesPerSec * hw.NVLinkEfficiency)
	var inter float64
	if g > k {
		inter = share / kf / (hw.NetBytesPerSec * hw.NetEfficiency)
	}
	return math.Max(intra, inter) * c.Tunables.CommScale
}

// dpGroup is the data-parallel reduction group of a plan (dp × cp ranks
// share every weight) and how many of its members share a node: ranks
// run tp fastest, then cp, dp and pp, so a node holds gpus/tp of them.
func (c Config) dpGroup(p Plan) (g, k int) {
	g = p.DP * p.cp()
	k = max(1, c.Hardware.GPUsPerNode/p.TP)
	return g, min(k, g)
}

// cpBandwidth is the link the cp ring runs over: NVLink while tp×cp fits
// in a node, else each GPU's NIC.
func (c Config) cpBandwidth(p Plan) float64 {
	hw := c.Hardware
	if p.TP*p.cp() <= hw.GPUsPerNode {
		return hw.NVLinkBytesPerSec * hw.NVLinkEfficiency
	}
	return hw.NetBytesPerSec * hw.NetEfficiency
}

// p2pBandwidth is the link between pipeline neighbours, tp·cp·dp ranks
// apart: the NIC unless a whole pipeline sits in one node.
func (c Config) p2pBandwidth(p Plan) float64 {
	hw := c.Hardware
	if p.TP*p.cp()*p.DP*p.PP <= hw.GPUsPerNode {
		return hw.NVLinkBytesPerSec * hw.NVLinkEfficiency
	}
	return hw.NetBytesPerSec * hw.NetEfficiency
}
