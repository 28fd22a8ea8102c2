package simulate

import "github.com/gpuctl/gpuctl/scheduler/costmodel"

// TraceRow is one policy's replay of a trace with the wall time the
// replay took.
type TraceRow struct {
	Result
	WallSeconds float64
}

// TraceDocument is `gpuctl simulate --trace -o json`'s document; the
// README's "JSON output" documents every field.
type TraceDocument struct {
	Trace                     string         `json:"trace"`
	Jobs                      int            `json:"jobs"`
	Nodes                     int            `json:"nodes"`
	GPUs                      int            `json:"gpus"`
	CheckpointIntervalSeconds int64          `json:"checkpoint_interval_seconds"`
	Policies                  []PolicyReplay `json:"policies"`
}

// PolicyReplay is one policy's replay in a TraceDocument.
type PolicyReplay struct {
	Policy           string  `json:"policy"`
	MeanJCTSeconds   float64 `json:"mean_jct_seconds"`
	P50JCTSeconds    float64 `json:"p50_jct_seconds"`
	P95JCTSeconds    float64 `json:"p95_jct_seconds"`
	P99JCTSeconds    float64 `json:"p99_jct_seconds"`
	MeanQueueSeconds float64 `json:"mean_queue_seconds"`
	MakespanSeconds  int64   `json:"makespan_seconds"`
	Utilization      float64 `json:"utilization"`
	Restarts         int     `json:"restarts"`
	Preemptions      int     `json:"preemptions"`
	LostGPUSeconds   float64 `json:"lost_gpu_seconds"`
	Events           int     `json:"events"`
	SchedulingPasses int     `json:"scheduling_passes"`
	BackfilledStarts int     `json:"backfilled_starts"`
	WallSeconds      float64 `json:"wall_seconds"`
}

// NewTraceDocument is the document of the replays of the trace at
// tracePath, one row per policy; the cluster is the first row's.
func NewTraceDocument(tracePath string, rows []TraceRow) TraceDocument {
	doc := TraceDocument{Trace: tracePath, Policies: []PolicyReplay{}}
	for i, r := range rows {
		if i == 0 {
			doc.Jobs, doc.Nodes, doc.GPUs, doc.CheckpointIntervalSeconds = r.Jobs, r.Nodes, r.GPUs, r.CheckpointSeconds
		}
		doc.Policies = append(doc.Policies, PolicyReplay{
			Policy: r.Policy, MeanJCTSeconds: r.MeanJCT, P50JCTSeconds: r.P50JCT, P95JCTSeconds: r.P95JCT, P99JCTSeconds: r.P99JCT,
			MeanQueueSeconds: r.MeanQueue, MakespanSeconds: r.Makespan, Utilization: r.Utilization, Restarts: r.Restarts,
			Preemptions: r.Preemptions, LostGPUSeconds: r.LostGPUHours * 3600, Events: r.Events, SchedulingPasses: r.SchedulingPasses,
			BackfilledStarts: r.BackfilledStarts, WallSeconds: r.WallSeconds,
		})
	}
	return doc
}

// RunDocument is `gpuctl simulate --model -o json`'s document: a training
// run replayed under failures against the cost model's expectation.
type RunDocument struct {
	Model costmodel.Model      `json:"model"`
	GPU   string               `json:"gpu"`
	GPUs  int                  `json:"gpus"`
	Plan  costmodel.Evaluation `json:"plan"`
	// Cluster is what the replay ran on.
	Cluster RunCluster `json:"cluster"`
	// Predicted is the cost model's expectation, Simulated the replay.
	Predicted RunPrediction `json:"predicted"`
	Simulated FailureResult `json:"simulated"`
	// DifferencePercent is simulated over predicted effective time, less 100.
	DifferencePercent float64 `json:"difference_percent"`
}

// RunCluster is the cluster and run a RunDocument replayed.
type RunCluster struct {
	JobNodes           int     `json:"job_nodes"`
	SpareNodes         int     `json:"spare_nodes"`
	GPUsPerNode        int     `json:"gpus_per_node"`
	MTBFSeconds        float64 `json:"mtbf_seconds"`
	GPUFaultShare      float64 `json:"gpu_fault_share"`
	RepairSeconds      float64 `json:"repair_seconds"`
	Seed               uint64  `json:"seed"`
	CheckpointSeconds  float64 `json:"checkpoint_seconds"`
	CheckpointInterval float64 `json:"checkpoint_interval_seconds"`
	DetectSeconds      float64 `json:"detect_seconds"`
	RestartSeconds     float64 `json:"restart_seconds"`
	TrainTokens        float64 `json:"train_tokens,omitempty"`
	Steps              int     `json:"steps"`
	FailureFreeSeconds float64 `json:"failure_free_seconds"`
}

// RunPrediction is the cost model's expectation of a run under failures.
type RunPrediction struct {
	EffectiveSeconds float64 `json:"effective_seconds"`
	Goodput          float64 `json:"goodput"`
	Interruptions    float64 `json:"interruptions"`
}

// NewRunDocument is the document of res, the replay of fc: steps of the
// training run c on best's plan.
func NewRunDocument(c costmodel.Config, best costmodel.Evaluation, fc FailureConfig, steps int, res FailureResult) RunDocument {
	g := best.Goodput
	pred := costmodel.ExpectedWallTime(fc.Work, fc.CheckpointInterval, fc.CheckpointTime, fc.Detect+fc.Restart, fc.MTBF)
	return RunDocument{
		Model: c.Model, GPU: c.Hardware.Name, GPUs: best.GPUs(), Plan: best,
		Cluster: RunCluster{JobNodes: fc.JobNodes, SpareNodes: fc.Spares, GPUsPerNode: fc.GPUsPerNode, MTBFSeconds: fc.MTBF,
			GPUFaultShare: fc.GPUFaultShare, RepairSeconds: fc.Repair, Seed: fc.Seed, CheckpointSeconds: fc.CheckpointTime,
			CheckpointInterval: fc.CheckpointInterval, DetectSeconds: fc.Detect, RestartSeconds: fc.Restart,
			TrainTokens: c.Training.TrainTokens, Steps: steps, FailureFreeSeconds: fc.Work},
		Predicted:         RunPrediction{EffectiveSeconds: pred, Goodput: g.Fraction, Interruptions: pred / fc.MTBF},
		Simulated:         res,
		DifferencePercent: (res.WallSeconds/pred - 1) * 100,
	}
}
