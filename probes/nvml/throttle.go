package nvml

import (
	"math/bits"
	"strconv"
	"sync"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
)

// throttleNames names NVML's clocks-event (throttle) reason bits.
var throttleNames = [...]struct {
	bit  uint64
	name string
}{
	{nvml.ClocksEventReasonGpuIdle, "gpu_idle"},
	{nvml.ClocksEventReasonApplicationsClocksSetting, "applications_clocks_setting"},
	{nvml.ClocksEventReasonSwPowerCap, "sw_power_cap"},
	{nvml.ClocksThrottleReasonHwSlowdown, "hw_slowdown"},
	{nvml.ClocksEventReasonSyncBoost, "sync_boost"},
	{nvml.ClocksEventReasonSwThermalSlowdown, "sw_thermal_slowdown"},
	{nvml.ClocksThrottleReasonHwThermalSlowdown, "hw_thermal_slowdown"},
	{nvml.ClocksThrottleReasonHwPowerBrakeSlowdown, "hw_power_brake_slowdown"},
	{nvml.ClocksEventReasonDisplayClockSetting, "display_clock_setting"},
	{nvml.ClocksEventReasonBoardLimit, "board_limit"},
	{nvml.ClocksEventReasonReliability, "reliability"},
}

// throttleSlowdown are the reasons that mean the GPU runs slower than it
// could because of heat or a hardware limit; their start and end are events.
const throttleSlowdown = nvml.ClocksThrottleReasonHwSlowdown | nvml.ClocksEventReasonSwThermalSlowdown |
	nvml.ClocksThrottleReasonHwThermalSlowdown | nvml.ClocksThrottleReasonHwPowerBrakeSlowdown

// DecodeThrottleReasons names the bits set in an NVML clocks-event reason
// mask, in bit order. Bits NVML has not defined are named "unknown_bit_N".
func DecodeThrottleReasons(mask uint64) []string {
	if mask == 0 {
		return nil
	}
	names := make([]string, 0, bits.OnesCount64(mask))
	known := uint64(0)
	for _, t := range throttleNames {
		known |= t.bit
		if mask&t.bit != 0 {
			names = append(names, t.name)
		}
	}
	for rest := mask &^ known; rest != 0; rest &= rest - 1 {
		names = append(names, "unknown_bit_"+strconv.Itoa(bits.TrailingZeros64(rest)))
	}
	return names
}

// throttleCache memoises decoded masks: a host sees a handful of distinct
// masks, and sharing their name slices keeps Sample free of allocations.
// The slices it hands out are shared and must not be modified.
type throttleCache struct {
	mu sync.Mutex
	m  map[uint64][]string
}

func (c *throttleCache) names(mask uint64) []string {
	if mask == 0 {
		return nil
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if n, ok := c.m[mask]; ok {
		return n
	}
	if c.m == nil || len(c.m) > 256 {
		c.m = make(map[uint64][]string)
	}
	n := DecodeThrottleReasons(mask)
	c.m[mask] = n
	return n
}
