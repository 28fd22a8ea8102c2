package main

import (
	"strings"
	"testing"

	"github.com/gpuctl/gpuctl/api"
)

// The fault command line: slow and link-slow need a factor in (0, 1],
// hang a place (inside or outside a collective), the other kinds refuse
// either, and each refusal says what to give.
func TestFaultRequest(t *testing.T) {
	cases := []struct {
		kind      string
		gpu       int32
		where     string
		factor    float64
		factorSet bool
		want      *api.InjectFault
		err       string
	}{
		{kind: "slow", gpu: 3, factor: 0.7, factorSet: true, want: &api.InjectFault{GpuIndex: 3, Kind: api.FaultKind_FAULT_KIND_SLOW, Factor: 0.7}},
		{kind: "LINK-SLOW", factor: 0.5, factorSet: true, want: &api.InjectFault{Kind: api.FaultKind_FAULT_KIND_LINK_SLOW, Factor: 0.5}},
		{kind: "thermal", gpu: 1, want: &api.InjectFault{GpuIndex: 1, Kind: api.FaultKind_FAULT_KIND_THERMAL}},
		{kind: "clear", want: &api.InjectFault{Kind: api.FaultKind_FAULT_KIND_CLEAR}},
		{kind: "slow", err: "needs --factor"},
		{kind: "slow", factor: 1.5, factorSet: true, err: "in (0, 1]"},
		{kind: "link-slow", factor: 0, factorSet: true, err: "in (0, 1]"},
		{kind: "xid79", factor: 0.5, factorSet: true, err: "--factor is for slow and link-slow"},
		{kind: "sluggish", err: "unknown fault"},
		{kind: "hang", gpu: 2, where: "inside", want: &api.InjectFault{GpuIndex: 2, Kind: api.FaultKind_FAULT_KIND_HANG_INSIDE}},
		{kind: "hang", gpu: 2, where: "OUTSIDE", want: &api.InjectFault{GpuIndex: 2, Kind: api.FaultKind_FAULT_KIND_HANG_OUTSIDE}},
		{kind: "hang", where: "nearby", err: "use inside (in a collective) or outside"},
		{kind: "xid48", where: "inside", err: "--where is for hang"},
	}
	for _, c := range cases {
		where := c.where
		if where == "" {
			where = "inside" // the flag's default
		}
		got, err := faultRequest(c.kind, c.gpu, where, c.where != "", c.factor, c.factorSet)
		if c.err != "" {
			if err == nil || !strings.Contains(err.Error(), c.err) {
				t.Errorf("%s factor %g: err %v, want one saying %q", c.kind, c.factor, err, c.err)
			}
			continue
		}
		if err != nil {
			t.Errorf("%s: %v", c.kind, err)
			continue
		}
		if got.GetGpuIndex() != c.want.GetGpuIndex() || got.GetKind() != c.want.GetKind() || got.GetFactor() != c.want.GetFactor() {
			t.Errorf("%s: got %v, want %v", c.kind, got, c.want)
		}
	}
}
