package costmodel

import (
	"errors"
	"fmt"
	"math"
	"strings"
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

// Attention is the attention kernel.
type Attention string

// Attention kernels.
const (
	// AttentionFlash is a fused kernel (FlashAttention, cuDNN fused
	// attention) that never stores the score matrix and recomputes it in
	// the backward pass.
	AttentionFlash Attention = "flash"
	// AttentionUnfused is attention as two batched GEMMs around a
	// materialised softmax (Megatron-LM before fused attention, 2021–22).
	AttentionUnfused Attention = "unfused"
)

// Training is how the model is trained, independent of the parallel plan.
type Training struct {
	// GlobalBatch is the number of sequences per optimizer step.
	GlobalBatch int `json:"global_batch"`
	// Precision of the matmuls; "" means bf16.
	Precision Precision `json:"precision,omitempty"`
	// ZeROStage shards optimizer state (1, Megatron's distributed
	// optimizer), also gradients (2), also parameters (3, FSDP) across the
	// data-parallel group.
	ZeROStage int `json:"zero_stage"`
	// Recompute is the activation recomputation strategy; "" means none.
	Recompute Recompute `json:"recompute,omitempty"`
	// SequenceParallel splits the non-tensor-parallel activations (norms,
	// dropout) across the tensor-parallel group (Korthikanti et al. 2022).
	SequenceParallel bool `json:"sequence_parallel"`
	// Attention is the attention kernel; "" means flash.
	Attention Attention `json:"attention,omitempty"`
	// Stack names the training software stack (see Stack): which
	// communication it overlaps. "" is DefaultStack. The tunables carry
	// its settings (Tunables.ApplyStack); this names where they came from.
	Stack string `json:"stack,omitempty"`
	// TrainTokens is the length of the run in tokens; with it the
	// evaluation predicts the run's training time. 0: per step only.
	TrainTokens float64 `json:"train_tokens,omitempty"`
}

func (t Training) attention() Attention {
	if t.Attention == "" {
		return AttentionFlash
	}
	return t.Attention
}

// Validate reports the first impossible value in t.
func (t Training) Validate() error {
	switch {
	case t.GlobalBatch <= 0:
		return fmt.Errorf("global batch must be positive, got %d", t.GlobalBatch)
	case t.ZeROStage < 0 || t.ZeROStage > 3:
		return fmt.Errorf("zero stage must be 0, 1, 2 or 3, got %d", t.ZeROStage)
	case t.TrainTokens < 0 || math.IsNaN(t.TrainTokens) || math.IsInf(t.TrainTokens, 0):
		return fmt.Errorf("training tokens must be a non-negative number, got %g", t.TrainTokens)
	}
	if _, err := LookupStack(t.Stack); err != nil {
		return err
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
	switch t.Attention {
	case "", AttentionFlash, AttentionUnfused:
	default:
		return fmt.Errorf("unknown attention kernel %q: use flash or unfused", t.Attention)
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
	// CP is context parallelism: the sequence split across CP ranks, which
	// exchange keys and values around a ring (ring attention); 0 means 1.
	CP int `json:"cp,omitempty"`
	PP int `json:"pp"`
	DP int `json:"dp"`
	// MicroBatch is the micro-batch size in sequences.
	MicroBatch int `json:"micro_batch"`
	// NumMicroBatches is micro-batches per step per data-parallel replica;
	// 0 lets Evaluate derive GlobalBatch/(DP·MicroBatch).
	NumMicroBatches int `json:"num_micro_batches"`
	// VirtualStages is the number of model chunks per pipeline stage
	// (interleaved 1F1B); 0 or 1 means the plain schedule.
	VirtualStages int `json:"virtual_stages"`
}

// cp returns the effective context-parallel size.
func (p Plan) cp() int { return max(p.CP, 1) }

// GPUs is the number of GPUs the plan uses.
func (p Plan) GPUs() int { return p.TP * p.cp() * p.PP * p.DP }

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
	if p.CP > 1 {
		add("cp", p.CP)
	}
	add("pp", p.PP)
	add("dp", p.DP)
	add("mbs", p.MicroBatch)
	add("m", p.NumMicroBatches)
	if p.VirtualStages > 1 {
		add("v", p.VirtualStages)
	}
	return b.String()
}

// Evaluation is the cost model's prediction for one plan. Times are per
// optimizer step on the GPU that bounds it; memory is the fullest GPU's.
type Evaluation struct {
	Plan
	// StepSeconds is the predicted time of one optimizer step.
	StepSeconds float64 `json:"predicted_step_seconds"`
	// TFLOPSPerGPU counts hardware FLOPs (recomputation included), as
	// Megatron-LM reports throughput.
	TFLOPSPerGPU float64 `json:"predicted_tflops_per_gpu"`
	// MFU is model FLOPs (no recomputation) over peak: the PaLM definition.
	MFU float64 `json:"predicted_mfu"`
	// MemPerGPUBytes is the peak memory of the fullest GPU, reserve and
	// fragmentation included.
	MemPerGPUBytes int64 `json:"predicted_mem_per_gpu_bytes"`
	// Fits reports MemPerGPUBytes ≤ the GPU's memory.
	Fits         bool    `json:"fits"`
	TokensPerSec float64 `json:"predicted_tokens_per_second"`

	// ComputeSec is the kernels' time on the slowest pipeline stage over
	// the step's micro-batches: GEMMs, attention, element-wise and
	// recomputation, split in the next three.
	ComputeSec     float64 `json:"compute_seconds"`
	GEMMSec        float64 `json:"gemm_seconds"`
	AttentionSec   float64 `json:"attention_seconds"`
	ElementwiseSec float64 `json:"elementwise_seconds"`
	// RecomputeSec is the part of ComputeSec that recomputation repeats.
	RecomputeSec float64 `json:"recompute_seconds,omitempty"`
	// GEMMEfficiency is the FLOP-weighted fraction of peak the GEMMs reach.
	GEMMEfficiency float64 `json:"gemm_efficiency"`
	// OptimizerSec is the optimizer step (memory-bound).
	OptimizerSec float64 `json:"optimizer_seconds"`
	// StepOverheadSec is the GPU's fixed time per step
	// (step_overhead_seconds).
	StepOverheadSec float64 `json:"step_overhead_seconds"`
	// BubbleSec is the pipeline's fill and drain.
	BubbleSec float64 `json:"bubble_seconds"`
	// Communication per scheme: the volume's time on its link and the part
	// left exposed after overlapping with compute.
	TPCommSec    float64 `json:"tp_comm_seconds,omitempty"`
	TPExposedSec float64 `json:"tp_exposed_seconds,omitempty"`
	CPCommSec    float64 `json:"cp_comm_seconds,omitempty"`
	CPExposedSec float64 `json:"cp_exposed_seconds,omitempty"`
	PPCommSec    float64 `json:"pp_comm_seconds,omitempty"`
	PPExposedSec float64 `json:"pp_exposed_seconds,omitempty"`
	DPCommSec    float64 `json:"dp_comm_seconds,omitempty"`
	DPExposedSec float64 `json:"dp_exposed_seconds,omitempty"`
	// DPComm and DPExposed split into the gradient reduction and the
	// ZeRO 1–2 parameter gather (Overlaps shows them too).
	DPGradCommSec     float64 `json:"-"`
	DPGradExposedSec  float64 `json:"-"`
	DPParamCommSec    float64 `json:"-"`
	DPParamExposedSec float64 `json:"-"`
	ZeRO3CommSec      float64 `json:"zero3_comm_seconds,omitempty"`
	ZeRO3ExposedSec   float64 `json:"zero3_exposed_seconds,omitempty"`
	// Overlaps are the overlap terms, one per overlap tunable: what each
	// hides and what it leaves exposed (Evaluate and the search's ranked
	// plans; a plan rejected as out of memory has none).
	Overlaps []Overlap `json:"overlaps"`

	// Memory of the fullest GPU, by kind.
	WeightBytes        int64 `json:"weight_bytes"`
	GradBytes          int64 `json:"grad_bytes"`
	OptimizerB         int64 `json:"optimizer_bytes"`
	ActivationB        int64 `json:"activation_bytes"`
	CommBufferBytes    int64 `json:"comm_buffer_bytes,omitempty"`
	ReservedBytes      int64 `json:"reserved_bytes"`
	FragmentationBytes int64 `json:"fragmentation_bytes"`
	// MemoryStage is the pipeline stage holding the fullest GPU.
	MemoryStage int `json:"memory_stage"`
	// LayersPerStage is the largest number of blocks on one stage, and
	// StageLayers the blocks of every stage (embedding and output layers
	// live on the first and last).
	LayersPerStage int   `json:"layers_per_stage"`
	StageLayers    []int `json:"stage_layers,omitempty"`

	// CheckpointSec is one checkpoint write, CheckpointIntervalSec the
	// interval used (the Young–Daly one when an MTBF is known and no
	// interval is fixed), CheckpointOverhead its share of the interval.
	CheckpointSec         float64 `json:"checkpoint_seconds"`
	CheckpointIntervalSec float64 `json:"checkpoint_interval_seconds,omitempty"`
	CheckpointOverhead    float64 `json:"checkpoint_overhead,omitempty"`
	// StartupSec is a (re)start: reading the checkpoint plus the fixed wait.
	StartupSec float64 `json:"restart_seconds"`
	// Goodput is present with an MTBF: the share of wall time that is
	// useful training, and what it makes of a step and of the run.
	Goodput *Goodput `json:"goodput,omitempty"`
	// TrainSeconds is the run's failure-free training time (with
	// Training.TrainTokens).
	TrainSeconds float64 `json:"train_seconds,omitempty"`
	// Notes explain approximations that apply to this plan.
	Notes []string `json:"notes,omitempty"`
}

// ErrInvalidPlan is wrapped by Evaluate when a plan cannot run at all.
var ErrInvalidPlan = errors.New("invalid plan")

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
	ev := c.evaluate(p)
	ev.Overlaps = c.Tunables.overlaps(&ev)
	return ev, nil
}

// normalize fills derived plan fields and checks the plan can run.
func (c Config) normalize(p Plan) (Plan, error) {
	if p.VirtualStages == 0 {
		p.VirtualStages = 1
	}
	if p.CP == 0 {
		p.CP = 1
	}
	m := c.Model
	switch {
	case p.TP <= 0 || p.PP <= 0 || p.DP <= 0 || p.MicroBatch <= 0 || p.VirtualStages < 0 || p.CP < 0:
		return p, fmt.Errorf("%w: tp, cp, pp, dp and micro-batch size must be positive (%s)", ErrInvalidPlan, p)
	case p.TP > c.Hardware.GPUsPerNode:
		return p, fmt.Errorf("%w: tp %d exceeds the %d GPUs of one %s node (tensor parallelism stays inside a node)",
			ErrInvalidPlan, p.TP, c.Hardware.GPUsPerNode, c.Hardware.Name)
	case m.Heads%p.TP != 0 || m.kvHeads()%p.TP != 0:
		return p, fmt.Errorf("%w: tp %d does not divide %d heads / %d kv heads", ErrInvalidPlan, p.TP, m.Heads, m.kvHeads())
	case m.SeqLen%(2*p.CP) != 0 && p.CP > 1:
		return p, fmt.Errorf("%w: cp %d needs the sequence length %d to split into 2×%d chunks (load-balanced ring attention)", ErrInvalidPlan, p.CP, m.SeqLen, p.CP)
	case p.PP > m.Layers:
		return p, fmt.Errorf("%w: pp %d exceeds %d layers", ErrInvalidPlan, p.PP, m.Layers)
	case p.VirtualStages > 1 && p.PP < 2:
		return p, fmt.Errorf("%w: interleaving (virtual stages %d) needs pp ≥ 2", ErrInvalidPlan, p.VirtualStages)
	case p.PP*p.VirtualStages > m.Layers+2:
		return p, fmt.Errorf("%w: pp %d × virtual stages %d = %d model chunks, more than %d layers plus the embedding and output layers",
			ErrInvalidPlan, p.PP, p.VirtualStages, p.PP*p.VirtualStages, m.Layers)
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

// evaluate computes the full evaluation of a normalised plan.
func (c Config) evaluate(p Plan) Evaluation {
	m, tr := c.Model, c.Training
	e := c.engine(p)
	st := e.step()

	gpus := float64(p.GPUs())
	modelF, hwF := m.IterationFLOPs(tr.GlobalBatch, tr.Recompute)
	ev := Evaluation{
		Plan:         p,
		StepSeconds:  st.step,
		TFLOPSPerGPU: hwF / st.step / gpus / 1e12,
		MFU:          modelF / st.step / gpus / c.peakFLOPs(),
		TokensPerSec: float64(tr.GlobalBatch) * float64(m.SeqLen) / st.step,
	}
	st.fill(&ev, e)
	e.memory(&ev)
	c.checkpointAndGoodput(&ev)
	if e.lay.uneven {
		ev.Notes = append(ev.Notes, fmt.Sprintf("uneven pipeline: %d layers over %d stages × %d chunks, the embedding and output layers counted as one layer each; stages hold %v",
			m.Layers, p.PP, p.VirtualStages, ev.StageLayers))
	}
	if c.Training.attention() == AttentionUnfused && p.CP > 1 {
		ev.Notes = append(ev.Notes, "context parallelism is modelled with ring attention; with unfused attention every rank still materialises its score blocks")
	}
	return ev
}

// FormatBytes renders a byte count in GiB for tables and messages.
func FormatBytes(b int64) string {
	return fmt.Sprintf("%.1f GiB", float64(b)/gib)
}
