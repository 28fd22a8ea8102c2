package costmodel

import (
	"fmt"
	"sort"
	"strconv"
	"strings"
)

const (
	gib = 1 << 30
	gb  = 1e9
)

// Hardware is one GPU model as it sits in a node: its peak dense throughput,
// memory and the two links the cost model charges communication to.
type Hardware struct {
	// Name is the profile name (h100, a100-80gb, …).
	Name string `json:"name"`
	// PeakTFLOPS is the dense (no sparsity) BF16/FP16 tensor-core peak.
	PeakTFLOPS float64 `json:"peak_tflops"`
	// PeakFP8TFLOPS is the dense FP8 peak; 0 where the GPU has no FP8.
	PeakFP8TFLOPS float64 `json:"peak_fp8_tflops"`
	// HBMBytes is the device memory.
	HBMBytes int64 `json:"hbm_bytes"`
	// NVLinkBytesPerSec is one GPU's NVLink bandwidth in one direction
	// (datasheets quote both directions added: 900 GB/s means 450 here).
	NVLinkBytesPerSec float64 `json:"nvlink_bytes_per_sec"`
	// NetBytesPerSec is one GPU's share of the inter-node fabric, one
	// direction (a 400 Gb/s NIC per GPU is 50e9).
	NetBytesPerSec float64 `json:"net_bytes_per_sec"`
	// GPUsPerNode is the size of one NVLink domain.
	GPUsPerNode int `json:"gpus_per_node"`
}

// hardware profiles, from vendor datasheets (dense figures: datasheets list
// "with sparsity" numbers at twice these).
var hardware = map[string]Hardware{
	// NVIDIA A100 datasheet: BF16 tensor 312 TFLOPS dense, 40 GB HBM2,
	// NVLink 3 600 GB/s (300 each way). DGX A100: 8× 200 Gb/s HDR
	// InfiniBand for compute, one per GPU → 25 GB/s.
	"a100-40gb": {Name: "a100-40gb", PeakTFLOPS: 312, HBMBytes: 40 * gib,
		NVLinkBytesPerSec: 300 * gb, NetBytesPerSec: 25 * gb, GPUsPerNode: 8},
	// Same die and links; 80 GB HBM2e.
	"a100-80gb": {Name: "a100-80gb", PeakTFLOPS: 312, HBMBytes: 80 * gib,
		NVLinkBytesPerSec: 300 * gb, NetBytesPerSec: 25 * gb, GPUsPerNode: 8},
	// NVIDIA H100 SXM5 datasheet: BF16 1,979 TFLOPS with sparsity (989.4
	// dense), FP8 3,958 sparse (1,979 dense), 80 GB HBM3, NVLink 4
	// 900 GB/s. DGX H100: 8× ConnectX-7 400 Gb/s NDR → 50 GB/s per GPU.
	"h100": {Name: "h100", PeakTFLOPS: 989.4, PeakFP8TFLOPS: 1978.9, HBMBytes: 80 * gib,
		NVLinkBytesPerSec: 450 * gb, NetBytesPerSec: 50 * gb, GPUsPerNode: 8},
	// NVIDIA H200 SXM datasheet: same GH100 compute as H100, 141 GB HBM3e
	// at 4.8 TB/s, NVLink 900 GB/s; DGX H200 keeps 8× 400 Gb/s.
	"h200": {Name: "h200", PeakTFLOPS: 989.4, PeakFP8TFLOPS: 1978.9, HBMBytes: 141 * gib,
		NVLinkBytesPerSec: 450 * gb, NetBytesPerSec: 50 * gb, GPUsPerNode: 8},
	// NVIDIA HGX B200 (1,000 W): BF16 4.5 PFLOPS sparse / 2.25 dense, FP8
	// 4.5 dense, 180 GB HBM3e per GPU (1,440 GB per 8-GPU board), NVLink 5
	// 1.8 TB/s. DGX B200: 8× ConnectX-7 400 Gb/s → 50 GB/s per GPU.
	"b200": {Name: "b200", PeakTFLOPS: 2250, PeakFP8TFLOPS: 4500, HBMBytes: 180 * gib,
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

// LookupHardware returns the named profile; names are case-insensitive and
// accept common aliases (a100-80, h100-sxm, …).
func LookupHardware(name string) (Hardware, error) {
	n := strings.ToLower(strings.TrimSpace(name))
	if a, ok := hardwareAliases[n]; ok {
		n = a
	}
	hw, ok := hardware[n]
	if !ok {
		return Hardware{}, fmt.Errorf("unknown gpu %q: use one of %s", name, strings.Join(HardwareNames(), ", "))
	}
	return hw, nil
}

// HardwareFields lists the keys Set accepts, with their units.
var HardwareFields = []string{
	"peak_tflops (dense bf16)", "peak_fp8_tflops", "hbm_gib", "nvlink_gbps (GB/s one way)",
	"net_gbps (GB/s one way, per GPU)", "gpus_per_node",
}

// Set overrides one field by key (see HardwareFields), value in the units
// a datasheet uses: TFLOP/s, GiB, GB/s.
func (h *Hardware) Set(key, value string) error {
	if key == "gpus_per_node" {
		n, err := strconv.Atoi(value)
		if err != nil || n <= 0 {
			return fmt.Errorf("gpu field gpus_per_node: %q is not a positive whole number", value)
		}
		h.GPUsPerNode = n
		return nil
	}
	v, err := strconv.ParseFloat(value, 64)
	if err != nil || v < 0 {
		return fmt.Errorf("gpu field %s: %q is not a non-negative number", key, value)
	}
	switch key {
	case "peak_tflops":
		h.PeakTFLOPS = v
	case "peak_fp8_tflops":
		h.PeakFP8TFLOPS = v
	case "hbm_gib":
		h.HBMBytes = int64(v * gib)
	case "nvlink_gbps":
		h.NVLinkBytesPerSec = v * gb
	case "net_gbps":
		h.NetBytesPerSec = v * gb
	default:
		return fmt.Errorf("unknown gpu field %q: use one of %s", key, strings.Join(HardwareFields, ", "))
	}
	return nil
}

// Validate reports the first impossible value in h.
func (h Hardware) Validate() error {
	switch {
	case h.PeakTFLOPS <= 0:
		return fmt.Errorf("gpu %s: peak TFLOP/s must be positive", h.Name)
	case h.HBMBytes <= 0:
		return fmt.Errorf("gpu %s: memory must be positive", h.Name)
	case h.NVLinkBytesPerSec <= 0:
		return fmt.Errorf("gpu %s: NVLink bandwidth must be positive", h.Name)
	case h.NetBytesPerSec <= 0:
		return fmt.Errorf("gpu %s: network bandwidth must be positive", h.Name)
	case h.GPUsPerNode <= 0:
		return fmt.Errorf("gpu %s: GPUs per node must be positive", h.Name)
	}
	return nil
}
