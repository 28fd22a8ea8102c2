package costmodel

import (
	"encoding/json"
	"errors"
	"math"
	"strings"
	"testing"
	"time"
)

// config returns a Config for a preset on a GPU with default tunables.
func config(t *testing.T, model, gpu string) Config {
	t.Helper()
	m, tr, err := LookupModel(model)
	if err != nil {
		t.Fatal(err)
	}
	hw, err := LookupHardware(gpu)
	if err != nil {
		t.Fatal(err)
	}
	return Config{Model: m, Hardware: hw, Training: tr, Tunables: DefaultTunables()}
}

func near(got, want, rel float64) bool {
	if want == 0 {
		return math.Abs(got) < 1e-12
	}
	return math.Abs(got-want)/math.Abs(want) <= rel
}

func mustEval(t *testing.T, c Config, p Plan) Evaluation {
	t.Helper()
	ev, err := c.Evaluate(p)
	if err != nil {
		t.Fatalf("Evaluate(%s): %v", p, err)
	}
	return ev
}

func TestMemoryNoParallelism(t *testing.T) {
	// One GPU, no ZeRO, no recompute, no sequence parallelism, GPT-3-style
	// dropout and unfused attention: memory is 16 bytes per parameter plus
	// L·s·b·h·(34 + 5·a·s/h) (Korthikanti et al.), the embedding output,
	// the logits, the reserve and the fragmentation allowance.
	m := Model{Layers: 4, Hidden: 1024, Heads: 16, SeqLen: 512, Vocab: 32000, Dropout: true}
	hw, _ := LookupHardware("h100")
	c := Config{Model: m, Hardware: hw, Training: Training{GlobalBatch: 8, Attention: AttentionUnfused}, Tunables: DefaultTunables()}
	ev := mustEval(t, c, Plan{TP: 1, PP: 1, DP: 1, MicroBatch: 2})
	s, b, h, a, v := 512.0, 2.0, 1024.0, 16.0, 32000.0
	act := 4*s*b*h*(34+5*a*s/h) + s*b*3*h + s*b*(2*h+2*h+6*v)
	frag := float64(hw.HBMBytes) * 0.05
	want := 16*m.Params() + act + float64(c.Tunables.ReservedBytes) + frag
	if !near(float64(ev.MemPerGPUBytes), want, 1e-6) {
		t.Fatalf("memory %d, want %.0f", ev.MemPerGPUBytes, want)
	}
	if ev.NumMicroBatches != 4 || !ev.Fits {
		t.Fatalf("m=%d fits=%v", ev.NumMicroBatches, ev.Fits)
	}
}

func TestZeROStages(t *testing.T) {
	c := config(t, "gpt3-175b", "h100")
	p := Plan{TP: 8, PP: 8, DP: 4, MicroBatch: 1}
	c.Training.ZeROStage = 0
	base := mustEval(t, c, p)
	tests := []struct {
		stage            int
		weight, grad, op float64 // divisor of the stage-0 figure
	}{
		{1, 1, 1, 4},
		{2, 1, 4, 4},
		{3, 4, 4, 4},
	}
	for _, tt := range tests {
		c.Training.ZeROStage = tt.stage
		ev := mustEval(t, c, p)
		if !near(float64(ev.WeightBytes), float64(base.WeightBytes)/tt.weight, 1e-6) ||
			!near(float64(ev.GradBytes), float64(base.GradBytes)/tt.grad, 1e-6) ||
			!near(float64(ev.OptimizerB), float64(base.OptimizerB)/tt.op, 1e-6) {
			t.Errorf("stage %d: weights %d grads %d optimizer %d from %d/%d/%d", tt.stage,
				ev.WeightBytes, ev.GradBytes, ev.OptimizerB, base.WeightBytes, base.GradBytes, base.OptimizerB)
		}
		if ev.ActivationB != base.ActivationB {
			t.Errorf("stage %d changed activations", tt.stage)
		}
		// ZeRO-3 holds a gathered block and the prefetched next.
		if buf := ev.CommBufferBytes - base.CommBufferBytes; (tt.stage == 3) != (buf > 0) {
			t.Errorf("stage %d: %d bytes of gather buffers", tt.stage, buf)
		}
	}
	if base.OptimizerB != 6*base.WeightBytes {
		t.Errorf("optimizer bytes %d, want 12/2 × weights %d", base.OptimizerB, base.WeightBytes)
	}
}

func TestActivationsByRecompute(t *testing.T) {
	// Korthikanti et al. 2022, Table 2, for the first stage of GPT-3 175B
	// on tp 8 × pp 8: 12 blocks and 8 micro-batches in flight, plus the
	// embedding's output for each.
	c := config(t, "gpt3-175b", "h100")
	c.Training.Attention = AttentionUnfused
	p := Plan{TP: 8, PP: 8, DP: 16, MicroBatch: 1}
	s, b, h, a, tp := 2048.0, 1.0, 12288.0, 96.0, 8.0
	layers, inflight := 12.0, 8.0
	sbh := s * b * h
	tests := []struct {
		name string
		r    Recompute
		sp   bool
		att  Attention
		want float64
	}{
		{"none sp", RecomputeNone, true, AttentionUnfused, sbh*(34/tp+5*a*s/(h*tp))*layers*inflight + 3*sbh/tp*inflight},
		{"none", RecomputeNone, false, AttentionUnfused, sbh*(10+24/tp+5*a*s/(h*tp))*layers*inflight + 3*sbh*inflight},
		{"selective sp", RecomputeSelective, true, AttentionUnfused, sbh*34/tp*layers*inflight + 3*sbh/tp*inflight},
		{"full sp", RecomputeFull, true, AttentionUnfused, 2*sbh/tp*layers*inflight + sbh*(34/tp+5*a*s/(h*tp)) + 3*sbh/tp*inflight},
		{"full", RecomputeFull, false, AttentionUnfused, 2*sbh*layers*inflight + sbh*(10+24/tp+5*a*s/(h*tp)) + 3*sbh*inflight},
		// A fused kernel never stores the scores.
		{"flash none sp", RecomputeNone, true, AttentionFlash, sbh*34/tp*layers*inflight + 3*sbh/tp*inflight},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c.Training.Recompute, c.Training.SequenceParallel, c.Training.Attention = tt.r, tt.sp, tt.att
			ev := mustEval(t, c, p)
			if ev.MemoryStage != 0 {
				t.Fatalf("fullest stage %d, want the first", ev.MemoryStage)
			}
			if !near(float64(ev.ActivationB), tt.want, 1e-6) {
				t.Errorf("activations %s, want %s", FormatBytes(ev.ActivationB), FormatBytes(int64(tt.want)))
			}
		})
	}
}

func TestLayout(t *testing.T) {
	tests := []struct {
		name         string
		layers, p, v int
		stages       []int
		first, last  int // blocks on segment 0 and the last segment
		uneven       bool
	}{
		{"even", 96, 8, 1, []int{12, 12, 12, 12, 12, 12, 12, 12}, 12, 12, false},
		{"even interleaved", 96, 8, 3, []int{12, 12, 12, 12, 12, 12, 12, 12}, 4, 4, false},
		// Llama 3 405B: one layer fewer on the first and last stage.
		{"llama3 plain", 126, 16, 1, []int{7, 8, 8, 8, 8, 8, 8, 8, 8, 8, 8, 8, 8, 8, 8, 7}, 7, 7, true},
		// One layer per chunk; the first chunk is only the embedding, the
		// last only the output layer.
		{"llama3 interleaved", 126, 16, 8, []int{7, 8, 8, 8, 8, 8, 8, 8, 8, 8, 8, 8, 8, 8, 8, 7}, 0, 0, true},
		{"remainder to the middle", 126, 5, 1, []int{24, 26, 26, 26, 24}, 24, 24, true},
		{"two stages", 7, 2, 1, []int{3, 4}, 3, 4, true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			l := newLayout(tt.layers, tt.p, tt.v)
			got := l.stageLayers()
			sum := 0
			for i := range got {
				sum += got[i]
				if got[i] != tt.stages[i] {
					t.Fatalf("stages %v, want %v", got, tt.stages)
				}
			}
			if sum != tt.layers || l.seg[0] != tt.first || l.seg[len(l.seg)-1] != tt.last || l.uneven != tt.uneven {
				t.Fatalf("segments %v (uneven %v): want %d layers, first %d, last %d, uneven %v", l.seg, l.uneven, tt.layers, tt.first, tt.last, tt.uneven)
			}
		})
	}
}

func TestInFlight(t *testing.T) {
	// Plain 1F1B: stage r keeps min(m, p−r) micro-batches.
	l := newLayout(96, 8, 1)
	for r, want := range []int{8, 7, 6, 5, 4, 3, 2, 1} {
		if got := l.inFlight(r, 0, 64); got != want {
			t.Errorf("plain stage %d: %d in flight, want %d", r, got, want)
		}
	}
	if got := l.inFlight(0, 0, 3); got != 3 {
		t.Errorf("3 micro-batches: %d in flight", got)
	}
	// Interleaved: stage 0 stores (v+1)·p − 1 chunk-micro-batches, which is
	// Korthikanti et al.'s factor 1 + (p−1)/(p·v) over the plain schedule.
	for _, v := range []int{2, 3, 4} {
		l := newLayout(96, 8, v)
		total := 0
		for j := range v {
			total += l.inFlight(0, j, 64)
		}
		perChunk := 96.0 / float64(8*v)
		plain := 8 * 12.0
		if got := float64(total) * perChunk; !near(got, plain*(1+7.0/(8*float64(v))), 1e-12) {
			t.Errorf("v=%d: %g block-micro-batches, want %g", v, got, plain*(1+7.0/(8*float64(v))))
		}
		if l.inFlight(7, v-1, 64) < 1 {
			t.Errorf("v=%d: last stage holds nothing", v)
		}
	}
}

func TestInterleavingCosts(t *testing.T) {
	c := config(t, "gpt3-175b", "h100")
	p := Plan{TP: 8, PP: 8, DP: 16, MicroBatch: 1}
	plain := mustEval(t, c, p)
	p.VirtualStages = 3
	inter := mustEval(t, c, p)
	if r := float64(inter.ActivationB) / float64(plain.ActivationB); !near(r, 1+7.0/24, 0.01) {
		t.Errorf("interleaved activations ×%.4f, want about 1 + 7/24", r)
	}
	if inter.BubbleSec >= plain.BubbleSec {
		t.Errorf("interleaving did not shrink the bubble: %.3f vs %.3f", inter.BubbleSec, plain.BubbleSec)
	}
	if inter.PPCommSec <= plain.PPCommSec {
		t.Errorf("interleaving did not add p2p traffic: %.4f vs %.4f", inter.PPCommSec, plain.PPCommSec)
	}
}

func TestBubbleFraction(t *testing.T) {
	// With nearly equal stages the bubble is (p−1)/(v·m) of the steady
	// state; the embedding and output layers make the ends a little
	// heavier.
	c := config(t, "gpt3-175b", "a100-80gb")
	for _, p := range []Plan{
		{TP: 1, PP: 8, DP: 128, MicroBatch: 1},
		{TP: 1, PP: 4, DP: 64, MicroBatch: 2},
		{TP: 1, PP: 8, DP: 16, MicroBatch: 1, VirtualStages: 2},
	} {
		ev := mustEval(t, c, p)
		e := c.engine(ev.Plan)
		st := e.step()
		v := float64(max(p.VirtualStages, 1))
		want := float64(p.PP-1) / (v * float64(ev.NumMicroBatches))
		got := ev.BubbleSec / (float64(ev.NumMicroBatches) * st.perStage[st.busy])
		if !near(got, want, 0.05) {
			t.Errorf("%s: bubble fraction %.5f, want about (p-1)/(v·m) = %.5f", ev.Plan, got, want)
		}
		var sum float64
		for _, x := range st.perStage {
			sum += x
		}
		if !near(ev.BubbleSec, (sum-st.perStage[st.busy])/v, 1e-9) {
			t.Errorf("%s: bubble %.4f is not the other stages' time over v", ev.Plan, ev.BubbleSec)
		}
	}
}

func TestRing(t *testing.T) {
	hw, _ := LookupHardware("h100")
	c := Config{Hardware: hw, Tunables: DefaultTunables()}
	nv := hw.NVLinkBytesPerSec * hw.NVLinkEfficiency
	net := hw.NetBytesPerSec * hw.NetEfficiency
	const s = 8e9
	tests := []struct {
		name string
		g, k int
		want float64
	}{
		{"one rank", 1, 1, 0},
		{"inside a node", 8, 8, 7.0 / 8 * s * 7 / 8 / nv},
		// One member per node: every byte crosses that GPU's own NIC.
		{"one per node", 64, 1, 63.0 / 64 * s / net},
		// Eight per node: eight rings, one per NIC, each carrying an
		// eighth; the NIC side bounds.
		{"eight per node", 64, 8, math.Max(63.0/64*s*7/8/nv, 63.0/64*s/8/net)},
	}
	for _, tt := range tests {
		if got := c.ring(s, tt.g, tt.k); !near(got, tt.want, 1e-12) {
			t.Errorf("%s: %.6f s, want %.6f", tt.name, got, tt.want)
		}
	}
}

func TestTensorParallelCommunication(t *testing.T) {
	// Per block and micro-batch: 4 all-reduce volumes (2 forward, 2
	// backward), one more with sequence parallelism (inputs gathered again
	// in the backward pass), two more with full recomputation.
	c := config(t, "gpt3-175b", "h100")
	p := Plan{TP: 8, PP: 8, DP: 16, MicroBatch: 2, NumMicroBatches: 48, VirtualStages: 1, CP: 1}
	one := c.allReduceNVLink(2*2048*12288*2, 8)
	for _, tt := range []struct {
		r  Recompute
		sp bool
		n  float64
	}{{RecomputeNone, false, 4}, {RecomputeSelective, true, 5}, {RecomputeFull, false, 6}, {RecomputeFull, true, 7}} {
		c.Training.Recompute, c.Training.SequenceParallel = tt.r, tt.sp
		e := c.engine(p)
		if !near(e.blk.tpComm, tt.n*one, 1e-12) {
			t.Errorf("%s sp=%v: %.5f s per block, want %g all-reduces = %.5f", tt.r, tt.sp, e.blk.tpComm, tt.n, tt.n*one)
		}
	}
	c.Tunables.TPOverlap = 0.75
	if e := c.engine(p); !near(e.blk.tpExp, 0.25*e.blk.tpComm, 1e-12) {
		t.Errorf("tp_overlap 0.75 leaves %.5f of %.5f exposed", e.blk.tpExp, e.blk.tpComm)
	}
}

func TestZeRO3FallsWithDataParallelism(t *testing.T) {
	// At a fixed global batch ZeRO-3 gathers every parameter twice and
	// scatters every gradient per micro-batch while each GPU's batch
	// shrinks: throughput falls several-fold from 384 to 1,536 A100s
	// (Narayanan et al. SC'21, Table 2: 144 → 44 TFLOP/s), while PTD-P
	// barely moves (153 → 141).
	c := config(t, "gpt3-175b", "a100-80gb")
	c.Training = Training{GlobalBatch: 1536, ZeROStage: 3, Recompute: RecomputeFull, Attention: AttentionUnfused}
	small := mustEval(t, c, Plan{TP: 1, PP: 1, DP: 384, MicroBatch: 4})
	large := mustEval(t, c, Plan{TP: 1, PP: 1, DP: 1536, MicroBatch: 1})
	if r := small.TFLOPSPerGPU / large.TFLOPSPerGPU; r < 2.5 {
		t.Errorf("ZeRO-3 384 → 1536 GPUs: %.0f → %.0f TFLOP/s (×%.1f), want a several-fold fall", small.TFLOPSPerGPU, large.TFLOPSPerGPU, r)
	}
	if large.ZeRO3CommSec <= 0 || large.ZeRO3ExposedSec <= large.ComputeSec {
		t.Errorf("at 1536 GPUs ZeRO-3 communication (%.1f s, %.1f exposed) should dominate compute (%.1f s)", large.ZeRO3CommSec, large.ZeRO3ExposedSec, large.ComputeSec)
	}
	c.Training.ZeROStage = 0
	a := mustEval(t, c, Plan{TP: 8, PP: 12, DP: 4, MicroBatch: 1})
	b := mustEval(t, c, Plan{TP: 8, PP: 12, DP: 16, MicroBatch: 1})
	if r := a.TFLOPSPerGPU / b.TFLOPSPerGPU; r > 1.2 {
		t.Errorf("PTD-P 384 → 1536 GPUs: ×%.2f, want nearly flat", r)
	}
}

func TestEfficiencyRisesWithModelSize(t *testing.T) {
	// The published weak-scaling runs (Narayanan et al. Table 1) rise from
	// 44% to 52% of peak between h = 2304 and h = 25600; so must the model.
	rows := loadValidation(t)
	byID := map[string]validationRow{}
	for _, r := range rows {
		byID[r.ID] = r
	}
	_, small, err := byID["sc21-t1-1.7b"].predict()
	if err != nil {
		t.Fatal(err)
	}
	_, big, err := byID["sc21-t1-1t"].predict()
	if err != nil {
		t.Fatal(err)
	}
	if d := big.TFLOPSPerGPU/312 - small.TFLOPSPerGPU/312; d < 0.05 {
		t.Errorf("1.7B at %.1f%% of peak, 1T at %.1f%%: want the larger model at least 5 points higher", small.TFLOPSPerGPU/3.12, big.TFLOPSPerGPU/3.12)
	}
	if big.GEMMEfficiency <= small.GEMMEfficiency*0.99 && big.ElementwiseSec/big.StepSeconds >= small.ElementwiseSec/small.StepSeconds {
		t.Errorf("neither GEMM shape nor element-wise share favours the larger model")
	}
}

func TestThroughputIdentities(t *testing.T) {
	c := config(t, "gpt-1t", "h100")
	ev := mustEval(t, c, Plan{TP: 8, PP: 64, DP: 6, MicroBatch: 1})
	modelF, hwF := c.Model.IterationFLOPs(c.Training.GlobalBatch, c.Training.Recompute)
	if !near(ev.TFLOPSPerGPU*1e12*ev.StepSeconds*3072, hwF, 1e-9) {
		t.Errorf("TFLOP/s × GPUs × step ≠ hardware FLOPs")
	}
	if !near(ev.MFU*989.4e12*ev.StepSeconds*3072, modelF, 1e-9) {
		t.Errorf("MFU × peak × GPUs × step ≠ model FLOPs")
	}
	if ev.MFU <= 0 || ev.MFU >= ev.GEMMEfficiency {
		t.Errorf("MFU %.3f should be below the GEMMs' efficiency %.3f (attention, element-wise, communication and bubble cost time)", ev.MFU, ev.GEMMEfficiency)
	}
	e := c.engine(ev.Plan)
	st := e.step()
	parts := float64(ev.NumMicroBatches)*st.perStage[st.busy] + ev.BubbleSec + ev.DPExposedSec + ev.ZeRO3ExposedSec + ev.OptimizerSec + ev.StepOverheadSec
	if !near(ev.StepSeconds, parts, 1e-9) {
		t.Errorf("step %.3f is not the sum of its parts %.3f", ev.StepSeconds, parts)
	}
	faster := c
	faster.Tunables.Efficiency = 1.2
	if f := mustEval(t, faster, ev.Plan); f.StepSeconds >= ev.StepSeconds {
		t.Errorf("a higher compute scale did not shorten the step")
	}
}

func TestCheckpointAndStartup(t *testing.T) {
	c := config(t, "gpt3-175b", "h100")
	c.Tunables.CheckpointInterval = 10 * time.Minute
	p := Plan{TP: 8, PP: 8, DP: 16, MicroBatch: 1}
	ev := mustEval(t, c, p)
	state := c.Model.Params() * 14
	// 128 nodes write at 5 GB/s each, well over the storage's 100 GB/s.
	if !near(ev.CheckpointSec, state/100e9, 1e-9) || !near(ev.CheckpointOverhead, state/100e9/600, 1e-9) {
		t.Errorf("checkpoint %.2f s (%.4f of interval), want %.2f s", ev.CheckpointSec, ev.CheckpointOverhead, state/100e9)
	}
	if !near(ev.StartupSec, state/200e9+120, 1e-9) {
		t.Errorf("startup %.2f s, want %.2f", ev.StartupSec, state/200e9+120)
	}
	// Without a sharded optimizer only one replica's 8 nodes hold distinct
	// state: 40 GB/s.
	c.Training.ZeROStage = 0
	if ev := mustEval(t, c, p); !near(ev.CheckpointSec, state/40e9, 1e-9) {
		t.Errorf("ZeRO-0 checkpoint %.1f s, want %.1f s (8 writer nodes)", ev.CheckpointSec, state/40e9)
	}
	c.Tunables.CheckpointInterval = 0
	if ev := mustEval(t, c, p); ev.CheckpointOverhead != 0 || ev.Goodput != nil {
		t.Errorf("no interval and no MTBF should mean no amortised cost and no goodput")
	}
}

func TestGoodput(t *testing.T) {
	// Without failures the wall time is the work plus the checkpoints.
	if got := ExpectedWallTime(3600, 600, 60, 100, 0); got != 3600+6*60 {
		t.Errorf("no failures: %g s, want %d", got, 3600+6*60)
	}
	// With failures rare against everything it approaches the first-order
	// estimate work·(1 + C/τ + (τ/2 + R)/M).
	work, tau, ckpt, restart, mtbf := 1e6, 600.0, 6.0, 30.0, 1e7
	first := work * (1 + ckpt/tau + (tau/2+restart)/mtbf)
	if got := ExpectedWallTime(work, tau, ckpt, restart, mtbf); !near(got, first, 1e-3) {
		t.Errorf("rare failures: %.1f s, first-order %.1f s", got, first)
	}
	if got := YoungDalyInterval(50, 10800); !near(got, math.Sqrt(2*50*10800), 1e-12) {
		t.Errorf("Young–Daly interval %g", got)
	}
	// The Young–Daly interval is where the wall time is (nearly) least.
	yd := YoungDalyInterval(ckpt, 3600)
	at := ExpectedWallTime(work, yd, ckpt, restart, 3600)
	for _, f := range []float64{0.5, 2} {
		if other := ExpectedWallTime(work, yd*f, ckpt, restart, 3600); other < at {
			t.Errorf("interval ×%g beats Young–Daly: %.0f < %.0f", f, other, at)
		}
	}

	c := config(t, "llama3-405b", "h100")
	c.Tunables.MTBF = 3 * time.Hour
	ev := mustEval(t, c, Plan{TP: 8, PP: 16, DP: 128, MicroBatch: 1, VirtualStages: 8})
	g := ev.Goodput
	if g == nil || g.Fraction <= 0.7 || g.Fraction >= 1 {
		t.Fatalf("goodput %+v", g)
	}
	if !near(ev.CheckpointIntervalSec, math.Sqrt(2*ev.CheckpointSec*10800), 1e-9) {
		t.Errorf("interval %.0f s, want Young–Daly √(2·%.0f·10800)", ev.CheckpointIntervalSec, ev.CheckpointSec)
	}
	if !near(g.EffectiveStepSec, ev.StepSeconds/g.Fraction, 1e-12) {
		t.Errorf("effective step %.3f, step %.3f / goodput %.3f", g.EffectiveStepSec, ev.StepSeconds, g.Fraction)
	}
	// A failure rate measured at 16,384 GPUs is half as frequent at 8,192.
	c.Tunables.MTBFReferenceGPUs = 16384
	half := mustEval(t, c, Plan{TP: 8, PP: 16, DP: 64, MicroBatch: 1, VirtualStages: 8})
	if !near(half.Goodput.MTBFSec, 2*10800, 1e-12) || half.Goodput.Fraction <= g.Fraction {
		t.Errorf("8192 GPUs: MTBF %.0f s, goodput %.3f vs %.3f at 16384", half.Goodput.MTBFSec, half.Goodput.Fraction, g.Fraction)
	}
	c.Training.TrainTokens = 15.6e12
	withTokens := mustEval(t, c, Plan{TP: 8, PP: 16, DP: 128, MicroBatch: 1, VirtualStages: 8})
	if !near(withTokens.TrainSeconds, 15.6e12/withTokens.TokensPerSec, 1e-12) ||
		!near(withTokens.Goodput.EffectiveTrainSec, withTokens.TrainSeconds/withTokens.Goodput.Fraction, 1e-12) {
		t.Errorf("train %.0f s, effective %.0f s", withTokens.TrainSeconds, withTokens.Goodput.EffectiveTrainSec)
	}
}

func TestPublishedLayoutsFit(t *testing.T) {
	// Layouts that ran: the model must not call them out of memory.
	for _, id := range []string{"llama3-405b-h100-16384", "sc21-t1-1t", "sc21-t1-530b",
		"korthikanti-1t-selective", "korthikanti-530b-selective", "mcore-h100-462b", "sc21-t2-zero3-175b-384"} {
		t.Run(id, func(t *testing.T) {
			for _, r := range loadValidation(t) {
				if r.ID != id {
					continue
				}
				_, ev, err := r.predict()
				if err != nil {
					t.Fatal(err)
				}
				if !ev.Fits {
					t.Errorf("needs %s of %s (weights %s, grads %s, optimizer %s, activations %s, buffers %s)",
						FormatBytes(ev.MemPerGPUBytes), FormatBytes(r.config0(t).Hardware.HBMBytes), FormatBytes(ev.WeightBytes),
						FormatBytes(ev.GradBytes), FormatBytes(ev.OptimizerB), FormatBytes(ev.ActivationB), FormatBytes(ev.CommBufferBytes))
				}
				return
			}
			t.Fatal("no such row")
		})
	}
}

func TestLlama405BPublishedLayoutFitsWithZeRO1(t *testing.T) {
	// Llama 3 Table 4's 8,192-GPU layout (tp 8, pp 16, dp 64, one 8K
	// sequence per micro-batch, no activation checkpointing) ran on 80 GB
	// H100s; with Megatron's distributed optimizer (ZeRO-1) and 1F1B it
	// fits: the second stage holds 8 blocks × 15 micro-batches.
	c := config(t, "llama3-405b", "h100")
	c.Training.Recompute = RecomputeNone
	ev := mustEval(t, c, Plan{TP: 8, PP: 16, DP: 64, MicroBatch: 1})
	if !ev.Fits || ev.MemoryStage != 1 {
		t.Fatalf("needs %s on stage %d (activations %s, weights %s, grads %s)", FormatBytes(ev.MemPerGPUBytes), ev.MemoryStage,
			FormatBytes(ev.ActivationB), FormatBytes(ev.WeightBytes), FormatBytes(ev.GradBytes))
	}
	want := 8 * 15 * 8192 * (12*16384.0 + 4*1024 + 6*53248) / 8
	if !near(float64(ev.ActivationB), want, 1e-9) {
		t.Errorf("activations %s, want %s", FormatBytes(ev.ActivationB), FormatBytes(int64(want)))
	}
}

func (r validationRow) config0(t *testing.T) Config {
	c, err := r.config()
	if err != nil {
		t.Fatal(err)
	}
	return c
}

func TestEvaluateRefusesImpossiblePlans(t *testing.T) {
	tests := []struct {
		name string
		p    Plan
		edit func(*Config)
		want string
	}{
		{"tp beyond node", Plan{TP: 16, PP: 8, DP: 8, MicroBatch: 1}, nil, "exceeds the 8 GPUs"},
		{"tp not dividing heads", Plan{TP: 5, PP: 8, DP: 8, MicroBatch: 1}, func(c *Config) { c.Hardware.GPUsPerNode = 16 }, "does not divide 96 heads"},
		{"zero dp", Plan{TP: 8, PP: 8, MicroBatch: 1}, nil, "must be positive"},
		{"batch", Plan{TP: 8, PP: 8, DP: 7, MicroBatch: 1}, nil, "not divisible by dp 7"},
		{"pp beyond layers", Plan{TP: 1, PP: 128, DP: 1, MicroBatch: 1}, nil, "exceeds 96 layers"},
		{"interleave without pipeline", Plan{TP: 8, PP: 1, DP: 8, MicroBatch: 1, VirtualStages: 2}, nil, "needs pp ≥ 2"},
		{"more chunks than layers", Plan{TP: 8, PP: 32, DP: 2, MicroBatch: 1, VirtualStages: 4}, nil, "model chunks"},
		{"interleave microbatches", Plan{TP: 8, PP: 8, DP: 16, MicroBatch: 16, VirtualStages: 2}, nil, "multiple of pp"},
		{"microbatch count", Plan{TP: 8, PP: 8, DP: 16, MicroBatch: 1, NumMicroBatches: 7}, nil, "≠ global batch"},
		{"cp not splitting the sequence", Plan{TP: 8, CP: 3, PP: 8, DP: 16, MicroBatch: 1}, nil, "cp 3"},
		{"fp8 on a100", Plan{TP: 8, PP: 8, DP: 16, MicroBatch: 1}, func(c *Config) {
			c.Hardware, _ = LookupHardware("a100-80gb")
			c.Training.Precision = PrecisionFP8
		}, "no fp8"},
		{"bad compute scale", Plan{TP: 8, PP: 8, DP: 16, MicroBatch: 1}, func(c *Config) { c.Tunables.Efficiency = 0 }, "compute_scale"},
		{"bad zero", Plan{TP: 8, PP: 8, DP: 16, MicroBatch: 1}, func(c *Config) { c.Training.ZeROStage = 4 }, "zero stage"},
		{"bad recompute", Plan{TP: 8, PP: 8, DP: 16, MicroBatch: 1}, func(c *Config) { c.Training.Recompute = "some" }, "unknown recompute"},
		{"bad attention", Plan{TP: 8, PP: 8, DP: 16, MicroBatch: 1}, func(c *Config) { c.Training.Attention = "sparse" }, "unknown attention"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c := config(t, "gpt3-175b", "h100")
			if tt.edit != nil {
				tt.edit(&c)
			}
			_, err := c.Evaluate(tt.p)
			if err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Fatalf("error %v, want it to contain %q", err, tt.want)
			}
		})
	}
	c := config(t, "gpt3-175b", "h100")
	if _, err := c.Evaluate(Plan{TP: 16, PP: 1, DP: 1, MicroBatch: 1}); !errors.Is(err, ErrInvalidPlan) {
		t.Errorf("tp beyond node should wrap ErrInvalidPlan, got %v", err)
	}
}

func TestUnevenPipeline(t *testing.T) {
	c := config(t, "llama3-405b", "h100")
	ev := mustEval(t, c, Plan{TP: 8, PP: 16, DP: 16, MicroBatch: 1})
	if ev.LayersPerStage != 8 || len(ev.Notes) != 1 || !strings.Contains(ev.Notes[0], "uneven") {
		t.Fatalf("126 layers over 16 stages: busiest %d, notes %v", ev.LayersPerStage, ev.Notes)
	}
	// Interleaving works on an uneven split and shrinks the bubble the
	// plain schedule pays.
	inter := mustEval(t, c, Plan{TP: 8, PP: 16, DP: 16, MicroBatch: 1, VirtualStages: 8})
	if inter.BubbleSec >= ev.BubbleSec/4 {
		t.Errorf("v=8 bubble %.2f s against %.2f s plain", inter.BubbleSec, ev.BubbleSec)
	}
}

func TestContextParallelism(t *testing.T) {
	// Llama 3's long-context stage: tp 8, cp 16, pp 16, dp 8 on 131,072
	// tokens. Each GPU attends over 1/16 of the queries and exchanges keys
	// and values around the ring.
	c := config(t, "llama3-405b", "h100")
	c.Model.SeqLen = 131072
	c.Training.GlobalBatch = 128
	ev := mustEval(t, c, Plan{TP: 8, CP: 16, PP: 16, DP: 8, MicroBatch: 1, VirtualStages: 8})
	if ev.GPUs() != 16384 || ev.CPCommSec <= 0 {
		t.Fatalf("gpus %d, cp comm %.3f", ev.GPUs(), ev.CPCommSec)
	}
	if ev.CPExposedSec > ev.CPCommSec || ev.AttentionSec < ev.GEMMSec/4 {
		t.Errorf("cp exposed %.2f of %.2f s; attention %.1f s against GEMMs %.1f s at 128K", ev.CPExposedSec, ev.CPCommSec, ev.AttentionSec, ev.GEMMSec)
	}
	c.Tunables.CPOverlap = 0
	if none := mustEval(t, c, ev.Plan); !near(none.CPExposedSec, none.CPCommSec, 1e-12) || none.StepSeconds <= ev.StepSeconds {
		t.Errorf("without overlap all cp comm should be exposed: %.3f of %.3f", none.CPExposedSec, none.CPCommSec)
	}
}

func TestCalibrate(t *testing.T) {
	truth := config(t, "gpt3-175b", "a100-80gb")
	truth.Tunables.Efficiency = 0.8
	p := Plan{TP: 8, PP: 8, DP: 16, MicroBatch: 1, VirtualStages: 2}
	measured := mustEval(t, truth, p).StepSeconds

	c := config(t, "gpt3-175b", "a100-80gb")
	cal, err := c.CalibrateReport(p, measured)
	if err != nil {
		t.Fatal(err)
	}
	if cal.Term != TermCompute || !near(c.Tunables.Efficiency, 0.8, 1e-6) || cal.From != 1 || !near(cal.To, 0.8, 1e-6) {
		t.Fatalf("calibration %+v, compute scale %.6f; want compute_scale 1 → 0.8", cal, c.Tunables.Efficiency)
	}
	if got := mustEval(t, c, p).StepSeconds; !near(got, measured, 1e-9) {
		t.Fatalf("calibrated model predicts %.4f s, measured %.4f s", got, measured)
	}

	// Faster than the kernels can go at peak: communication must be cheaper.
	fast := config(t, "gpt3-175b", "a100-80gb")
	fast.Tunables.CommScale = 0.2
	hw := fast.Hardware
	fast.Tunables.Efficiency = 1 / max(hw.GEMMEfficiency, hw.FlashAttentionEfficiency, hw.ElementwiseEfficiency)
	quick := mustEval(t, fast, p).StepSeconds
	c = config(t, "gpt3-175b", "a100-80gb")
	cal, err = c.CalibrateReport(p, quick)
	if err != nil || cal.Term != TermComm || !near(cal.To, 0.2, 1e-6) || !near(c.Tunables.Efficiency, fast.Tunables.Efficiency, 1e-12) {
		t.Fatalf("calibration %+v, %v: want comm_scale 1 → 0.2 with the kernels at their limit", cal, err)
	}
	if got := mustEval(t, c, p).StepSeconds; !near(got, quick, 1e-9) {
		t.Fatalf("calibrated model predicts %.4f s, measured %.4f s", got, quick)
	}

	tests := []struct {
		name     string
		measured float64
		want     string
	}{
		{"zero", 0, "positive number"},
		{"nan", math.NaN(), "positive number"},
		{"faster than peak", 0.001, "faster than the kernels at peak"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c := config(t, "gpt3-175b", "a100-80gb")
			err := c.Calibrate(p, tt.measured)
			if err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Fatalf("error %v, want %q", err, tt.want)
			}
			if c.Tunables != DefaultTunables() {
				t.Fatalf("a failed calibration changed the tunables")
			}
		})
	}
}

func TestTunablesSet(t *testing.T) {
	tests := []struct {
		key, value string
		check      func(Tunables) bool
	}{
		{"compute_scale", "0.9", func(t Tunables) bool { return t.Efficiency == 0.9 }},
		{"efficiency", "0.4", func(t Tunables) bool { return t.Efficiency == 0.4 }},
		{"dp_overlap", "0.5", func(t Tunables) bool { return t.DPGradOverlap == 0.5 && t.DPParamOverlap == 0.5 }},
		{"reserved_bytes", "3GiB", func(t Tunables) bool { return t.ReservedBytes == 3<<30 }},
		{"reserved_gib", "2", func(t Tunables) bool { return t.ReservedBytes == 2<<30 }},
		{"checkpoint_interval_seconds", "1h", func(t Tunables) bool { return t.CheckpointInterval == time.Hour }},
		{"checkpoint_interval_seconds", "90", func(t Tunables) bool { return t.CheckpointInterval == 90*time.Second }},
		{"checkpoint_interval", "1h", func(t Tunables) bool { return t.CheckpointInterval == time.Hour }},
		{"startup_wait", "30s", func(t Tunables) bool { return t.StartupWait == 30*time.Second }},
		{"checkpoint_write_gbps", "10", func(t Tunables) bool { return t.CheckpointWriteBytesPerSec == 10e9 }},
		{"checkpoint_write_bytes_per_second", "2TB/s", func(t Tunables) bool { return t.CheckpointWriteBytesPerSec == 2e12 }},
		{"mtbf_seconds", "3h", func(t Tunables) bool { return t.MTBF == 3*time.Hour }},
		{"mtbf_reference_gpus", "16384", func(t Tunables) bool { return t.MTBFReferenceGPUs == 16384 }},
		{"fragmentation_percent", "7.5", func(t Tunables) bool { return t.FragmentationPercent == 7.5 }},
	}
	for _, tt := range tests {
		tu := DefaultTunables()
		if err := tu.Set(tt.key, tt.value); err != nil {
			t.Errorf("Set(%s, %s): %v", tt.key, tt.value, err)
			continue
		}
		if !tt.check(tu) {
			t.Errorf("Set(%s, %s) left %+v", tt.key, tt.value, tu)
		}
	}
	tu := DefaultTunables()
	for k, v := range map[string]string{"efficiency": "x", "checkpoint_interval": "soon", "speed": "1", "dp_overlap": "2", "reserved_bytes": "lots"} {
		if err := tu.Set(k, v); err == nil {
			t.Errorf("Set(%s, %s) accepted", k, v)
		}
	}
}

func TestTunablesJSON(t *testing.T) {
	// Every tunable appears under its --set name, and the document reads
	// back into the same tunables.
	tu := DefaultTunables()
	tu.MTBF = 3 * time.Hour
	tu.CheckpointInterval = 20 * time.Minute
	data, err := json.Marshal(tu)
	if err != nil {
		t.Fatal(err)
	}
	var m map[string]any
	if err := json.Unmarshal(data, &m); err != nil {
		t.Fatal(err)
	}
	for _, name := range TunableNames() {
		if _, ok := m[name]; !ok {
			t.Errorf("-o json lacks tunable %q", name)
		}
	}
	if len(m) != len(TunableNames()) {
		t.Errorf("%d fields, %d tunables", len(m), len(TunableNames()))
	}
	if m["mtbf_seconds"] != 10800.0 || m["checkpoint_interval_seconds"] != 1200.0 {
		t.Errorf("durations not in seconds: %v %v", m["mtbf_seconds"], m["checkpoint_interval_seconds"])
	}
	back := Tunables{}
	if err := json.Unmarshal(data, &back); err != nil {
		t.Fatal(err)
	}
	if back != tu {
		t.Errorf("round trip:\n%+v\n%+v", back, tu)
	}
	if err := json.Unmarshal([]byte(`{"speed": 1}`), &back); err == nil {
		t.Error("unknown tunable accepted")
	}
}

// TestFP8: FP8 runs the blocks' GEMMs at the FP8 peak but not attention,
// the logits or the element-wise passes, and adds the casts, so a step is
// faster than bf16 by less than the peaks' factor of two; a GPU without
// FP8 refuses it, and an FP8 GPU needs an FP8 efficiency.
func TestFP8(t *testing.T) {
	p := Plan{TP: 8, PP: 9, CP: 2, DP: 4, MicroBatch: 1, VirtualStages: 7}
	bf16 := config(t, "llama3-405b", "h100")
	bf16.Training.GlobalBatch = 252
	fp8 := bf16
	fp8.Training.Precision = PrecisionFP8
	b, f := mustEval(t, bf16, p), mustEval(t, fp8, p)
	if ratio := b.StepSeconds / f.StepSeconds; ratio <= 1.1 || ratio >= 2 {
		t.Errorf("fp8 step %.3f s against bf16 %.3f s: ×%.2f, want between 1.1 and 2", f.StepSeconds, b.StepSeconds, ratio)
	}
	if f.AttentionSec != b.AttentionSec {
		t.Errorf("attention %.4f s in fp8, %.4f s in bf16: attention stays bf16", f.AttentionSec, b.AttentionSec)
	}
	if f.ElementwiseSec <= b.ElementwiseSec {
		t.Errorf("element-wise %.4f s in fp8, %.4f s in bf16: the casts cost", f.ElementwiseSec, b.ElementwiseSec)
	}
	if f.GEMMSec >= b.GEMMSec*0.7 {
		t.Errorf("GEMMs %.3f s in fp8, %.3f s in bf16: want well under", f.GEMMSec, b.GEMMSec)
	}

	a100 := config(t, "llama3-405b", "a100-80gb")
	a100.Training.Precision = PrecisionFP8
	if _, err := a100.Evaluate(Plan{TP: 8, PP: 9, CP: 2, DP: 4, MicroBatch: 1, VirtualStages: 7}); err == nil || !strings.Contains(err.Error(), "no fp8") {
		t.Errorf("fp8 on A100: %v, want a refusal naming fp8", err)
	}
	hw, _ := LookupHardware("h100")
	if hw.FP8GEMMEfficiency <= 0 || hw.FP8GEMMEfficiency >= hw.GEMMEfficiency {
		t.Errorf("h100 fp8 GEMM efficiency %.3f, bf16 %.3f: want below, and positive", hw.FP8GEMMEfficiency, hw.GEMMEfficiency)
	}
	hw.FP8GEMMEfficiency = 0
	if err := hw.Validate(); err == nil || !strings.Contains(err.Error(), "fp8_gemm_max_efficiency") {
		t.Errorf("an fp8 GPU without an fp8 efficiency: %v", err)
	}
}
