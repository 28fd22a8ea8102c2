package nvml

import (
	"slices"
	"testing"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
)

func TestDecodeThrottleReasons(t *testing.T) {
	tests := []struct {
		name string
		mask uint64
		want []string
	}{
		{"none", 0, nil},
		{"idle", nvml.ClocksEventReasonGpuIdle, []string{"gpu_idle"}},
		{"all named", 0x1ff, []string{"gpu_idle", "applications_clocks_setting", "sw_power_cap", "hw_slowdown",
			"sync_boost", "sw_thermal_slowdown", "hw_thermal_slowdown", "hw_power_brake_slowdown", "display_clock_setting"}},
		{"thermal", nvml.ClocksThrottleReasonHwSlowdown | nvml.ClocksThrottleReasonHwThermalSlowdown,
			[]string{"hw_slowdown", "hw_thermal_slowdown"}},
		{"newer bits", nvml.ClocksEventReasonBoardLimit | nvml.ClocksEventReasonReliability, []string{"board_limit", "reliability"}},
		{"unknown bits", 1<<12 | 1<<63 | nvml.ClocksEventReasonSwPowerCap, []string{"sw_power_cap", "unknown_bit_12", "unknown_bit_63"}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			if got := DecodeThrottleReasons(tc.mask); !slices.Equal(got, tc.want) {
				t.Errorf("DecodeThrottleReasons(%#x) = %v, want %v", tc.mask, got, tc.want)
			}
		})
	}
}

func TestThrottleCacheSharesSlices(t *testing.T) {
	var c throttleCache
	a := c.names(nvml.ClocksEventReasonGpuIdle)
	b := c.names(nvml.ClocksEventReasonGpuIdle)
	if len(a) != 1 || &a[0] != &b[0] {
		t.Fatalf("names of one mask not shared: %v %v", a, b)
	}
	if c.names(0) != nil {
		t.Fatal("mask 0 has names")
	}
}
