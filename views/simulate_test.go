package views

import (
	"bytes"
	"testing"
	"time"

	"github.com/gpuctl/gpuctl/scheduler/costmodel"
	"github.com/gpuctl/gpuctl/scheduler/simulate"
)

func TestSimTrace(t *testing.T) {
	rows := []simulate.TraceRow{
		{Result: simulate.Result{Policy: "fifo", Jobs: 3034, Nodes: 40, GPUs: 320, CheckpointSeconds: 1800, MeanJCT: 52000, P50JCT: 9000,
			P95JCT: 250000, P99JCT: 640000, MeanQueue: 30000, Makespan: 4000000, Utilization: 0.412, Restarts: 17, Preemptions: 0, LostGPUHours: 31.4}, WallSeconds: 0.5},
		{Result: simulate.Result{Policy: "sjf", Jobs: 3034, Nodes: 40, GPUs: 320, CheckpointSeconds: 1800, MeanJCT: 31000, P50JCT: 4000,
			P95JCT: 150000, P99JCT: 600000, MeanQueue: 9000, Makespan: 3900000, Utilization: 0.42, Restarts: 12, Preemptions: 40, LostGPUHours: 12}, WallSeconds: 0.75},
	}
	var b bytes.Buffer
	if err := SimTrace(&b, "philly.json", rows); err != nil {
		t.Fatal(err)
	}
	golden(t, b.Bytes())
}

func TestSimRun(t *testing.T) {
	doc := simulate.RunDocument{
		Model: costmodel.Model{Name: "llama2-70b"}, GPU: "h100", GPUs: 256,
		Plan: costmodel.Evaluation{Plan: costmodel.Plan{TP: 2, PP: 8, DP: 16, MicroBatch: 1, NumMicroBatches: 64}, StepSeconds: 16.24, MFU: 0.453},
		Cluster: simulate.RunCluster{JobNodes: 32, SpareNodes: 24, GPUsPerNode: 8, MTBFSeconds: 7200, GPUFaultShare: 0.59, RepairSeconds: 86400, Seed: 3,
			CheckpointSeconds: 10, CheckpointInterval: 360, DetectSeconds: 30, RestartSeconds: 126, TrainTokens: 8.39e10, Steps: 20000, FailureFreeSeconds: 324800},
		Predicted:         simulate.RunPrediction{EffectiveSeconds: 349700, Goodput: 0.9287, Interruptions: 48.6},
		Simulated:         simulate.FailureResult{WallSeconds: 354700, Goodput: 0.9157, Interruptions: 62, GPUFailures: 39, NodeFailures: 23, Replacements: 62, LostWorkSeconds: 11900, RecoverySeconds: 9700, Checkpoints: 870},
		DifferencePercent: 1.42,
	}
	var b bytes.Buffer
	if err := SimRun(&b, doc, 20*time.Millisecond); err != nil {
		t.Fatal(err)
	}
	golden(t, b.Bytes())
}
