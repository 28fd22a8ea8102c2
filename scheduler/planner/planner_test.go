package planner

import (
	"fmt"
	"slices"
	"strings"
	"testing"

	"github.com/gpuctl/gpuctl/jobspec"
	"github.com/gpuctl/gpuctl/scheduler/costmodel"
)

func TestOptionsAreWhatAJobCanRun(t *testing.T) {
	tests := []struct {
		name    string
		req     Request
		cp, mcp int
		maxV    int
		uneven  bool
	}{
		{"a job: cp for long sequences, uneven, up to 8 chunks", Request{}, 0, 0, MaxVirtualStages, true},
		{"a fixed interleaving is the only one", Request{Fixed: costmodel.Plan{VirtualStages: 3}}, 0, 0, 3, true},
		{"wider cp asked", Request{MaxCP: 8}, 0, 8, MaxVirtualStages, true},
		{"a fixed cp", Request{Fixed: costmodel.Plan{CP: 2}}, 2, 0, MaxVirtualStages, true},
		{"even pipelines only", Request{EvenOnly: true}, 0, 0, MaxVirtualStages, false},
		{"fewer chunks asked", Request{MaxVirtualStages: 2}, 0, 0, 2, true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			o := tt.req.Options()
			if o.CP != tt.cp || o.MaxCP != tt.mcp || o.MaxVirtualStages != tt.maxV || o.AllowUnevenPipeline != tt.uneven {
				t.Errorf("options cp %d max-cp %d v %d uneven %v, want %d %d %d %v", o.CP, o.MaxCP, o.MaxVirtualStages, o.AllowUnevenPipeline,
					tt.cp, tt.mcp, tt.maxV, tt.uneven)
			}
		})
	}
}

// TestForSpecIsForPreset: a job file that names only a preset, GPUs and a
// GPU asks the console's question.
func TestForSpecIsForPreset(t *testing.T) {
	s, err := jobspec.Parse("job.yaml", []byte("name: j\nnodes: 16\ngpus_per_node: 8\ngpu_model: a100-80gb\ncommand: [x]\nmodel: {preset: llama2-70b}\n"))
	if err != nil {
		t.Fatal(err)
	}
	fromSpec, ok, err := ForSpec(s)
	if err != nil || !ok {
		t.Fatalf("ForSpec: %v %v", ok, err)
	}
	fromPreset, err := ForPreset("llama2-70b", "a100-80gb", "", 128)
	if err != nil {
		t.Fatal(err)
	}
	a, _ := Search(fromSpec)
	b, _ := Search(fromPreset)
	if len(a) == 0 || len(b) == 0 || a[0].Plan != b[0].Plan {
		t.Fatalf("job file's best %v, preset's %v", first(a), first(b))
	}
}

// TestForSpecCarriesTheStack: a job file's model.stack reaches the
// request as the stack's overlap terms, as the console asks it with the
// same stack, and a stack that hides more picks a different plan.
func TestForSpecCarriesTheStack(t *testing.T) {
	s, err := jobspec.Parse("job.yaml", []byte("name: j\nnodes: 128\ngpus_per_node: 8\ngpu_model: h100\ncommand: [x]\nmodel: {preset: gpt3-175b, stack: megatron-core-2024}\n"))
	if err != nil {
		t.Fatal(err)
	}
	fromSpec, _, err := ForSpec(s)
	if err != nil {
		t.Fatal(err)
	}
	want, _ := StackTunables("megatron-core-2024")
	if fromSpec.Training.Stack != "megatron-core-2024" || fromSpec.Tunables != want {
		t.Fatalf("ForSpec: stack %q, tunables %+v; want megatron-core-2024's %+v", fromSpec.Training.Stack, fromSpec.Tunables, want)
	}
	fromPreset, err := ForPreset("gpt3-175b", "h100", "megatron-core-2024", 1024)
	if err != nil {
		t.Fatal(err)
	}
	plain, err := ForPreset("gpt3-175b", "h100", "", 1024)
	if err != nil {
		t.Fatal(err)
	}
	a, _ := Search(fromSpec)
	b, _ := Search(fromPreset)
	c, _ := Search(plain)
	if len(a) == 0 || len(b) == 0 || a[0].Plan != b[0].Plan {
		t.Fatalf("job file's best %v, console's %v", first(a), first(b))
	}
	if len(c) == 0 || c[0].Plan == a[0].Plan {
		t.Errorf("the default stack's best %v is megatron-core-2024's too: the stack did not reach the search", first(c))
	}
	if _, err := ForPreset("gpt3-175b", "h100", "megatron-2019", 1024); err == nil || !strings.Contains(err.Error(), "megatron-core-2024") {
		t.Errorf("unknown stack: %v", err)
	}
}

// TestLlama3PublishedLayoutIsReached: Llama 3 405B on 16,384 H100s ran
// tp 8, pp 16 with 8 model chunks per stage, the first and last stages one
// block lighter (Dubey et al. 2024, §3.3.2). Asked only the preset and the
// GPUs, the planner's best plan is predicted at least as fast.
func TestLlama3PublishedLayoutIsReached(t *testing.T) {
	req, err := ForPreset("llama3-405b", "h100", "", 16384)
	if err != nil {
		t.Fatal(err)
	}
	published, err := req.Config().Evaluate(costmodel.Plan{TP: 8, PP: 16, DP: 128, MicroBatch: 1, VirtualStages: 8})
	if err != nil {
		t.Fatal(err)
	}
	if !published.Fits {
		t.Fatalf("the published layout needs %s", costmodel.FormatBytes(published.MemPerGPUBytes))
	}
	ranked, _ := Search(req)
	if len(ranked) == 0 {
		t.Fatal("no plan")
	}
	if best := ranked[0]; Effective(&best) > Effective(&published)*(1+1e-9) || best.VirtualStages < 2 {
		t.Errorf("best %s: %.2f s per step, %.0f TFLOP/s per GPU; the published layout %.2f s, %.0f TFLOP/s",
			best.Plan, best.StepSeconds, best.TFLOPSPerGPU, published.StepSeconds, published.TFLOPSPerGPU)
	}
	req.Fixed = costmodel.Plan{TP: 8, PP: 16}
	ranked, _ = Search(req)
	if len(ranked) == 0 || ranked[0].VirtualStages < 2 {
		t.Errorf("at tp 8, pp 16 the best plan is %v, want an interleaved one", first(ranked))
	}
}

// TestJobFileSearchesContextParallelism: a job file with a long sequence
// and no plan is searched over cp as gpuctl plan searches it, and the
// plan it gets is one a job file can fix.
func TestJobFileSearchesContextParallelism(t *testing.T) {
	s, err := jobspec.Parse("job.yaml", []byte("name: j\nnodes: 8\ngpus_per_node: 8\ngpu_model: h100\ncommand: [x]\n"+
		"model: {preset: llama2-70b, seq_len: 65536, global_batch: 64}\n"))
	if err != nil {
		t.Fatal(err)
	}
	req, _, err := ForSpec(s)
	if err != nil {
		t.Fatal(err)
	}
	ranked, _ := Search(req)
	if !slices.ContainsFunc(ranked, func(e costmodel.Evaluation) bool { return e.CP > 1 }) {
		t.Fatalf("no plan with cp > 1 among %d; best %v", len(ranked), first(ranked))
	}
	best := ranked[0]
	yaml := fmt.Sprintf("name: j\nnodes: 8\ngpus_per_node: 8\ngpu_model: h100\ncommand: [x]\n"+
		"model: {preset: llama2-70b, seq_len: 65536, global_batch: 64, micro_batch: %d}\nplan: {tp: %d, cp: %d, pp: %d, virtual_stages: %d}\n",
		best.MicroBatch, best.TP, best.CP, best.PP, best.VirtualStages)
	if _, err := jobspec.Parse("best.yaml", []byte(yaml)); err != nil {
		t.Errorf("the best plan %s cannot be written in a job file: %v", best.Plan, err)
	}
}

func first(evs []costmodel.Evaluation) any {
	if len(evs) == 0 {
		return "none"
	}
	return evs[0].Plan
}

// TestClosestRanksByWhatSearchRanks: with a failure rate, a loser with a
// shorter step but a worse effective step is further from winning.
func TestClosestRanksByWhatSearchRanks(t *testing.T) {
	fast := costmodel.Evaluation{Plan: costmodel.Plan{TP: 1}, StepSeconds: 1, Goodput: &costmodel.Goodput{EffectiveStepSec: 3}}
	steady := costmodel.Evaluation{Plan: costmodel.Plan{TP: 2}, StepSeconds: 2, Goodput: &costmodel.Goodput{EffectiveStepSec: 2.5}}
	lost := []costmodel.Rejection{
		{Plan: fast.Plan, Reason: costmodel.ReasonSlower, Evaluation: &fast},
		{Plan: costmodel.Plan{TP: 4}, Reason: costmodel.ReasonOutOfMemory, MemPerGPUBytes: 90 << 30},
		{Plan: steady.Plan, Reason: costmodel.ReasonSlower, Evaluation: &steady},
		{Plan: costmodel.Plan{TP: 8}, Reason: costmodel.ReasonOutOfMemory, MemPerGPUBytes: 85 << 30},
		{Plan: costmodel.Plan{TP: 16}, Reason: costmodel.ReasonTPExceedsNode},
	}
	got := Closest(lost, 4)
	want := []int{2, 8, 1, 4}
	if len(got) != len(want) {
		t.Fatalf("%d losers, want %d", len(got), len(want))
	}
	for i, r := range got {
		if r.Plan.TP != want[i] {
			t.Errorf("loser %d is tp %d, want tp %d", i, r.Plan.TP, want[i])
		}
	}
	if rc := Reasons(lost); rc[0] != (ReasonCount{costmodel.ReasonOutOfMemory, 2}) || rc[1] != (ReasonCount{costmodel.ReasonSlower, 2}) {
		t.Errorf("reasons %v", rc)
	}
}

func TestLostAddsTheUnshownAsSlower(t *testing.T) {
	ranked := []costmodel.Evaluation{{Plan: costmodel.Plan{TP: 1}, StepSeconds: 1}, {Plan: costmodel.Plan{TP: 2}, StepSeconds: 1.5}}
	lost := Lost(ranked, nil, 1)
	if len(lost) != 1 || lost[0].Reason != costmodel.ReasonSlower || lost[0].Detail != "slower by 50.0%" {
		t.Fatalf("lost %+v", lost)
	}
	if len(Lost(ranked, nil, 2)) != 0 {
		t.Error("a shown plan counted as lost")
	}
}

// BenchmarkSearch1T3072 is the planner's whole search for a
// trillion-parameter model on 3,072 H100s, as gpuctl serve, gpuctl plan
// and the console ask it: uneven pipelines, interleaving, the failure rate.
// It must stay under 10 ms a search.
func BenchmarkSearch1T3072(b *testing.B) {
	req, err := ForPreset("gpt-1t", "h100", "", 3072)
	if err != nil {
		b.Fatal(err)
	}
	plans := 0
	for b.Loop() {
		ranked, rejected := Search(req)
		plans += len(ranked) + len(rejected)
	}
	b.ReportMetric(b.Elapsed().Seconds()*1e3/float64(b.N), "ms/search")
	b.ReportMetric(float64(plans)/float64(b.N), "plans/search")
}
