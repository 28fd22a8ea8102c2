package jobs

import (
	"strings"
	"testing"

	"github.com/gpuctl/gpuctl/api"
	"github.com/gpuctl/gpuctl/scheduler"
)

// typedNode is a ready node of n GPUs of an NVML model name.
func typedNode(name string, n int, model string) *api.NodeStatus {
	ns := readyNode(name, n, "r-"+name, "s0")
	for _, g := range ns.Gpus {
		g.Info.Model = model
	}
	return ns
}

// twoModelSpec allows h100 and a100-40gb, with a model the planner plans
// on each: plain data parallelism fits the h100's 80 GB, not 40 GB.
const twoModelSpec = `name: either
command: [x]
gpus: 8
gpu_models: [h100, a100-40gb]
model: {layers: 24, hidden: 2048, heads: 16, seq_len: 2048, vocab: 50257, global_batch: 64}
checkpoint: {dir: /ckpt/either, reshardable: true}
`

// TestGPUModelsStartWithTheirTypesPlan: a job allowing h100 and a100 is
// planned on each; with the h100s taken it starts on the a100s, runs the
// a100 plan, and says which type it got and why; with type allocation on
// and both free, it gets the type it runs fastest on.
func TestGPUModelsStartWithTheirTypesPlan(t *testing.T) {
	for _, tc := range []struct {
		name     string
		hetero   scheduler.Objective
		busyH100 bool
		want     string
		why      string
	}{
		{"h100s taken", "", true, "a100-40gb", "a100-40gb: best placement; type-agnostic"},
		{"max-throughput, both free", scheduler.MaxThroughput, false, "h100", "× its a100-40gb throughput; max-throughput"},
		{"max-throughput, h100s taken", scheduler.MaxThroughput, true, "a100-40gb", "max-throughput, no h100 free"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h := &harness{t: t}
			*h = *newHarness(t, "fifo", typedNode("h", 8, "NVIDIA H100 80GB HBM3"), typedNode("a", 8, "NVIDIA A100-SXM4-40GB"))
			if tc.hetero != "" {
				h.hetero = tc.hetero
				h.restart("fifo")
			}
			if tc.busyH100 {
				h.submit("name: busy\ncommand: [x]\ngpus: 8\ngpu_model: h100\n", false)
				h.reconcile()
			}
			id := h.submit(twoModelSpec, false)
			h.reconcile()
			j := h.job(id)
			if len(j.GetTypePlans()) != 2 {
				t.Fatalf("type plans %v", j.GetTypePlans())
			}
			if j.GetState() != api.JobState_JOB_STATE_RUNNING {
				t.Fatalf("%s: %s", stateName(j.GetState()), j.GetPendingReason())
			}
			node := map[string]string{"h100": "h", "a100-40gb": "a"}[tc.want]
			if got := j.GetPlacement()[0].GetNode(); got != node || j.GetGpuType() != tc.want {
				t.Fatalf("on %s as %q, want %s (%s)", got, j.GetGpuType(), node, tc.want)
			}
			var typePlan *api.JobPlan
			for _, tp := range j.GetTypePlans() {
				if tp.GetGpuModel() == tc.want {
					typePlan = tp.GetPlan()
				}
			}
			p := j.GetPlan()
			if p.GetTp() != typePlan.GetTp() || p.GetPp() != typePlan.GetPp() || p.GetStepSeconds() != typePlan.GetStepSeconds() {
				t.Errorf("runs plan %v, want %s's %v", p, tc.want, typePlan)
			}
			if a, b := j.GetTypePlans()[0].GetPlan(), j.GetTypePlans()[1].GetPlan(); a.GetTp() == b.GetTp() && a.GetPp() == b.GetPp() && a.GetMicroBatch() == b.GetMicroBatch() {
				t.Errorf("the same plan on both models: %v", a)
			}
			if !strings.Contains(j.GetGpuTypeReason(), tc.why) {
				t.Errorf("reason %q, want %q", j.GetGpuTypeReason(), tc.why)
			}
		})
	}
}
