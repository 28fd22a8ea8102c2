package costmodel

import (
	"errors"
	"fmt"
	"math"
	"strconv"
	"strings"
	"time"
)

// Precision is the arithmetic the matmuls run in.
type Precision string

// Precisions the cost model knows.
const (
	PrecisionBF16 Precision = "bf16"
	PrecisionFP16 Precision = "fp16"
	PrecisionFP8  Precision = "fp8"
)

// Recompute is the activation recomputation strategy.
type Recompute string

// Recomputation strategies, as Megatron-LM's --recompute-granularity names them.
const (
	RecomputeNone      Recompute = "none"
	RecomputeSelective Recompute = "selective"
	RecomputeFull      Recompute = "full"
)

// Training is how the model is trained, independent of the parallel plan.
type Training struct {
	// GlobalBatch is the number of sequences per optimizer step.
	GlobalBatch int `json:"global_batch"`
	// Precision of the matmuls; "" means bf16.
	Precision Precision `json:"precision"`
	// ZeROStage shards optimizer state (1), also gradients (2), also
	// parameters (3) across the data-parallel group.
	ZeROStage int `json:"zero_stage"`
	// Recompute is the activation recomputation strategy; "" means none.
	Recompute Recompute `json:"recompute"`
	// SequenceParallel splits the non-tensor-parallel activations (norms,
	// dropout) across the tensor-parallel group (Korthikanti et al. 2022).
	SequenceParallel bool `json:"sequence_parallel"`
}

// Validate reports the first impossible value in t.
func (t Training) Validate() error {
	switch {
	case t.GlobalBatch <= 0:
		return fmt.Errorf("global batch must be positive, got %d", t.GlobalBatch)
	case t.ZeROStage < 0 || t.ZeROStage > 3:
		return fmt.Errorf("zero stage must be 0, 1, 2 or 3, got %d", t.ZeROStage)
	}
	switch t.Precision {
	case "", PrecisionBF16, PrecisionFP16, PrecisionFP8:
	default:
		return fmt.Errorf("unknown precision %q: use bf16, fp16 or fp8", t.Precision)
	}
	switch t.Recompute {
	case "", RecomputeNone, RecomputeSelective, RecomputeFull:
	default:
		return fmt.Errorf("unknown recompute %q: use none, selective or full", t.Recompute)
	}
	return nil
}

// Tunables are the figures a site calibrates: how close to peak the GPUs
// run, how much communication hides behind compute, and storage speed.
type Tunables struct {
	// Efficiency is the fraction of peak FLOP/s the model's kernels sustain
	// (Calibrate fits it to a measured step time).
	Efficiency float64 `json:"efficiency"`
	// DPOverlap is the fraction of the data-parallel gradient reduction
	// hidden behind the backward pass.
	DPOverlap float64 `json:"dp_overlap"`
	// ReservedBytes is per-GPU memory the model cannot use: CUDA context,
	// NCCL buffers, allocator fragmentation.
	ReservedBytes int64 `json:"reserved_bytes"`
	// ParamBytes, GradBytes and OptimizerBytes are bytes per parameter:
	// mixed-precision Adam keeps 2 (bf16 weights) + 2 (bf16 gradients) +
	// 12 (fp32 master weights, momentum, variance) — the ZeRO paper's 16.
	ParamBytes     float64 `json:"param_bytes"`
	GradBytes      float64 `json:"grad_bytes"`
	OptimizerBytes float64 `json:"optimizer_bytes"`
	// CheckpointBytesPerParam is what a checkpoint stores per parameter
	// (bf16 weights plus fp32 optimizer state: 14).
	CheckpointBytesPerParam float64 `json:"checkpoint_bytes_per_param"`
	// CheckpointWriteBytesPerSec and CheckpointReadBytesPerSec are the
	// storage system's aggregate bandwidth for this job.
	CheckpointWriteBytesPerSec float64 `json:"checkpoint_write_bytes_per_sec"`
	CheckpointReadBytesPerSec  float64 `json:"checkpoint_read_bytes_per_sec"`
	// CheckpointInterval is the time between checkpoints; 0 disables the
	// amortised checkpoint cost.
	CheckpointInterval time.Duration `json:"checkpoint_interval_ns"`
	// StartupWait is the fixed part of a (re)start: scheduling, container
	// start, NCCL initialisation.
	StartupWait time.Duration `json:"startup_wait_ns"`
}

// DefaultTunables are starting figures for a well-tuned Megatron-LM run on
// an InfiniBand cluster with a parallel file system; calibrate them.
func DefaultTunables() Tunables {
	return Tunables{
		Efficiency:                 0.55,
		DPOverlap:                  0.7,
		ReservedBytes:              4 * gib,
		ParamBytes:                 2,
		GradBytes:                  2,
		OptimizerBytes:             12,
		CheckpointBytesPerParam:    14,
		CheckpointWriteBytesPerSec: 100 * gb,
		CheckpointReadBytesPerSec:  200 * gb,
		CheckpointInterval:         30 * time.Minute,
		StartupWait:                2 * time.Minute,
	}
}

// TunableFields lists the keys Tunables.Set accepts.
var TunableFields = []string{
	"efficiency", "dp_overlap", "reserved_gib", "param_bytes", "grad_bytes", "optimizer_bytes",
	"checkpoint_bytes_per_param", "checkpoint_write_gbps", "checkpoint_read_gbps",
	"checkpoint_interval (duration)", "startup_wait (duration)",
}

// Set overrides one tunable by key (see TunableFields).
func (t *Tunables) Set(key, value string) error {
	switch key {
	case "checkpoint_interval", "startup_wait":
		d, err := time.ParseDuration(value)
		if err != nil || d < 0 {
			return fmt.Errorf("tunable %s: %q is not a non-negative duration such as 30m", key, value)
		}
		if key == "checkpoint_interval" {
			t.CheckpointInterval = d
		} else {
			t.StartupWait = d
		}
		return nil
	}
	v, err := strconv.ParseFloat(value, 64)
	if err != nil || v < 0 {
		return fmt.Errorf("tunable %s: %q is not a non-negative number", key, value)
	}
	switch key {
	case "efficiency":
		t.Efficiency = v
	case "dp_overlap":
		t.DPOverlap = v
	case "reserved_gib":
		t.ReservedBytes = int64(v * gib)
	case "param_bytes":
		t.ParamBytes = v
	case "grad_bytes":
		t.GradBytes = v
	case "optimizer_bytes":
		t.OptimizerBytes = v
	case "checkpoint_bytes_per_param":
		t.CheckpointBytesPerParam = v
	case "checkpoint_write_gbps":
		t.CheckpointWriteBytesPerSec = v * gb
	case "checkpoint_read_gbps":
		t.CheckpointReadBytesPerSec = v * gb
	default:
		return fmt.Errorf("unknown tunable %q: use one of %s", key, strings.Join(TunableFields, ", "))
	}
	return nil
}

// Validate reports the first impossible value in t.
func (t Tunables) Validate() error {
	switch {
	case t.Efficiency <= 0 || t.Efficiency > 1:
		return fmt.Errorf("efficiency must be in (0, 1], got %g", t.Efficiency)
	case t.DPOverlap < 0 || t.DPOverlap > 1:
		return fmt.Errorf("dp overlap must be in [0, 1], got %g", t.DPOverlap)
	case t.ReservedBytes < 0:
		return fmt.Errorf("reserved bytes must not be negative")
	case t.ParamBytes <= 0 || t.GradBytes < 0 || t.OptimizerBytes < 0:
		return fmt.Errorf("bytes per parameter must be positive (param) and non-negative (grad, optimizer)")
	case t.CheckpointBytesPerParam < 0 || t.CheckpointWriteBytesPerSec < 0 || t.CheckpointReadBytesPerSec < 0:
		return fmt.Errorf("checkpoint sizes and bandwidths must not be negative")
	case t.CheckpointInterval < 0 || t.StartupWait < 0:
		return fmt.Errorf("checkpoint interval and startup wait must not be negative")
	}
	return nil
}

// Config is everything an evaluation needs except the plan.
type Config struct {
	Model    Model    `json:"model"`
	Hardware Hardware `json:"hardware"`
	Training Training `json:"training"`
	Tunables Tunables `json:"tunables"`
}

// Validate checks every part of c.
func (c Config) Validate() error {
	if err := c.Model.Validate(); err != nil {
		return err
	}
	if err := c.Hardware.Validate(); err != nil {
		return err
	}
	if err := c.Training.Validate(); err != nil {
		return err
	}
	if c.Training.Precision == PrecisionFP8 && c.Hardware.PeakFP8TFLOPS <= 0 {
		return fmt.Errorf("gpu %s has no fp8 tensor cores: use bf16", c.Hardware.Name)
	}
	return c.Tunables.Validate()
}

// Plan is one way to split a job across GPUs.
type Plan struct {
	TP int `json:"tp"`
	PP int `json:"pp"`
	DP int `json:"dp"`
	// MicroBatch is the micro-batch size in sequences.
	MicroBatch int `json:"micro_batch_size"`
	// NumMicroBatches is micro-batches per step per data-parallel replica;
	// 0 lets Evaluate derive GlobalBatch/(DP·MicroBatch).
	NumMicroBatches int `json:"num_microbatches"`
	// VirtualStages is the number of model chunks per pipeline stage
	// (interleaved 1F1B); 0 or 1 means the plain schedule.
	VirtualStages int `json:"virtual_stages"`
}

// GPUs is the number of GPUs the plan uses.
func (p Plan) GPUs() int { return p.TP * p.PP * p.DP }

// String renders p compactly for logs and tables; zero fields (a family
// of plans in a Rejection) are left out.
func (p Plan) String() string {
	var b strings.Builder
	add := func(k string, v int) {
		if v == 0 {
			return
		}
		if b.Len() > 0 {
			b.WriteByte(' ')
		}
		fmt.Fprintf(&b, "%s=%d", k, v)
	}
	add("tp", p.TP)
	add("pp", p.PP)
	add("dp", p.DP)
	add("mbs", p.MicroBatch)
	add("m", p.NumMicroBatches)
	if p.VirtualStages > 1 {
		add("v", p.VirtualStages)
	}
	return b.String()
}

// Evaluation is the cost model's prediction for one plan.
type Evaluation struct {
	Plan
	// StepSeconds is the predicted time of one optimizer step.
	StepSeconds float64 `json:"step_seconds"`
	// TFLOPSPerGPU counts hardware FLOPs (recomputation included), as
	// Megatron-LM reports throughput.
	TFLOPSPerGPU float64 `json:"tflops_per_gpu"`
	// MFU is model FLOPs (no recomputation) over peak: the PaLM definition.
	MFU float64 `json:"mfu"`
	// MemPerGPUBytes is the peak memory of the busiest GPU (first stage).
	MemPerGPUBytes int64 `json:"mem_per_gpu_bytes"`
	// Fits reports MemPerGPUBytes ≤ the GPU's memory.
	Fits          bool    `json:"fits"`
	TokensPerSec  float64 `json:"tokens_per_sec"`
	ComputeSec    float64 `json:"compute_seconds"`
	BubbleSec     float64 `json:"bubble_seconds"`
	TPCommSec     float64 `json:"tp_comm_seconds"`
	PPCommSec     float64 `json:"pp_comm_seconds"`
	DPCommSec     float64 `json:"dp_comm_seconds"`
	DPExposedSec  float64 `json:"dp_exposed_seconds"`
	WeightBytes   int64   `json:"weight_bytes"`
	GradBytes     int64   `json:"grad_bytes"`
	OptimizerB    int64   `json:"optimizer_bytes"`
	ActivationB   int64   `json:"activation_bytes"`
	ReservedBytes int64   `json:"reserved_bytes"`
	// LayersPerStage is the largest number of blocks on one stage.
	LayersPerStage int `json:"layers_per_stage"`
	// CheckpointSec is one checkpoint write; CheckpointOverhead is its share
	// of each checkpoint interval.
	CheckpointSec      float64 `json:"checkpoint_seconds"`
	CheckpointOverhead float64 `json:"checkpoint_overhead"`
	// StartupSec is a (re)start: reading the checkpoint plus the fixed wait.
	StartupSec float64 `json:"startup_seconds"`
	// Notes explain approximations that apply to this plan.
	Notes []string `json:"notes,omitempty"`
}

// ErrInvalidPlan is wrapped by Evaluate when a plan cannot run at all.
var ErrInvalidPlan = errors.New("invalid plan")

// terms are the parts of the step time that calibration separates:
// step = k·(computeAtPeak/efficiency + commPerMicro) + dpExposed.
type terms struct {
	k             float64 // micro-batch slots on the critical path: m + (p−1)/v
	computeAtPeak float64 // slowest stage's compute per micro-batch at 100% of peak
	tpComm        float64 // per micro-batch
	ppComm        float64 // per micro-batch
	dpComm        float64
	dpExposed     float64
	layersMax     int
	uneven        bool
}

// Evaluate predicts step time, throughput and memory for p. A plan that
// does not fit in memory is not an error: Fits says so and the numbers show
// by how much. Plans that cannot run wrap ErrInvalidPlan.
func (c Config) Evaluate(p Plan) (Evaluation, error) {
	if err := c.Validate(); err != nil {
		return Evaluation{}, err
	}
	p, err := c.normalize(p)
	if err != nil {
		return Evaluation{}, err
	}
	return c.evaluate(p), nil
}

// normalize fills derived plan fields and checks the plan can run.
func (c Config) normalize(p Plan) (Plan, error) {
	if p.VirtualStages == 0 {
		p.VirtualStages = 1
	}
	m := c.Model
	switch {
	case p.TP <= 0 || p.PP <= 0 || p.DP <= 0 || p.MicroBatch <= 0 || p.VirtualStages < 0:
		return p, fmt.Errorf("%w: tp, pp, dp and micro-batch size must be positive (%s)", ErrInvalidPlan, p)
	case p.TP > c.Hardware.GPUsPerNode:
		return p, fmt.Errorf("%w: tp %d exceeds the %d GPUs of one %s node (tensor parallelism stays inside a node)",
			ErrInvalidPlan, p.TP, c.Hardware.GPUsPerNode, c.Hardware.Name)
	case m.Heads%p.TP != 0 || m.kvHeads()%p.TP != 0:
		return p, fmt.Errorf("%w: tp %d does not divide %d heads / %d kv heads", ErrInvalidPlan, p.TP, m.Heads, m.kvHeads())
	case p.PP > m.Layers:
		return p, fmt.Errorf("%w: pp %d exceeds %d layers", ErrInvalidPlan, p.PP, m.Layers)
	case p.VirtualStages > 1 && p.PP < 2:
		return p, fmt.Errorf("%w: interleaving (virtual stages %d) needs pp ≥ 2", ErrInvalidPlan, p.VirtualStages)
	case p.VirtualStages > 1 && m.Layers%(p.PP*p.VirtualStages) != 0:
		return p, fmt.Errorf("%w: %d layers do not split into pp %d × virtual stages %d", ErrInvalidPlan, m.Layers, p.PP, p.VirtualStages)
	}
	per := p.DP * p.MicroBatch
	if c.Training.GlobalBatch%per != 0 {
		return p, fmt.Errorf("%w: global batch %d is not divisible by dp %d × micro-batch %d", ErrInvalidPlan, c.Training.GlobalBatch, p.DP, p.MicroBatch)
	}
	m0 := c.Training.GlobalBatch / per
	if p.NumMicroBatches == 0 {
		p.NumMicroBatches = m0
	} else if p.NumMicroBatches != m0 {
		return p, fmt.Errorf("%w: %d micro-batches × %d × dp %d ≠ global batch %d", ErrInvalidPlan, p.NumMicroBatches, p.MicroBatch, p.DP, c.Training.GlobalBatch)
	}
	if p.VirtualStages > 1 && p.NumMicroBatches%p.PP != 0 {
		return p, fmt.Errorf("%w: the interleaved schedule needs micro-batches (%d) to be a multiple of pp %d", ErrInvalidPlan, p.NumMicroBatches, p.PP)
	}
	return p, nil
}

// peakFLOPs is the peak for the training precision, in FLOP/s.
func (c Config) peakFLOPs() float64 {
	if c.Training.Precision == PrecisionFP8 {
		return c.Hardware.PeakFP8TFLOPS * 1e12
	}
	return c.Hardware.PeakTFLOPS * 1e12
}

// timeTerms computes the parts of the step time for a normalised plan.
func (c Config) timeTerms(p Plan) terms {
	m, hw, tr := c.Model, c.Hardware, c.Training
	v := float64(p.VirtualStages)
	t := float64(p.TP)
	var tm terms

	// Layers per stage: split as evenly as possible, the larger stages first
	// so the last stage, which also computes the logits, carries fewer.
	lmax := (m.Layers + p.PP - 1) / p.PP
	llast := m.Layers - (p.PP-1)*lmax
	if m.Layers%p.PP != 0 {
		tm.uneven = true
		llast = m.Layers / p.PP
	}
	if p.PP == 1 {
		llast = m.Layers
	}
	tm.layersMax = lmax

	f := m.forwardFLOPsPerToken()
	perLayer := (f.matmul + f.attn) / float64(m.Layers)
	mult := 3.0 * perLayer
	switch tr.Recompute {
	case RecomputeFull:
		mult += perLayer
	case RecomputeSelective:
		mult += f.attn / float64(m.Layers)
	}
	tokens := float64(p.MicroBatch) * float64(m.SeqLen)
	first := float64(lmax) * mult
	last := float64(llast)*mult + 3*f.logits
	tm.computeAtPeak = tokens * math.Max(first, last) / t / c.peakFLOPs()

	// Tensor parallelism: two all-reduces per block forward and two
	// backward (a third pair when full recomputation reruns the forward),
	// each moving 2(t−1)/t of the b·s·h activation over NVLink.
	act := tokens * float64(m.Hidden) * 2 // bf16 activations
	if p.TP > 1 {
		n := 4.0
		if tr.Recompute == RecomputeFull {
			n = 6
		}
		tm.tpComm = float64(lmax) * n * 2 * (t - 1) / t * act / hw.NVLinkBytesPerSec
	}
	// Pipeline: one activation forward and one gradient backward per
	// micro-batch per model chunk, split across the tp ranks (Megatron's
	// scatter/gather, SC'21 §4.1). Always charged to the inter-node link:
	// stage boundaries inside a node are the exception at scale.
	if p.PP > 1 {
		tm.ppComm = 2 * v * (act / t) / hw.NetBytesPerSec
	}
	tm.k = float64(p.NumMicroBatches) + float64(p.PP-1)/v

	// Data parallelism: ring all-reduce of this GPU's gradients,
	// 2(d−1)/d × bytes; ZeRO-3 also gathers parameters twice (1.5×). The
	// ring runs over NVLink only when the whole tp×dp group sits in a node.
	if p.DP > 1 {
		d := float64(p.DP)
		bytes := c.paramsPerGPU(p, lmax) * c.Tunables.GradBytes
		vol := 2 * (d - 1) / d * bytes
		if tr.ZeROStage == 3 {
			vol *= 1.5
		}
		bw := hw.NetBytesPerSec
		if p.TP*p.DP <= hw.GPUsPerNode {
			bw = hw.NVLinkBytesPerSec
		}
		tm.dpComm = vol / bw
		tm.dpExposed = (1 - c.Tunables.DPOverlap) * tm.dpComm
	}
	return tm
}

// paramsPerGPU is the parameter count held by the busiest stage's GPU
// before ZeRO sharding: its blocks and an embedding table, split over tp.
func (c Config) paramsPerGPU(p Plan, lmax int) float64 {
	m := c.Model
	emb := float64(m.Vocab) * float64(m.Hidden)
	if p.PP == 1 {
		emb = m.EmbeddingParams()
	} else if m.LearnedPositions {
		emb += float64(m.SeqLen) * float64(m.Hidden)
	}
	return (float64(lmax)*m.LayerParams() + emb) / float64(p.TP)
}

// activationBytesPerLayer is one block's stored activations for one
// micro-batch, from Korthikanti et al. 2022 (Table 2): s·b·h·(34 + 5·a·s/h)
// bytes without parallelism, the 34 part split by t with sequence
// parallelism (10 + 24/t without it) and the a·s/h part by t.
func (c Config) activationBytesPerLayer(p Plan, r Recompute) float64 {
	m := c.Model
	s, b, h, a, t := float64(m.SeqLen), float64(p.MicroBatch), float64(m.Hidden), float64(m.Heads), float64(p.TP)
	sbh := s * b * h
	linear := 10 + 24/t
	if c.Training.SequenceParallel {
		linear = 34 / t
	}
	attn := 5 * a * s / (h * t)
	switch r {
	case RecomputeFull:
		// Only the block input is kept (2 bytes per element).
		if c.Training.SequenceParallel {
			return 2 * sbh / t
		}
		return 2 * sbh
	case RecomputeSelective:
		return sbh * linear
	}
	return sbh * (linear + attn)
}

// evaluate computes the full evaluation of a normalised plan.
func (c Config) evaluate(p Plan) Evaluation {
	m, hw, tr, tu := c.Model, c.Hardware, c.Training, c.Tunables
	tm := c.timeTerms(p)
	eff := tu.Efficiency
	perMicro := tm.computeAtPeak/eff + tm.tpComm + tm.ppComm
	pipe := tm.k * perMicro
	step := pipe + tm.dpExposed

	gpus := float64(p.GPUs())
	modelF, hwF := m.IterationFLOPs(tr.GlobalBatch, tr.Recompute)

	ev := Evaluation{
		Plan:           p,
		StepSeconds:    step,
		TFLOPSPerGPU:   hwF / step / gpus / 1e12,
		MFU:            modelF / step / gpus / c.peakFLOPs(),
		TokensPerSec:   float64(tr.GlobalBatch) * float64(m.SeqLen) / step,
		ComputeSec:     float64(p.NumMicroBatches) * tm.computeAtPeak / eff,
		BubbleSec:      float64(p.PP-1) / float64(p.VirtualStages) * perMicro,
		TPCommSec:      float64(p.NumMicroBatches) * tm.tpComm,
		PPCommSec:      float64(p.NumMicroBatches) * tm.ppComm,
		DPCommSec:      tm.dpComm,
		DPExposedSec:   tm.dpExposed,
		LayersPerStage: tm.layersMax,
		ReservedBytes:  tu.ReservedBytes,
	}

	// Model state, sharded by ZeRO across the data-parallel group.
	n := c.paramsPerGPU(p, tm.layersMax)
	d := float64(p.DP)
	w, g, o := n*tu.ParamBytes, n*tu.GradBytes, n*tu.OptimizerBytes
	if tr.ZeROStage >= 1 {
		o /= d
	}
	if tr.ZeROStage >= 2 {
		g /= d
	}
	if tr.ZeROStage >= 3 {
		w /= d
	}
	ev.WeightBytes, ev.GradBytes, ev.OptimizerB = int64(w), int64(g), int64(o)

	// Activations on the first stage: under 1F1B it holds min(m, p)
	// micro-batches of its blocks — p·(L/p) = L blocks' worth when m ≥ p —
	// times (1 + (p−1)/(p·v)) when interleaved (Korthikanti et al. §4.2.3).
	inflight := float64(min(p.NumMicroBatches, p.PP))
	perLayer := c.activationBytesPerLayer(p, tr.Recompute)
	act := perLayer * float64(tm.layersMax) * inflight
	if p.VirtualStages > 1 {
		act *= 1 + float64(p.PP-1)/float64(p.PP*p.VirtualStages)
	}
	if tr.Recompute == RecomputeFull {
		// Recomputing one block in the backward pass needs its full
		// activations once more.
		act += c.activationBytesPerLayer(p, RecomputeNone)
	}
	ev.ActivationB = int64(act)
	ev.MemPerGPUBytes = ev.WeightBytes + ev.GradBytes + ev.OptimizerB + ev.ActivationB + ev.ReservedBytes
	ev.Fits = ev.MemPerGPUBytes <= hw.HBMBytes

	// Checkpoint and restart costs, amortised over the interval.
	state := m.Params() * tu.CheckpointBytesPerParam
	if tu.CheckpointWriteBytesPerSec > 0 {
		ev.CheckpointSec = state / tu.CheckpointWriteBytesPerSec
		if tu.CheckpointInterval > 0 {
			ev.CheckpointOverhead = ev.CheckpointSec / tu.CheckpointInterval.Seconds()
		}
	}
	ev.StartupSec = tu.StartupWait.Seconds()
	if tu.CheckpointReadBytesPerSec > 0 {
		ev.StartupSec += state / tu.CheckpointReadBytesPerSec
	}
	if tm.uneven {
		ev.Notes = append(ev.Notes, fmt.Sprintf("uneven pipeline: %d layers over %d stages, the busiest holds %d", m.Layers, p.PP, tm.layersMax))
	}
	return ev
}

// Calibrate sets Tunables.Efficiency so that Evaluate(p) predicts the
// measured step time. Communication terms are kept as they are: a step
// faster than communication alone, or one needing more than peak, is an
// error that points at the bandwidth or peak figures instead.
func (c *Config) Calibrate(p Plan, measuredStepSeconds float64) error {
	if measuredStepSeconds <= 0 || math.IsNaN(measuredStepSeconds) || math.IsInf(measuredStepSeconds, 0) {
		return fmt.Errorf("calibrate: measured step time must be a positive number of seconds, got %g", measuredStepSeconds)
	}
	if err := c.Validate(); err != nil {
		return fmt.Errorf("calibrate: %w", err)
	}
	p, err := c.normalize(p)
	if err != nil {
		return fmt.Errorf("calibrate: %w", err)
	}
	tm := c.timeTerms(p)
	comm := tm.k*(tm.tpComm+tm.ppComm) + tm.dpExposed
	left := measuredStepSeconds - comm
	if left <= 0 {
		return fmt.Errorf("calibrate: measured %.3gs is shorter than the predicted communication alone (%.3gs): check nvlink/net bandwidth and dp_overlap", measuredStepSeconds, comm)
	}
	eff := tm.k * tm.computeAtPeak / left
	if eff > 1 {
		return fmt.Errorf("calibrate: measured %.3gs would need %.0f%% of peak: check the gpu's peak TFLOP/s, the plan or the global batch", measuredStepSeconds, eff*100)
	}
	c.Tunables.Efficiency = eff
	return nil
}

// FormatBytes renders a byte count in GiB for tables and messages.
func FormatBytes(b int64) string {
	return fmt.Sprintf("%.1f GiB", float64(b)/gib)
}
