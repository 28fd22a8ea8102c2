package costmodel

import (
	"fmt"
	"strings"
)

// Stack is a training software stack as the cost model sees it: which
// communication it overlaps with compute, at what width it keeps and
// reduces gradients, and how fast its kernels run against the fitted ones.
// Each overlap is a tunable of its own (tp_overlap, cp_overlap,
// pp_overlap, dp_grad_overlap, dp_param_overlap): the fraction of that
// communication the stack can hide; stack_compute_scale is its software
// generation (1 but for a stack whose published runs show faster kernels).
// A stack sets exactly these tunables; `--set` still overrides any of
// them, and everything else (kernel fits, memory reserves, storage) is the
// same for every stack.
// Recomputation, sequence parallelism and the attention kernel stay the
// job's own choices (Training): a stack's Typical says what its users
// usually pick.
type Stack struct {
	Name string
	// Doc says what the stack is and where its settings come from.
	Doc string
	// Typical is what runs on this stack usually choose for the settings
	// the stack does not fix.
	Typical string
	// TPOverlap, CPOverlap, PPOverlap, DPGradOverlap and DPParamOverlap
	// are the tunables of the same names.
	TPOverlap, CPOverlap, PPOverlap, DPGradOverlap, DPParamOverlap float64
	// GradBytes is grad_bytes_per_param: 2 for bf16/fp16 gradients, 4 for
	// fp32 accumulation and reduction.
	GradBytes float64
	// computeScale points at stack_compute_scale's value for this stack
	// (nil is 1, the fitted kernels): the software's generation, fitted
	// like the kernels, so it lives with the fits.
	computeScale *float64
}

// ComputeScale is the stack_compute_scale the stack sets: how much faster its
// kernels run than the fitted ones (1 for most stacks).
func (s Stack) ComputeScale() float64 {
	if s.computeScale == nil {
		return 1
	}
	return *s.computeScale
}

// DefaultStack is the stack of a job or question that names none:
// Megatron-Core as its flags default, with the gradient reduction and
// parameter gather overlapped (the two flags every published recipe
// sets) and without the opt-in TP communication overlap.
const DefaultStack = "megatron-core"

// megatronCore2024 is the 2024 performance recipes' overlaps, which
// nemo-2024 shares.
var megatronCore2024 = Stack{
	Name: "megatron-core-2024",
	Doc: "NeMo / Megatron-Core performance recipes (2024): --tp-comm-overlap (tensor-parallel all-gathers and reduce-scatters " +
		"split and pipelined with the GEMMs), overlapped pipeline sends and receives in the interleaved schedule, " +
		"overlapped gradient reduce-scatter and parameter all-gather under the distributed optimizer, fp32 gradient accumulation and reduction",
	Typical:        "bf16 or fp8, flash attention, no recomputation, interleaved 1F1B, distributed optimizer (ZeRO 1), sequence parallelism",
	TPOverlap:      1,
	CPOverlap:      1,
	PPOverlap:      1,
	DPGradOverlap:  1,
	DPParamOverlap: 1,
	GradBytes:      4,
}

// laterGeneration is s's overlaps and gradient width under another name,
// on kernels as fast as *scale says.
func (s Stack) laterGeneration(name, doc, typical string, scale *float64) Stack {
	s.Name, s.Doc, s.Typical, s.computeScale = name, doc, typical, scale
	return s
}

// stacks are the named profiles; DefaultStack is among them.
var stacks = []Stack{
	{
		Name: "megatron-2021",
		Doc: "Megatron-LM as of Narayanan et al. (SC'21) and Korthikanti et al. (2022): no tensor-parallel communication overlap, " +
			"synchronous pipeline sends and receives, Megatron's local DDP all-reducing the gradients after the backward pass",
		Typical:   "full (2021) or selective (2022) recomputation, fp16, unfused attention, plain or interleaved 1F1B, ZeRO 0",
		GradBytes: 2,
	},
	{
		Name: "megatron-core",
		Doc: "Megatron-Core with its defaults plus --overlap-grad-reduce and --overlap-param-gather: gradient reduce-scatter " +
			"behind the last backward pass, parameter all-gather behind the first forward, ring attention behind attention; " +
			"no --tp-comm-overlap (opt-in: TransformerEngine userbuffers), synchronous pipeline sends and receives, bf16 gradients",
		Typical:        "bf16, flash attention, selective or no recomputation, distributed optimizer (ZeRO 1), sequence parallelism",
		CPOverlap:      1,
		DPGradOverlap:  1,
		DPParamOverlap: 1,
		GradBytes:      2,
	},
	megatronCore2024,
	megatronCore2024.laterGeneration("nemo-2024",
		"NVIDIA's NeMo performance recipes of late 2024 (NeMo 24.09 and later, DGX Cloud Benchmarking): the overlaps of "+
			"megatron-core-2024, on kernels of a later generation (Transformer Engine, cuDNN attention) that run the same shapes "+
			"faster: stack_compute_scale, fitted to NeMo's published runs (the DGX Cloud Benchmarking recipes, NeMo's performance summary)",
		"bf16 or fp8, flash attention, no recomputation, interleaved 1F1B, distributed optimizer (ZeRO 1), sequence parallelism, context parallelism from 8K tokens",
		&fittedNeMo2024ComputeScale),
	{
		Name: "llama3-2024",
		Doc: "Meta's Llama 3 training stack as Dubey et al. 2024 (§3.3.2) describe it: FSDP sharding gradients and optimizer state " +
			"with the reduction and gather overlapped, asynchronous pipeline point-to-point communication; no tensor-parallel " +
			"communication overlap is reported, so none is assumed",
		Typical:        "bf16, flash attention, interleaved 1F1B with uneven first and last stages, ZeRO 2, sequence parallelism",
		CPOverlap:      1,
		PPOverlap:      1,
		DPGradOverlap:  1,
		DPParamOverlap: 1,
		GradBytes:      2,
	},
	{
		Name: "deepspeed-zero",
		Doc: "DeepSpeed ZeRO as Narayanan et al. (SC'21, Table 2) ran it: ZeRO-3 per-layer gathers overlapped by zero3_overlap " +
			"(fitted), no tensor-parallel or pipeline overlap, the stage 0–2 gradient reduction after the backward pass",
		Typical:   "fp16, full recomputation, ZeRO 3, no tensor or pipeline parallelism",
		GradBytes: 2,
	},
}

// StackNames lists the named stacks.
func StackNames() []string {
	out := make([]string, len(stacks))
	for i, s := range stacks {
		out[i] = s.Name
	}
	return out
}

// Stacks returns the named stacks, in the order StackNames lists them.
func Stacks() []Stack { return append([]Stack(nil), stacks...) }

// LookupStack returns the stack of a name; "" is DefaultStack.
func LookupStack(name string) (Stack, error) {
	if name == "" {
		name = DefaultStack
	}
	for _, s := range stacks {
		if s.Name == name {
			return s, nil
		}
	}
	return Stack{}, fmt.Errorf("unknown training stack %q: use one of %s", name, strings.Join(StackNames(), ", "))
}

// Apply sets the tunables s fixes, and only those.
func (s Stack) Apply(t *Tunables) {
	t.TPOverlap, t.CPOverlap, t.PPOverlap = s.TPOverlap, s.CPOverlap, s.PPOverlap
	t.DPGradOverlap, t.DPParamOverlap = s.DPGradOverlap, s.DPParamOverlap
	t.GradBytes = s.GradBytes
	t.StackComputeScale = s.ComputeScale()
}

// ApplyStack sets the tunables the named stack fixes ("" is DefaultStack).
func (t *Tunables) ApplyStack(name string) error {
	s, err := LookupStack(name)
	if err != nil {
		return err
	}
	s.Apply(t)
	return nil
}

// Overlap is one overlap term of an evaluation: a kind of communication,
// the fraction of it the stack hides (its tunable), and what is left.
type Overlap struct {
	// Term is the tunable that sets it.
	Term string `json:"term"`
	// Hidden is the tunable's value: the fraction that can hide.
	Hidden float64 `json:"hidden"`
	// CommSec is the communication's time on its link over the step, and
	// ExposedSec what compute does not hide.
	CommSec    float64 `json:"comm_seconds"`
	ExposedSec float64 `json:"exposed_seconds"`
	// ExposedFraction is ExposedSec over CommSec (0 with no communication).
	ExposedFraction float64 `json:"exposed_fraction"`
}

// overlaps lists ev's overlap terms, one per overlap tunable.
func (t Tunables) overlaps(ev *Evaluation) []Overlap {
	terms := []Overlap{
		{Term: "tp_overlap", Hidden: t.TPOverlap, CommSec: ev.TPCommSec, ExposedSec: ev.TPExposedSec},
		{Term: "cp_overlap", Hidden: t.CPOverlap, CommSec: ev.CPCommSec, ExposedSec: ev.CPExposedSec},
		{Term: "pp_overlap", Hidden: t.PPOverlap, CommSec: ev.PPCommSec, ExposedSec: ev.PPExposedSec},
		{Term: "dp_grad_overlap", Hidden: t.DPGradOverlap, CommSec: ev.DPGradCommSec, ExposedSec: ev.DPGradExposedSec},
		{Term: "dp_param_overlap", Hidden: t.DPParamOverlap, CommSec: ev.DPParamCommSec, ExposedSec: ev.DPParamExposedSec},
		{Term: "zero3_overlap", Hidden: t.ZeRO3Overlap, CommSec: ev.ZeRO3CommSec, ExposedSec: ev.ZeRO3ExposedSec},
	}
	for i := range terms {
		if terms[i].CommSec > 0 {
			terms[i].ExposedFraction = terms[i].ExposedSec / terms[i].CommSec
		}
	}
	return terms
}
