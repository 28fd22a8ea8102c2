package costmodel

// KernelFit is the part of a GPU profile fitted to published training
// throughput rather than read from a datasheet: how close to peak its
// matrix multiplies, attention and element-wise kernels run, and how much
// of its links NCCL reaches. docs/costmodel.md holds the same table, and
// TestKernelFitsAreFitted checks every value is where the fit puts it.
type KernelFit struct {
	GEMMEfficiency, GEMMHalfDim     float64
	FlashAttentionEfficiency        float64
	ElementwiseEfficiency           float64
	NVLinkEfficiency, NetEfficiency float64
	BlockOverheadSec                float64
	StepOverheadSec                 float64
	// Source names the measurements the values were fitted to, or the
	// profile they are carried over from.
	Source string
}

func (k KernelFit) apply(h *Hardware) {
	h.GEMMEfficiency, h.GEMMHalfDim = k.GEMMEfficiency, k.GEMMHalfDim
	h.FP8GEMMEfficiency = 0
	if h.PeakFP8TFLOPS > 0 {
		h.FP8GEMMEfficiency = k.GEMMEfficiency * fp8GEMMRatio
	}
	h.FlashAttentionEfficiency, h.ElementwiseEfficiency = k.FlashAttentionEfficiency, k.ElementwiseEfficiency
	h.NVLinkEfficiency, h.NetEfficiency = k.NVLinkEfficiency, k.NetEfficiency
	h.BlockOverheadSec = k.BlockOverheadSec
	h.StepOverheadSec = k.StepOverheadSec
	h.FitSource = k.Source
}

// fp8GEMMRatio is the fraction of its FP8 peak a GEMM reaches over the
// fraction of its bf16 peak: not fitted (only one source in the
// validation set runs FP8), but FlashAttention-3's ratio on H100 (Shah et
// al. 2024: bf16 up to 740 TFLOP/s, 75% of peak; FP8 close to 1.2
// PFLOP/s, 61% of 1,979), the same tensor cores fed by the same kind of
// kernel.
const fp8GEMMRatio = (1200.0 / 1979) / (740.0 / 989)

// Fit sources.
const (
	fitA100 = "fitted to the fit rows of testdata/validation.json on A100 (Narayanan et al. SC'21 Tables 1–2, Korthikanti et al. 2022)"
	fitH100 = "fitted to the fit rows of testdata/validation.json on H100 (Megatron-LM README H100 weak-scaling table, NVIDIA DGX Cloud Benchmarking recipes, NeMo's performance summary)"
)

// fitFor returns the fitted parameters of a profile. A100 80 GB and H100
// are fitted (see docs/costmodel.md, "Fitted parameters"); the others have
// no published run in the validation set and carry over the fit of the
// same die (A100 40 GB, H200) or of the nearest generation (B200), which
// their Source says.
func fitFor(profile string) KernelFit {
	switch profile {
	case "a100-80gb":
		return a100Fit
	case "a100-40gb":
		return withSource(a100Fit, "carried over from a100-80gb (same die; no published run in the validation set)")
	case "h100":
		return h100Fit
	case "h200":
		return withSource(h100Fit, "carried over from h100 (same GH100 die; no published run in the validation set)")
	default:
		return withSource(h100Fit, "carried over from h100 (no published run of this GPU in the validation set): calibrate with --measured-step")
	}
}

// The fitted values. NVLink and network efficiency and the per-step
// overhead are fitted once for both GPUs (the same NCCL on the same kind
// of links, the same framework's step); the rest per GPU. Flash attention
// is not fitted: A100 has no flash attention run in the validation set,
// so its figure is the low end of the forward efficiency FlashAttention-2
// reports on A100 (Dao 2023: 50–73% of peak); H100's is the low end of
// FlashAttention-3 (Shah et al. 2024: 1.5–2× FlashAttention-2, which
// reaches 35% of H100's peak). Attention is a few percent of the H100
// rows' steps, too little to fit it without it taking up what other
// terms leave.
var (
	a100Fit = KernelFit{
		GEMMEfficiency: 0.7336, GEMMHalfDim: 53.7,
		FlashAttentionEfficiency: 0.5,
		ElementwiseEfficiency:    0.6787,
		NVLinkEfficiency:         0.9038, NetEfficiency: 0.944,
		BlockOverheadSec: 1.322e-05,
		StepOverheadSec:  0.02154,
		Source:           fitA100,
	}
	h100Fit = KernelFit{
		GEMMEfficiency: 0.5361, GEMMHalfDim: 75.05,
		FlashAttentionEfficiency: 0.52,
		ElementwiseEfficiency:    0.764,
		NVLinkEfficiency:         0.9038, NetEfficiency: 0.944,
		BlockOverheadSec: 2.219e-05,
		StepOverheadSec:  0.02154,
		Source:           fitH100,
	}
	// Fitted defaults of Tunables: the ZeRO-3 terms, from DeepSpeed
	// ZeRO-3 on A100.
	fittedZeRO3Efficiency = 0.1663
	fittedZeRO3Overlap    = 0.2566
	fittedZeRO3Latency    = 0.0001534
	// The nemo-2024 stack's stack_compute_scale: NeMo's published runs'
	// kernels against the fit's.
	fittedNeMo2024ComputeScale = 1.11
)

func withSource(k KernelFit, src string) KernelFit {
	k.Source = src
	return k
}
