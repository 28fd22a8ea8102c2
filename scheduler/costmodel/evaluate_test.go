package costmodel

import (
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
	// One GPU, no ZeRO, no recompute, no sequence parallelism: memory is
	// 16 bytes per parameter plus L·s·b·h·(34 + 5·a·s/h) plus the reserve.
	m := Model{Layers: 4, Hidden: 1024, Heads: 16, SeqLen: 512, Vocab: 32000}
	hw, _ := LookupHardware("h100")
	c := Config{Model: m, Hardware: hw, Training: Training{GlobalBatch: 8}, Tunables: DefaultTunables()}
	ev := mustEval(t, c, Plan{TP: 1, PP: 1, DP: 1, MicroBatch: 2})
	n := m.Params() - float64(m.Hidden) // the final norm lives outside the stage accounting
	s, b, h, a := 512.0, 2.0, 1024.0, 16.0
	act := 4 * s * b * h * (34 + 5*a*s/h)
	want := 16*n + act + float64(c.Tunables.ReservedBytes)
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
	}
	if base.OptimizerB != 6*base.WeightBytes {
		t.Errorf("optimizer bytes %d, want 12/2 × weights %d", base.OptimizerB, base.WeightBytes)
	}
}

func TestActivationsByRecompute(t *testing.T) {
	c := config(t, "gpt3-175b", "h100")
	p := Plan{TP: 8, PP: 8, DP: 16, MicroBatch: 1}
	s, b, h, a, tp := 2048.0, 1.0, 12288.0, 96.0, 8.0
	layers := 12.0 // per stage
	inflight := 8.0
	sbh := s * b * h
	tests := []struct {
		r    Recompute
		sp   bool
		want float64
	}{
		{RecomputeNone, true, sbh * (34/tp + 5*a*s/(h*tp)) * layers * inflight},
		{RecomputeNone, false, sbh * (10 + 24/tp + 5*a*s/(h*tp)) * layers * inflight},
		{RecomputeSelective, true, sbh * 34 / tp * layers * inflight},
		{RecomputeFull, true, 2*sbh/tp*layers*inflight + sbh*(34/tp+5*a*s/(h*tp))},
		{RecomputeFull, false, 2*sbh*layers*inflight + sbh*(10+24/tp+5*a*s/(h*tp))},
	}
	for _, tt := range tests {
		c.Training.Recompute, c.Training.SequenceParallel = tt.r, tt.sp
		ev := mustEval(t, c, p)
		if !near(float64(ev.ActivationB), tt.want, 1e-6) {
			t.Errorf("%s sp=%v: activations %s, want %s", tt.r, tt.sp, FormatBytes(ev.ActivationB), FormatBytes(int64(tt.want)))
		}
	}
}

func TestInterleavingActivationFactor(t *testing.T) {
	c := config(t, "gpt3-175b", "h100")
	p := Plan{TP: 8, PP: 8, DP: 16, MicroBatch: 1}
	plain := mustEval(t, c, p)
	p.VirtualStages = 3
	inter := mustEval(t, c, p)
	want := float64(plain.ActivationB) * (1 + 7.0/24)
	if !near(float64(inter.ActivationB), want, 1e-6) {
		t.Fatalf("interleaved activations %d, want %.0f", inter.ActivationB, want)
	}
	if inter.BubbleSec >= plain.BubbleSec {
		t.Fatalf("interleaving did not shrink the bubble: %.3f vs %.3f", inter.BubbleSec, plain.BubbleSec)
	}
	if inter.PPCommSec <= plain.PPCommSec {
		t.Fatalf("interleaving did not add p2p traffic: %.4f vs %.4f", inter.PPCommSec, plain.PPCommSec)
	}
}

func TestBubbleFraction(t *testing.T) {
	c := config(t, "gpt3-175b", "a100-80gb")
	for _, p := range []Plan{
		{TP: 1, PP: 8, DP: 128, MicroBatch: 1},
		{TP: 1, PP: 4, DP: 64, MicroBatch: 2},
		{TP: 1, PP: 8, DP: 16, MicroBatch: 1, VirtualStages: 2},
	} {
		ev := mustEval(t, c, p)
		v := float64(max(p.VirtualStages, 1))
		want := float64(p.PP-1) / (v * float64(ev.NumMicroBatches))
		got := ev.BubbleSec / (ev.ComputeSec + ev.PPCommSec)
		if !near(got, want, 1e-9) {
			t.Errorf("%s: bubble fraction %.5f, want (p-1)/(v·m) = %.5f", ev.Plan, got, want)
		}
	}
}

func TestCommunicationTerms(t *testing.T) {
	c := config(t, "gpt3-175b", "h100")
	c.Training.Recompute = RecomputeNone
	ev := mustEval(t, c, Plan{TP: 8, PP: 8, DP: 16, MicroBatch: 2})
	m := float64(ev.NumMicroBatches)
	act := 2.0 * 2048 * 12288 * 2
	wantTP := m * 12 * 4 * 2 * 7.0 / 8 * act / 450e9
	if !near(ev.TPCommSec, wantTP, 1e-9) {
		t.Errorf("tp comm %.4f s, want %.4f", ev.TPCommSec, wantTP)
	}
	wantPP := m * 2 * act / 8 / 50e9
	if !near(ev.PPCommSec, wantPP, 1e-9) {
		t.Errorf("pp comm %.4f s, want %.4f", ev.PPCommSec, wantPP)
	}
	// The busiest stage holds 12 blocks and the position table plus one
	// embedding table, split over tp 8.
	n := (12*c.Model.LayerParams() + 50257*12288 + 2048*12288) / 8
	wantDP := 2 * 15.0 / 16 * n * 2 / 50e9
	if !near(ev.DPCommSec, wantDP, 1e-9) || !near(ev.DPExposedSec, 0.3*wantDP, 1e-9) {
		t.Errorf("dp comm %.4f (exposed %.4f), want %.4f", ev.DPCommSec, ev.DPExposedSec, wantDP)
	}

	// A data-parallel group inside one node reduces over NVLink.
	small := Config{Model: Model{Layers: 8, Hidden: 1024, Heads: 16, SeqLen: 1024, Vocab: 32000}, Hardware: c.Hardware,
		Training: Training{GlobalBatch: 16}, Tunables: DefaultTunables()}
	in := mustEval(t, small, Plan{TP: 2, PP: 1, DP: 4, MicroBatch: 1})
	across := mustEval(t, small, Plan{TP: 2, PP: 1, DP: 8, MicroBatch: 1})
	if !near(in.DPCommSec*450/50*(7.0/8)/(3.0/4), across.DPCommSec, 1e-9) {
		t.Errorf("dp in node %.5f s vs across nodes %.5f s: link choice wrong", in.DPCommSec, across.DPCommSec)
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
	if ev.MFU <= 0 || ev.MFU >= c.Tunables.Efficiency {
		t.Errorf("MFU %.3f should be below the compute efficiency %.2f (communication and bubble cost time)", ev.MFU, c.Tunables.Efficiency)
	}
	if !near(ev.StepSeconds, ev.ComputeSec+ev.TPCommSec+ev.PPCommSec+ev.BubbleSec+ev.DPExposedSec, 1e-9) {
		t.Errorf("step %.3f is not the sum of its parts", ev.StepSeconds)
	}
	faster := c
	faster.Tunables.Efficiency = 0.7
	if f := mustEval(t, faster, ev.Plan); f.StepSeconds >= ev.StepSeconds {
		t.Errorf("higher efficiency did not shorten the step")
	}
}

func TestCheckpointAndStartup(t *testing.T) {
	c := config(t, "gpt3-175b", "h100")
	c.Tunables.CheckpointInterval = 10 * time.Minute
	ev := mustEval(t, c, Plan{TP: 8, PP: 8, DP: 16, MicroBatch: 1})
	state := c.Model.Params() * 14
	if !near(ev.CheckpointSec, state/100e9, 1e-9) || !near(ev.CheckpointOverhead, state/100e9/600, 1e-9) {
		t.Errorf("checkpoint %.2f s (%.4f of interval), want %.2f s", ev.CheckpointSec, ev.CheckpointOverhead, state/100e9)
	}
	if !near(ev.StartupSec, state/200e9+120, 1e-9) {
		t.Errorf("startup %.2f s, want %.2f", ev.StartupSec, state/200e9+120)
	}
	c.Tunables.CheckpointInterval = 0
	if ev := mustEval(t, c, ev.Plan); ev.CheckpointOverhead != 0 {
		t.Errorf("no interval should mean no amortised cost")
	}
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
		{"interleave split", Plan{TP: 8, PP: 8, DP: 8, MicroBatch: 1, VirtualStages: 5}, nil, "do not split"},
		{"interleave microbatches", Plan{TP: 8, PP: 8, DP: 16, MicroBatch: 16, VirtualStages: 2}, nil, "multiple of pp"},
		{"microbatch count", Plan{TP: 8, PP: 8, DP: 16, MicroBatch: 1, NumMicroBatches: 7}, nil, "≠ global batch"},
		{"fp8 on a100", Plan{TP: 8, PP: 8, DP: 16, MicroBatch: 1}, func(c *Config) {
			c.Hardware, _ = LookupHardware("a100-80gb")
			c.Training.Precision = PrecisionFP8
		}, "no fp8"},
		{"bad efficiency", Plan{TP: 8, PP: 8, DP: 16, MicroBatch: 1}, func(c *Config) { c.Tunables.Efficiency = 1.5 }, "efficiency"},
		{"bad zero", Plan{TP: 8, PP: 8, DP: 16, MicroBatch: 1}, func(c *Config) { c.Training.ZeROStage = 4 }, "zero stage"},
		{"bad recompute", Plan{TP: 8, PP: 8, DP: 16, MicroBatch: 1}, func(c *Config) { c.Training.Recompute = "some" }, "unknown recompute"},
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

func TestUnevenPipelineNote(t *testing.T) {
	c := config(t, "llama3-405b", "h100")
	ev := mustEval(t, c, Plan{TP: 8, PP: 16, DP: 16, MicroBatch: 1})
	if ev.LayersPerStage != 8 || len(ev.Notes) != 1 || !strings.Contains(ev.Notes[0], "uneven") {
		t.Fatalf("126 layers over 16 stages: busiest %d, notes %v", ev.LayersPerStage, ev.Notes)
	}
}

func TestCalibrate(t *testing.T) {
	truth := config(t, "gpt3-175b", "a100-80gb")
	truth.Tunables.Efficiency = 0.42
	p := Plan{TP: 8, PP: 8, DP: 16, MicroBatch: 1, VirtualStages: 2}
	measured := mustEval(t, truth, p).StepSeconds

	c := config(t, "gpt3-175b", "a100-80gb")
	if err := c.Calibrate(p, measured); err != nil {
		t.Fatal(err)
	}
	if !near(c.Tunables.Efficiency, 0.42, 1e-9) {
		t.Fatalf("calibrated efficiency %.6f, want 0.42", c.Tunables.Efficiency)
	}
	if got := mustEval(t, c, p).StepSeconds; !near(got, measured, 1e-9) {
		t.Fatalf("calibrated model predicts %.4f s, measured %.4f s", got, measured)
	}

	tests := []struct {
		name     string
		measured float64
		want     string
	}{
		{"zero", 0, "positive number"},
		{"nan", math.NaN(), "positive number"},
		{"faster than communication", 0.01, "communication alone"},
		{"faster than peak", measured * 0.3, "of peak"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c := config(t, "gpt3-175b", "a100-80gb")
			err := c.Calibrate(p, tt.measured)
			if err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Fatalf("error %v, want %q", err, tt.want)
			}
			if c.Tunables.Efficiency != DefaultTunables().Efficiency {
				t.Fatalf("a failed calibration changed the efficiency")
			}
		})
	}
}

func TestTunablesSet(t *testing.T) {
	tu := DefaultTunables()
	for k, v := range map[string]string{"efficiency": "0.4", "dp_overlap": "0.5", "reserved_gib": "2",
		"checkpoint_interval": "1h", "startup_wait": "30s", "checkpoint_write_gbps": "10"} {
		if err := tu.Set(k, v); err != nil {
			t.Fatalf("Set(%s, %s): %v", k, v, err)
		}
	}
	if tu.Efficiency != 0.4 || tu.DPOverlap != 0.5 || tu.ReservedBytes != 2<<30 || tu.CheckpointInterval != time.Hour ||
		tu.StartupWait != 30*time.Second || tu.CheckpointWriteBytesPerSec != 10e9 {
		t.Fatalf("Set left %+v", tu)
	}
	for k, v := range map[string]string{"efficiency": "x", "checkpoint_interval": "soon", "speed": "1"} {
		if err := tu.Set(k, v); err == nil {
			t.Errorf("Set(%s, %s) accepted", k, v)
		}
	}
}
