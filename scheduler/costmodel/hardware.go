package costmodel

import (
	"fmt"
	"math"
	"sort"
	"strconv"
	"strings"
	"time"
)

const (
	gib = 1 << 30
	gb  = 1e9
)

// Hardware is one GPU model as it sits in a node: its peak dense throughput,
// memory, the links the cost model charges communication to, and the
// kernel-efficiency parameters fitted for it (see fits.go).
type Hardware struct {
	// Name is the profile name (h100, a100-80gb, …).
	Name string `json:"name"`
	// PeakTFLOPS is the dense (no sparsity) BF16/FP16 tensor-core peak.
	PeakTFLOPS float64 `json:"peak_tflops"`
	// PeakFP8TFLOPS is the dense FP8 peak; 0 where the GPU has no FP8.
	PeakFP8TFLOPS float64 `json:"peak_fp8_tflops,omitempty"`
	// HBMBytes is the device memory.
	HBMBytes int64 `json:"hbm_bytes"`
	// HBMBytesPerSec is the device memory bandwidth; element-wise kernels
	// and the optimizer step are bound by it.
	HBMBytesPerSec float64 `json:"hbm_bytes_per_second"`
	// NVLinkBytesPerSec is one GPU's NVLink bandwidth in one direction
	// (datasheets quote both directions added: 900 GB/s means 450 here).
	NVLinkBytesPerSec float64 `json:"nvlink_bytes_per_second"`
	// NetBytesPerSec is one GPU's NIC, one direction (a 400 Gb/s NIC per
	// GPU is 50e9). Collectives across nodes run over every GPU's NIC of
	// the node at once.
	NetBytesPerSec float64 `json:"net_bytes_per_second"`
	// GPUsPerNode is the size of one NVLink domain.
	GPUsPerNode int `json:"gpus_per_node"`

	// GEMMEfficiency is the fraction of peak a matrix multiply reaches when
	// all three of its dimensions are large.
	GEMMEfficiency float64 `json:"gemm_max_efficiency"`
	// FP8GEMMEfficiency is the same for FP8 GEMMs, a fraction of the FP8
	// peak (0 where the GPU has no FP8): the tensor cores' rate doubles, the
	// fraction of it a GEMM reaches need not stay.
	FP8GEMMEfficiency float64 `json:"fp8_gemm_max_efficiency,omitempty"`
	// GEMMHalfDim is the dimension at which one side of a GEMM costs half
	// its efficiency: a GEMM of M×K by K×N runs at
	// GEMMEfficiency · Πx∈{M,N,K} x/(x+GEMMHalfDim) of peak.
	GEMMHalfDim float64 `json:"gemm_half_dim"`
	// FlashAttentionEfficiency is the fraction of peak a fused (flash)
	// attention kernel reaches on the FLOPs it really does (causal half).
	FlashAttentionEfficiency float64 `json:"flash_attention_efficiency"`
	// ElementwiseEfficiency is the fraction of HBM bandwidth element-wise
	// kernels (norms, activations, residual adds, dropout, softmax, the
	// optimizer step) reach.
	ElementwiseEfficiency float64 `json:"elementwise_efficiency"`
	// NVLinkEfficiency and NetEfficiency are the fractions of link
	// bandwidth NCCL's collectives reach (bus bandwidth over link speed).
	NVLinkEfficiency float64 `json:"nvlink_efficiency"`
	NetEfficiency    float64 `json:"net_efficiency"`
	// BlockOverheadSec is fixed time per transformer block per pass
	// (forward; the backward counts as two): kernel launches, small
	// kernels and synchronisation the other terms leave out. It weighs on
	// small blocks and small micro-batches.
	BlockOverheadSec float64 `json:"block_overhead_seconds"`
	// StepOverheadSec is fixed time per optimizer step: zeroing the
	// gradient buffers, the gradient-norm and loss reductions, the host
	// synchronisations of a step. It weighs on short steps.
	StepOverheadSec float64 `json:"step_overhead_seconds"`
	// FitSource says where the kernel parameters come from.
	FitSource string `json:"fit_source,omitempty"`
}

// hardware profiles, from vendor datasheets (dense figures: datasheets list
// "with sparsity" numbers at twice these). The kernel parameters come from
// fitFor (fits.go).
var hardware = map[string]Hardware{
	// NVIDIA A100 datasheet: BF16 tensor 312 TFLOPS dense, 40 GB HBM2 at
	// 1,555 GB/s, NVLink 3 600 GB/s (300 each way). DGX A100: 8× 200 Gb/s
	// HDR InfiniBand for compute, one per GPU → 25 GB/s.
	"a100-40gb": {Name: "a100-40gb", PeakTFLOPS: 312, HBMBytes: 40 * gib, HBMBytesPerSec: 1555 * gb,
		NVLinkBytesPerSec: 300 * gb, NetBytesPerSec: 25 * gb, GPUsPerNode: 8},
	// Same die and links; 80 GB HBM2e at 2,039 GB/s.
	"a100-80gb": {Name: "a100-80gb", PeakTFLOPS: 312, HBMBytes: 80 * gib, HBMBytesPerSec: 2039 * gb,
		NVLinkBytesPerSec: 300 * gb, NetBytesPerSec: 25 * gb, GPUsPerNode: 8},
	// NVIDIA H100 SXM5 datasheet: BF16 1,979 TFLOPS with sparsity (989.4
	// dense), FP8 3,958 sparse (1,979 dense), 80 GB HBM3 at 3.35 TB/s,
	// NVLink 4 900 GB/s. DGX H100: 8× ConnectX-7 400 Gb/s NDR → 50 GB/s
	// per GPU.
	"h100": {Name: "h100", PeakTFLOPS: 989.4, PeakFP8TFLOPS: 1978.9, HBMBytes: 80 * gib, HBMBytesPerSec: 3350 * gb,
		NVLinkBytesPerSec: 450 * gb, NetBytesPerSec: 50 * gb, GPUsPerNode: 8},
	// NVIDIA H200 SXM datasheet: same GH100 compute as H100, 141 GB HBM3e
	// at 4.8 TB/s, NVLink 900 GB/s; DGX H200 keeps 8× 400 Gb/s.
	"h200": {Name: "h200", PeakTFLOPS: 989.4, PeakFP8TFLOPS: 1978.9, HBMBytes: 141 * gib, HBMBytesPerSec: 4800 * gb,
		NVLinkBytesPerSec: 450 * gb, NetBytesPerSec: 50 * gb, GPUsPerNode: 8},
	// NVIDIA HGX B200 (1,000 W): BF16 4.5 PFLOPS sparse / 2.25 dense, FP8
	// 4.5 dense, 180 GB HBM3e per GPU at 8 TB/s, NVLink 5 1.8 TB/s. DGX
	// B200: 8× ConnectX-7 400 Gb/s → 50 GB/s per GPU.
	"b200": {Name: "b200", PeakTFLOPS: 2250, PeakFP8TFLOPS: 4500, HBMBytes: 180 * gib, HBMBytesPerSec: 8000 * gb,
		NVLinkBytesPerSec: 900 * gb, NetBytesPerSec: 50 * gb, GPUsPerNode: 8},
}

// hardwareAliases maps common spellings to profile names.
var hardwareAliases = map[string]string{
	"a100": "a100-80gb", "a100-40": "a100-40gb", "a100-80": "a100-80gb", "a100-sxm4-40gb": "a100-40gb",
	"a100-sxm4-80gb": "a100-80gb", "h100-sxm": "h100", "h100-sxm5": "h100", "h100-80gb": "h100",
	"h200-sxm": "h200", "h200-141gb": "h200", "b200-sxm": "b200",
}

// HardwareNames lists the hardware profiles, sorted.
func HardwareNames() []string {
	names := make([]string, 0, len(hardware))
	for n := range hardware {
		names = append(names, n)
	}
	sort.Strings(names)
	return names
}

// LookupHardware returns the named profile with its fitted kernel
// parameters; names are case-insensitive and accept common aliases
// (a100-80, h100-sxm, …).
func LookupHardware(name string) (Hardware, error) {
	n := strings.ToLower(strings.TrimSpace(name))
	if a, ok := hardwareAliases[n]; ok {
		n = a
	}
	hw, ok := hardware[n]
	if !ok {
		return Hardware{}, fmt.Errorf("unknown gpu %q: use one of %s", name, strings.Join(HardwareNames(), ", "))
	}
	fitFor(n).apply(&hw)
	return hw, nil
}

// hardwareField is one settable field of Hardware.
type hardwareField struct {
	name, unit string
	set        func(h *Hardware, v string) error
}

var hardwareFields = []hardwareField{
	{"peak_tflops", "dense bf16 TFLOP/s", floatSetter(func(h *Hardware) *float64 { return &h.PeakTFLOPS })},
	{"peak_fp8_tflops", "dense fp8 TFLOP/s", floatSetter(func(h *Hardware) *float64 { return &h.PeakFP8TFLOPS })},
	{"hbm_bytes", "bytes, e.g. 80GiB", func(h *Hardware, v string) error { return setBytes(&h.HBMBytes, v) }},
	{"hbm_bytes_per_second", "bytes/s, e.g. 3.35TB/s", rateSetter(func(h *Hardware) *float64 { return &h.HBMBytesPerSec })},
	{"nvlink_bytes_per_second", "bytes/s one way, e.g. 450GB/s", rateSetter(func(h *Hardware) *float64 { return &h.NVLinkBytesPerSec })},
	{"net_bytes_per_second", "bytes/s one way per GPU, e.g. 50GB/s", rateSetter(func(h *Hardware) *float64 { return &h.NetBytesPerSec })},
	{"gpus_per_node", "GPUs in one NVLink domain", func(h *Hardware, v string) error {
		n, err := strconv.Atoi(v)
		if err != nil || n <= 0 {
			return fmt.Errorf("%q is not a positive whole number", v)
		}
		h.GPUsPerNode = n
		return nil
	}},
	{"gemm_max_efficiency", "fraction of peak", fractionSetter(func(h *Hardware) *float64 { return &h.GEMMEfficiency })},
	{"fp8_gemm_max_efficiency", "fraction of fp8 peak", fractionSetter(func(h *Hardware) *float64 { return &h.FP8GEMMEfficiency })},
	{"gemm_half_dim", "elements", floatSetter(func(h *Hardware) *float64 { return &h.GEMMHalfDim })},
	{"flash_attention_efficiency", "fraction of peak", fractionSetter(func(h *Hardware) *float64 { return &h.FlashAttentionEfficiency })},
	{"elementwise_efficiency", "fraction of HBM bandwidth", fractionSetter(func(h *Hardware) *float64 { return &h.ElementwiseEfficiency })},
	{"nvlink_efficiency", "fraction of NVLink bandwidth", fractionSetter(func(h *Hardware) *float64 { return &h.NVLinkEfficiency })},
	{"net_efficiency", "fraction of NIC bandwidth", fractionSetter(func(h *Hardware) *float64 { return &h.NetEfficiency })},
	{"block_overhead_seconds", "seconds per block per pass", floatSetter(func(h *Hardware) *float64 { return &h.BlockOverheadSec })},
	{"step_overhead_seconds", "seconds per optimizer step", floatSetter(func(h *Hardware) *float64 { return &h.StepOverheadSec })},
}

// hardwareAliasKeys are the older key spellings Set still accepts, in the
// units they were given in.
var hardwareAliasKeys = map[string]func(h *Hardware, v string) error{
	"hbm_gib":     func(h *Hardware, v string) error { return setBytes(&h.HBMBytes, v+"GiB") },
	"nvlink_gbps": func(h *Hardware, v string) error { return setRateIn(&h.NVLinkBytesPerSec, v, gb) },
	"net_gbps":    func(h *Hardware, v string) error { return setRateIn(&h.NetBytesPerSec, v, gb) },
	"hbm_gbps":    func(h *Hardware, v string) error { return setRateIn(&h.HBMBytesPerSec, v, gb) },
}

// HardwareFields lists the keys Set accepts, with their units.
var HardwareFields = func() []string {
	out := make([]string, len(hardwareFields))
	for i, f := range hardwareFields {
		out[i] = f.name + " (" + f.unit + ")"
	}
	return out
}()

// Set overrides one field by key (see HardwareFields). Byte counts take a
// unit (80GiB, 141GB) or plain bytes; rates take one (450GB/s) or plain
// bytes per second. The older keys hbm_gib, nvlink_gbps and net_gbps
// (GB/s) are accepted too.
func (h *Hardware) Set(key, value string) error {
	value = strings.TrimSpace(value)
	for _, f := range hardwareFields {
		if f.name == key {
			if err := f.set(h, value); err != nil {
				return fmt.Errorf("gpu field %s: %w", key, err)
			}
			return nil
		}
	}
	if set, ok := hardwareAliasKeys[key]; ok {
		if err := set(h, value); err != nil {
			return fmt.Errorf("gpu field %s: %w", key, err)
		}
		return nil
	}
	return fmt.Errorf("unknown gpu field %q: use one of %s", key, strings.Join(HardwareFields, ", "))
}

// Validate reports the first impossible value in h.
func (h Hardware) Validate() error {
	switch {
	case h.PeakTFLOPS <= 0:
		return fmt.Errorf("gpu %s: peak TFLOP/s must be positive", h.Name)
	case h.HBMBytes <= 0:
		return fmt.Errorf("gpu %s: memory must be positive", h.Name)
	case h.HBMBytesPerSec <= 0:
		return fmt.Errorf("gpu %s: memory bandwidth must be positive", h.Name)
	case h.NVLinkBytesPerSec <= 0:
		return fmt.Errorf("gpu %s: NVLink bandwidth must be positive", h.Name)
	case h.NetBytesPerSec <= 0:
		return fmt.Errorf("gpu %s: network bandwidth must be positive", h.Name)
	case h.GPUsPerNode <= 0:
		return fmt.Errorf("gpu %s: GPUs per node must be positive", h.Name)
	case h.GEMMEfficiency <= 0 || h.GEMMEfficiency > 1:
		return fmt.Errorf("gpu %s: gemm_max_efficiency must be in (0, 1], got %g", h.Name, h.GEMMEfficiency)
	case h.PeakFP8TFLOPS > 0 && (h.FP8GEMMEfficiency <= 0 || h.FP8GEMMEfficiency > 1):
		return fmt.Errorf("gpu %s: fp8_gemm_max_efficiency must be in (0, 1] where the GPU has an fp8 peak, got %g", h.Name, h.FP8GEMMEfficiency)
	case h.GEMMHalfDim < 0:
		return fmt.Errorf("gpu %s: gemm_half_dim must not be negative", h.Name)
	case h.FlashAttentionEfficiency <= 0 || h.FlashAttentionEfficiency > 1:
		return fmt.Errorf("gpu %s: flash_attention_efficiency must be in (0, 1], got %g", h.Name, h.FlashAttentionEfficiency)
	case h.ElementwiseEfficiency <= 0 || h.ElementwiseEfficiency > 1:
		return fmt.Errorf("gpu %s: elementwise_efficiency must be in (0, 1], got %g", h.Name, h.ElementwiseEfficiency)
	case h.NVLinkEfficiency <= 0 || h.NVLinkEfficiency > 1 || h.NetEfficiency <= 0 || h.NetEfficiency > 1:
		return fmt.Errorf("gpu %s: nvlink_efficiency and net_efficiency must be in (0, 1]", h.Name)
	}
	return nil
}

// Unit-aware value parsing shared by Hardware.Set and Tunables.Set.

func floatSetter[T any](field func(*T) *float64) func(*T, string) error {
	return func(x *T, v string) error {
		f, err := strconv.ParseFloat(v, 64)
		if err != nil || f < 0 || math.IsInf(f, 0) || math.IsNaN(f) {
			return fmt.Errorf("%q is not a non-negative number", v)
		}
		*field(x) = f
		return nil
	}
}

func fractionSetter[T any](field func(*T) *float64) func(*T, string) error {
	return func(x *T, v string) error {
		f, err := strconv.ParseFloat(v, 64)
		if err != nil || f < 0 || f > 1 {
			return fmt.Errorf("%q is not a fraction between 0 and 1", v)
		}
		*field(x) = f
		return nil
	}
}

func rateSetter[T any](field func(*T) *float64) func(*T, string) error {
	return func(x *T, v string) error { return setRateIn(field(x), v, 1) }
}

func durationSetter[T any](field func(*T) *time.Duration) func(*T, string) error {
	return func(x *T, v string) error {
		d, err := parseDuration(v)
		if err != nil {
			return err
		}
		*field(x) = d
		return nil
	}
}

// byteUnits are the suffixes parseBytes accepts, longest first.
var byteUnits = []struct {
	suffix string
	mult   float64
}{
	{"TiB", 1 << 40}, {"GiB", 1 << 30}, {"MiB", 1 << 20}, {"KiB", 1 << 10},
	{"TB", 1e12}, {"GB", 1e9}, {"MB", 1e6}, {"KB", 1e3}, {"B", 1},
}

// parseBytes reads "80GiB", "141GB", "4e9" or "4294967296".
func parseBytes(v string) (float64, error) {
	s := strings.TrimSpace(v)
	mult := 1.0
	for _, u := range byteUnits {
		if strings.HasSuffix(s, u.suffix) {
			s, mult = strings.TrimSpace(strings.TrimSuffix(s, u.suffix)), u.mult
			break
		}
	}
	f, err := strconv.ParseFloat(s, 64)
	if err != nil || f < 0 || math.IsInf(f, 0) || math.IsNaN(f) {
		return 0, fmt.Errorf("%q is not a byte count such as 80GiB, 141GB or 4e9", v)
	}
	return f * mult, nil
}

func setBytes(dst *int64, v string) error {
	f, err := parseBytes(v)
	if err != nil {
		return err
	}
	if f >= math.MaxInt64 {
		return fmt.Errorf("%q is too large a byte count", v)
	}
	*dst = int64(f)
	return nil
}

// setRateIn reads a rate ("450GB/s", "25e9") into dst; a bare number is
// taken in units of bare (1 for bytes/s, 1e9 for the GB/s aliases).
func setRateIn(dst *float64, v string, bare float64) error {
	s := strings.TrimSpace(v)
	if r, ok := strings.CutSuffix(s, "/s"); ok {
		f, err := parseBytes(r)
		if err != nil {
			return fmt.Errorf("%q is not a rate such as 450GB/s or 25e9", v)
		}
		*dst = f
		return nil
	}
	f, err := strconv.ParseFloat(s, 64)
	if err != nil || f < 0 || math.IsInf(f, 0) || math.IsNaN(f) {
		return fmt.Errorf("%q is not a rate such as 450GB/s or 25e9", v)
	}
	*dst = f * bare
	return nil
}

// parseDuration reads "30m", "1h30m" or a number of seconds, up to about
// 290 years (time.Duration's range).
func parseDuration(v string) (time.Duration, error) {
	s := strings.TrimSpace(v)
	if f, err := strconv.ParseFloat(s, 64); err == nil {
		if f < 0 || math.IsInf(f, 0) || math.IsNaN(f) || f*float64(time.Second) >= math.MaxInt64 {
			return 0, fmt.Errorf("%q is not a non-negative duration of at most %.0f seconds", v, float64(math.MaxInt64)/float64(time.Second))
		}
		return time.Duration(f * float64(time.Second)), nil
	}
	d, err := time.ParseDuration(s)
	if err != nil || d < 0 {
		return 0, fmt.Errorf("%q is not a non-negative duration such as 30m or 1800 (seconds)", v)
	}
	return d, nil
}
