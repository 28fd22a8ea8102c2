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
	// Source names the measurements the values were fitted to, or the
	// profile they are carried over from.
	Source string
}

func (k KernelFit) apply(h *Hardware) {
	h.GEMMEfficiency, h.GEMMHalfDim = k.GEMMEfficiency, k.GEMMHalfDim
	h.FlashAttentionEfficiency, h.ElementwiseEfficiency = k.FlashAttentionEfficiency, k.ElementwiseEfficiency
	h.NVLinkEfficiency, h.NetEfficiency = k.NVLinkEfficiency, k.NetEfficiency
	h.BlockOverheadSec = k.BlockOverheadSec
	h.FitSource = k.Source
}

// Fit sources.
const (
	fitA100 = "fitted to the fit rows of testdata/validation.json on A100 (Narayanan et al. SC'21 Tables 1–2, Korthikanti et al. 2022)"
	fitH100 = "fitted to the fit rows of testdata/validation.json on H100 (Megatron-LM README H100 weak-scaling table)"
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

// The fitted values. NVLink and network efficiency are fitted once for
// both GPUs (the same NCCL on the same kind of links); A100 has no flash
// attention run in the validation set, so its figure is the low end of
// the forward efficiency FlashAttention-2 reports on A100 (Dao 2023:
// 50–73% of peak), not a fit.
var (
	a100Fit = KernelFit{
		GEMMEfficiency: 0.7487, GEMMHalfDim: 36.5,
		FlashAttentionEfficiency: 0.5,
		ElementwiseEfficiency:    0.6358,
		NVLinkEfficiency:         1, NetEfficiency: 0.9387,
		BlockOverheadSec: 3.365e-4,
		Source:           fitA100,
	}
	h100Fit = KernelFit{
		GEMMEfficiency: 0.5492, GEMMHalfDim: 87.07,
		FlashAttentionEfficiency: 0.3546,
		ElementwiseEfficiency:    0.6358,
		NVLinkEfficiency:         1, NetEfficiency: 0.9387,
		BlockOverheadSec: 1.236e-8,
		Source:           fitH100,
	}
	// Fitted defaults of Tunables: the ZeRO-3 terms, from DeepSpeed
	// ZeRO-3 on A100.
	fittedZeRO3Efficiency = 0.1694
	fittedZeRO3Overlap    = 0.2307
	fittedZeRO3Latency    = 1.552e-4
)

func withSource(k KernelFit, src string) KernelFit {
	k.Source = src
	return k
}
