package costmodel

import (
	"encoding/json"
	"fmt"
	"strconv"
	"strings"
	"time"
)

// Tunables are the figures a site calibrates or sets for its software
// stack: scales on the fitted kernel and link speeds, how much of each
// kind of communication hides behind compute, memory reserves, bytes per
// parameter, storage speed and the failure rate. Every one is in
// TunableFields, shown by `gpuctl plan -o json` under the same name and
// settable with `--set name=value`.
type Tunables struct {
	// Efficiency scales the fitted kernel throughput (GEMM, attention,
	// element-wise): 1 is as fitted. Calibrate moves it to match a
	// measured step.
	Efficiency float64
	// StackComputeScale is the training stack's own scale on the fitted
	// kernel throughput, its software generation (1 for most stacks; the
	// stack sets it). It multiplies Efficiency, which calibration moves.
	StackComputeScale float64
	// CommScale scales every communication time: 1 is as modelled; below 1
	// the links are faster than the model thinks. Calibrate moves it when
	// a measured step is faster than the kernels alone allow.
	CommScale float64
	// TPOverlap, CPOverlap, PPOverlap, DPGradOverlap and DPParamOverlap
	// are the overlap terms: the fractions of tensor-parallel,
	// context-parallel, pipeline and data-parallel communication hidden
	// behind compute. A training stack (stack.go) sets them together. TP
	// and PP comm hide up to the fraction of their own time; CP comm behind
	// the attention it feeds; the gradient reduction (all-reduce, or
	// reduce-scatter under ZeRO) behind one micro-batch's backward pass and
	// the parameter all-gather (ZeRO 1–2) behind one forward pass.
	TPOverlap, CPOverlap, PPOverlap, DPGradOverlap, DPParamOverlap float64
	// ZeRO3Efficiency is the fraction of the hierarchical collective
	// bandwidth ZeRO-3/FSDP's per-layer gathers reach, and ZeRO3Overlap
	// how much of the step's compute they can hide behind.
	ZeRO3Efficiency, ZeRO3Overlap float64
	// ZeRO3Latency is the time each step of the group's rings adds to one
	// block's gathers and scatter per micro-batch: ZeRO-3 issues them per
	// layer and per parameter, so a larger group pays more.
	ZeRO3Latency time.Duration
	// ZeRO3LiveParams caps the parameters ZeRO-3 holds gathered at once
	// (DeepSpeed's stage3_max_live_parameters, 1e9 by default); 0: a
	// whole block and the prefetched next (FSDP's per-block wrapping).
	ZeRO3LiveParams float64
	// ReservedBytes is per-GPU memory the model cannot use: CUDA context,
	// cuBLAS workspace, NCCL buffers.
	ReservedBytes int64
	// FragmentationPercent of the GPU's memory is kept free for the
	// caching allocator's fragmentation.
	FragmentationPercent float64
	// ParamBytes, GradBytes and OptimizerBytes are bytes per parameter:
	// mixed-precision Adam keeps 2 (bf16 weights) + 2 (bf16 gradients) +
	// 12 (fp32 master weights, momentum, variance) — the ZeRO paper's 16.
	ParamBytes, GradBytes, OptimizerBytes float64
	// CheckpointBytesPerParam is what a checkpoint stores per parameter
	// (bf16 weights plus fp32 optimizer state: 14).
	CheckpointBytesPerParam float64
	// CheckpointWriteBytesPerSec and CheckpointReadBytesPerSec are the
	// storage system's aggregate bandwidth; CheckpointNodeBytesPerSec caps
	// what one node writes or reads (0: no cap), so a plan whose state sits
	// on fewer nodes checkpoints slower.
	CheckpointWriteBytesPerSec, CheckpointReadBytesPerSec, CheckpointNodeBytesPerSec float64
	// CheckpointInterval is the time between checkpoints; 0 uses the
	// Young–Daly interval √(2·C·MTBF) when an MTBF is known.
	CheckpointInterval time.Duration
	// StartupWait is the fixed part of a (re)start: scheduling, container
	// start, NCCL initialisation.
	StartupWait time.Duration
	// DetectWait is the time from a failure to the restart starting.
	DetectWait time.Duration
	// MTBF is the mean time between interruptions of the job; 0 means
	// unknown (no goodput prediction). MTBFReferenceGPUs, when set, is the
	// job size MTBF was measured at: the rate scales with the GPUs a plan
	// uses.
	MTBF              time.Duration
	MTBFReferenceGPUs int
}

// DefaultTunables are starting figures for a Megatron-LM-style run on an
// InfiniBand cluster with a parallel file system; calibrate them. The
// overlaps and gradient width are DefaultStack's; the ZeRO-3 figures are
// fitted to DeepSpeed ZeRO-3 on A100 (see docs/costmodel.md).
func DefaultTunables() Tunables {
	t := Tunables{
		Efficiency:                 1,
		StackComputeScale:          1,
		CommScale:                  1,
		ZeRO3Efficiency:            fittedZeRO3Efficiency,
		ZeRO3Overlap:               fittedZeRO3Overlap,
		ZeRO3Latency:               time.Duration(fittedZeRO3Latency * float64(time.Second)),
		ZeRO3LiveParams:            1e9,
		ReservedBytes:              2 * gib,
		FragmentationPercent:       5,
		ParamBytes:                 2,
		OptimizerBytes:             12,
		CheckpointBytesPerParam:    14,
		CheckpointWriteBytesPerSec: 100 * gb,
		CheckpointReadBytesPerSec:  200 * gb,
		CheckpointNodeBytesPerSec:  5 * gb,
		StartupWait:                2 * time.Minute,
		DetectWait:                 30 * time.Second,
	}
	if err := t.ApplyStack(DefaultStack); err != nil {
		panic(err) // DefaultStack is one of stacks
	}
	return t
}

// tunableField is one settable tunable: its name (the JSON name too), the
// unit a value is given in, and accessors.
type tunableField struct {
	name, unit, doc string
	get             func(t *Tunables) any
	set             func(t *Tunables, v string) error
}

var tunableFields = []tunableField{
	{"compute_scale", "× fitted kernel speed", "scale on the fitted GEMM, attention and element-wise throughput; --measured-step moves it",
		func(t *Tunables) any { return t.Efficiency }, floatSetter(func(t *Tunables) *float64 { return &t.Efficiency })},
	{"stack_compute_scale", "× fitted kernel speed", "the training stack's scale on the fitted kernel throughput, its software generation; set by the stack",
		func(t *Tunables) any { return t.StackComputeScale }, floatSetter(func(t *Tunables) *float64 { return &t.StackComputeScale })},
	{"comm_scale", "× modelled comm time", "scale on every communication time; --measured-step moves it when kernels alone cannot explain a fast step",
		func(t *Tunables) any { return t.CommScale }, floatSetter(func(t *Tunables) *float64 { return &t.CommScale })},
	{"tp_overlap", "fraction", "tensor-parallel communication hidden behind GEMMs",
		func(t *Tunables) any { return t.TPOverlap }, fractionSetter(func(t *Tunables) *float64 { return &t.TPOverlap })},
	{"cp_overlap", "fraction", "ring-attention key/value exchange hidden behind attention",
		func(t *Tunables) any { return t.CPOverlap }, fractionSetter(func(t *Tunables) *float64 { return &t.CPOverlap })},
	{"pp_overlap", "fraction", "pipeline send/receive hidden behind compute",
		func(t *Tunables) any { return t.PPOverlap }, fractionSetter(func(t *Tunables) *float64 { return &t.PPOverlap })},
	{"dp_grad_overlap", "fraction", "data-parallel gradient reduction (all-reduce, or reduce-scatter under ZeRO) hidden behind the last backward pass",
		func(t *Tunables) any { return t.DPGradOverlap }, fractionSetter(func(t *Tunables) *float64 { return &t.DPGradOverlap })},
	{"dp_param_overlap", "fraction", "ZeRO 1–2 parameter all-gather hidden behind the first forward pass",
		func(t *Tunables) any { return t.DPParamOverlap }, fractionSetter(func(t *Tunables) *float64 { return &t.DPParamOverlap })},
	{"zero3_efficiency", "fraction", "share of the hierarchical collective bandwidth ZeRO-3/FSDP parameter gathers reach",
		func(t *Tunables) any { return t.ZeRO3Efficiency }, fractionSetter(func(t *Tunables) *float64 { return &t.ZeRO3Efficiency })},
	{"zero3_overlap", "fraction", "share of the step's compute ZeRO-3/FSDP communication hides behind",
		func(t *Tunables) any { return t.ZeRO3Overlap }, fractionSetter(func(t *Tunables) *float64 { return &t.ZeRO3Overlap })},
	{"zero3_latency_seconds", "seconds per block per ring step", "latency each step of the ZeRO-3 rings adds to one block's gathers and scatter",
		func(t *Tunables) any { return t.ZeRO3Latency.Seconds() }, durationSetter(func(t *Tunables) *time.Duration { return &t.ZeRO3Latency })},
	{"zero3_live_params", "parameters", "most parameters ZeRO-3 keeps gathered at once (DeepSpeed's stage3_max_live_parameters; 0: a block and the next)",
		func(t *Tunables) any { return t.ZeRO3LiveParams }, floatSetter(func(t *Tunables) *float64 { return &t.ZeRO3LiveParams })},
	{"reserved_bytes", "bytes, e.g. 2GiB", "per-GPU memory for the CUDA context, workspaces and NCCL buffers",
		func(t *Tunables) any { return t.ReservedBytes }, func(t *Tunables, v string) error { return setBytes(&t.ReservedBytes, v) }},
	{"fragmentation_percent", "percent of GPU memory", "kept free for allocator fragmentation",
		func(t *Tunables) any { return t.FragmentationPercent }, func(t *Tunables, v string) error {
			f, err := strconv.ParseFloat(v, 64)
			if err != nil || f < 0 || f >= 100 {
				return fmt.Errorf("%q is not a percentage below 100", v)
			}
			t.FragmentationPercent = f
			return nil
		}},
	{"weight_bytes_per_param", "bytes", "weights kept per parameter (bf16: 2)",
		func(t *Tunables) any { return t.ParamBytes }, floatSetter(func(t *Tunables) *float64 { return &t.ParamBytes })},
	{"grad_bytes_per_param", "bytes", "gradients kept and reduced per parameter (bf16: 2, fp32: 4)",
		func(t *Tunables) any { return t.GradBytes }, floatSetter(func(t *Tunables) *float64 { return &t.GradBytes })},
	{"optimizer_bytes_per_param", "bytes", "optimizer state per parameter (fp32 master, momentum, variance: 12)",
		func(t *Tunables) any { return t.OptimizerBytes }, floatSetter(func(t *Tunables) *float64 { return &t.OptimizerBytes })},
	{"checkpoint_bytes_per_param", "bytes", "checkpoint size per parameter (bf16 weights + fp32 optimizer: 14)",
		func(t *Tunables) any { return t.CheckpointBytesPerParam }, floatSetter(func(t *Tunables) *float64 { return &t.CheckpointBytesPerParam })},
	{"checkpoint_write_bytes_per_second", "bytes/s, e.g. 100GB/s", "storage write bandwidth for the whole job",
		func(t *Tunables) any { return t.CheckpointWriteBytesPerSec }, rateSetter(func(t *Tunables) *float64 { return &t.CheckpointWriteBytesPerSec })},
	{"checkpoint_read_bytes_per_second", "bytes/s, e.g. 200GB/s", "storage read bandwidth for the whole job",
		func(t *Tunables) any { return t.CheckpointReadBytesPerSec }, rateSetter(func(t *Tunables) *float64 { return &t.CheckpointReadBytesPerSec })},
	{"checkpoint_node_bytes_per_second", "bytes/s, e.g. 5GB/s", "what one node writes or reads at most (0: no cap)",
		func(t *Tunables) any { return t.CheckpointNodeBytesPerSec }, rateSetter(func(t *Tunables) *float64 { return &t.CheckpointNodeBytesPerSec })},
	{"checkpoint_interval_seconds", "seconds or a duration, e.g. 30m", "time between checkpoints (0: Young–Daly with an MTBF)",
		func(t *Tunables) any { return t.CheckpointInterval.Seconds() }, durationSetter(func(t *Tunables) *time.Duration { return &t.CheckpointInterval })},
	{"startup_seconds", "seconds or a duration", "fixed part of a (re)start: scheduling, containers, NCCL init",
		func(t *Tunables) any { return t.StartupWait.Seconds() }, durationSetter(func(t *Tunables) *time.Duration { return &t.StartupWait })},
	{"detect_seconds", "seconds or a duration", "from a failure to the restart starting",
		func(t *Tunables) any { return t.DetectWait.Seconds() }, durationSetter(func(t *Tunables) *time.Duration { return &t.DetectWait })},
	{"mtbf_seconds", "seconds or a duration, e.g. 3h", "mean time between job interruptions (0: unknown)",
		func(t *Tunables) any { return t.MTBF.Seconds() }, durationSetter(func(t *Tunables) *time.Duration { return &t.MTBF })},
	{"mtbf_reference_gpus", "GPUs", "job size the MTBF was measured at (0: the plan's own size)",
		func(t *Tunables) any { return t.MTBFReferenceGPUs }, func(t *Tunables, v string) error {
			n, err := strconv.Atoi(v)
			if err != nil || n < 0 {
				return fmt.Errorf("%q is not a non-negative whole number", v)
			}
			t.MTBFReferenceGPUs = n
			return nil
		}},
}

// tunableAliases are the older key spellings Set still accepts, in the
// units they were given in.
var tunableAliases = map[string]func(t *Tunables, v string) error{
	"efficiency":            floatSetter(func(t *Tunables) *float64 { return &t.Efficiency }),
	"reserved_gib":          func(t *Tunables, v string) error { return setBytes(&t.ReservedBytes, v+"GiB") },
	"param_bytes":           floatSetter(func(t *Tunables) *float64 { return &t.ParamBytes }),
	"grad_bytes":            floatSetter(func(t *Tunables) *float64 { return &t.GradBytes }),
	"optimizer_bytes":       floatSetter(func(t *Tunables) *float64 { return &t.OptimizerBytes }),
	"checkpoint_write_gbps": func(t *Tunables, v string) error { return setRateIn(&t.CheckpointWriteBytesPerSec, v, gb) },
	"checkpoint_read_gbps":  func(t *Tunables, v string) error { return setRateIn(&t.CheckpointReadBytesPerSec, v, gb) },
	"checkpoint_interval":   durationSetter(func(t *Tunables) *time.Duration { return &t.CheckpointInterval }),
	"startup_wait":          durationSetter(func(t *Tunables) *time.Duration { return &t.StartupWait }),
	"mtbf":                  durationSetter(func(t *Tunables) *time.Duration { return &t.MTBF }),
	// dp_overlap set both data-parallel overlaps before they were two terms.
	"dp_overlap": func(t *Tunables, v string) error {
		if err := fractionSetter(func(t *Tunables) *float64 { return &t.DPGradOverlap })(t, v); err != nil {
			return err
		}
		t.DPParamOverlap = t.DPGradOverlap
		return nil
	},
}

// TunableFields lists the keys Tunables.Set accepts, with their units.
var TunableFields = func() []string {
	out := make([]string, len(tunableFields))
	for i, f := range tunableFields {
		out[i] = f.name + " (" + f.unit + ")"
	}
	return out
}()

// TunableNames lists the tunables by name, in the order -o json shows them.
func TunableNames() []string {
	out := make([]string, len(tunableFields))
	for i, f := range tunableFields {
		out[i] = f.name
	}
	return out
}

// TunableDoc returns the unit and one-line meaning of a tunable.
func TunableDoc(name string) (unit, doc string, ok bool) {
	for _, f := range tunableFields {
		if f.name == name {
			return f.unit, f.doc, true
		}
	}
	return "", "", false
}

// Set overrides one tunable by key (see TunableFields). Durations take Go
// syntax (30m, 3h) or seconds; byte counts and rates take units (2GiB,
// 100GB/s). The older keys efficiency, reserved_gib, param_bytes,
// grad_bytes, optimizer_bytes, checkpoint_write_gbps, checkpoint_read_gbps,
// checkpoint_interval, startup_wait, mtbf and dp_overlap (both data-parallel
// overlaps) are accepted too.
func (t *Tunables) Set(key, value string) error {
	value = strings.TrimSpace(value)
	for _, f := range tunableFields {
		if f.name == key {
			if err := f.set(t, value); err != nil {
				return fmt.Errorf("tunable %s: %w", key, err)
			}
			return nil
		}
	}
	if set, ok := tunableAliases[key]; ok {
		if err := set(t, value); err != nil {
			return fmt.Errorf("tunable %s: %w", key, err)
		}
		return nil
	}
	return fmt.Errorf("unknown tunable %q: use one of %s", key, strings.Join(TunableFields, ", "))
}

// computeScale is the whole scale on the fitted kernel throughput: the
// stack's generation times the calibrated compute_scale.
func (t Tunables) computeScale() float64 { return t.Efficiency * t.StackComputeScale }

// MarshalJSON writes every tunable under its name, durations in seconds.
func (t Tunables) MarshalJSON() ([]byte, error) {
	var b strings.Builder
	b.WriteByte('{')
	for i, f := range tunableFields {
		v, err := json.Marshal(f.get(&t))
		if err != nil {
			return nil, err
		}
		if i > 0 {
			b.WriteByte(',')
		}
		fmt.Fprintf(&b, "%q:%s", f.name, v)
	}
	b.WriteByte('}')
	return []byte(b.String()), nil
}

// UnmarshalJSON reads what MarshalJSON writes; absent tunables keep their
// value, unknown ones are an error.
func (t *Tunables) UnmarshalJSON(data []byte) error {
	var raw map[string]json.RawMessage
	if err := json.Unmarshal(data, &raw); err != nil {
		return fmt.Errorf("tunables: %w", err)
	}
	for k, v := range raw {
		s := strings.Trim(string(v), `"`)
		if err := t.Set(k, s); err != nil {
			return err
		}
	}
	return nil
}

// Validate reports the first impossible value in t.
func (t Tunables) Validate() error {
	frac := func(x float64) bool { return x >= 0 && x <= 1 }
	switch {
	case t.Efficiency <= 0:
		return fmt.Errorf("compute_scale must be positive, got %g", t.Efficiency)
	case t.StackComputeScale <= 0:
		return fmt.Errorf("stack_compute_scale must be positive, got %g", t.StackComputeScale)
	case t.CommScale < 0:
		return fmt.Errorf("comm_scale must not be negative, got %g", t.CommScale)
	case !frac(t.TPOverlap) || !frac(t.CPOverlap) || !frac(t.PPOverlap) || !frac(t.DPGradOverlap) || !frac(t.DPParamOverlap) || !frac(t.ZeRO3Overlap):
		return fmt.Errorf("overlaps must be in [0, 1]")
	case t.ZeRO3Efficiency <= 0 || t.ZeRO3Efficiency > 1:
		return fmt.Errorf("zero3_efficiency must be in (0, 1], got %g", t.ZeRO3Efficiency)
	case t.ReservedBytes < 0:
		return fmt.Errorf("reserved bytes must not be negative")
	case t.ZeRO3LiveParams < 0:
		return fmt.Errorf("zero3_live_params must not be negative, got %g", t.ZeRO3LiveParams)
	case t.FragmentationPercent < 0 || t.FragmentationPercent >= 100:
		return fmt.Errorf("fragmentation_percent must be in [0, 100), got %g", t.FragmentationPercent)
	case t.ParamBytes <= 0 || t.GradBytes < 0 || t.OptimizerBytes < 0:
		return fmt.Errorf("bytes per parameter must be positive (weights) and non-negative (gradients, optimizer)")
	case t.CheckpointBytesPerParam < 0 || t.CheckpointWriteBytesPerSec < 0 || t.CheckpointReadBytesPerSec < 0 || t.CheckpointNodeBytesPerSec < 0:
		return fmt.Errorf("checkpoint sizes and bandwidths must not be negative")
	case t.ZeRO3Latency < 0 || t.CheckpointInterval < 0 || t.StartupWait < 0 || t.DetectWait < 0 || t.MTBF < 0 || t.MTBFReferenceGPUs < 0:
		return fmt.Errorf("checkpoint interval, startup, detection, MTBF and its reference size must not be negative")
	}
	return nil
}
