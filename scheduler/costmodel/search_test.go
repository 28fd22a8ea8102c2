package costmodel

import (
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"
)

func searchPreset(t testing.TB, model, gpu string, gpus int, edit func(*Options)) ([]Evaluation, []Rejection) {
	t.Helper()
	m, tr, err := LookupModel(model)
	if err != nil {
		t.Fatal(err)
	}
	hw, err := LookupHardware(gpu)
	if err != nil {
		t.Fatal(err)
	}
	opt := Options{Training: tr, Tunables: DefaultTunables(), MaxVirtualStages: 4}
	if edit != nil {
		edit(&opt)
	}
	return Search(m, hw, gpus, opt)
}

func reasons(rej []Rejection) map[Reason]int {
	out := map[Reason]int{}
	for _, r := range rej {
		out[r.Reason]++
	}
	return out
}

func TestSearchGPT1TOn3072H100(t *testing.T) {
	ranked, rejected := searchPreset(t, "gpt-1t", "h100", 3072, nil)
	if len(ranked) == 0 {
		t.Fatalf("no plan found; rejections: %v", reasons(rejected))
	}
	for i, ev := range ranked {
		if ev.TP > 8 || ev.GPUs() != 3072 || !ev.Fits {
			t.Errorf("ranked[%d] = %s: tp ≤ 8, 3072 GPUs and fitting expected", i, ev.Plan)
		}
		if i > 0 && ev.StepSeconds < ranked[i-1].StepSeconds {
			t.Errorf("ranked not sorted at %d", i)
		}
	}
	best := ranked[0]
	// A trillion parameters cannot run with little model parallelism.
	if best.TP*best.PP < 64 {
		t.Errorf("best plan %s splits the model only %d ways", best.Plan, best.TP*best.PP)
	}
	r := reasons(rejected)
	for _, want := range []Reason{ReasonTPExceedsNode, ReasonOutOfMemory} {
		if r[want] == 0 {
			t.Errorf("no %q rejection recorded: %v", want, r)
		}
	}
	for _, rj := range rejected {
		if rj.Reason == ReasonOutOfMemory && !strings.Contains(rj.Detail, "GiB of 80.0 GiB") {
			t.Errorf("out-of-memory detail %q lacks the numbers", rj.Detail)
		}
	}
}

func TestSearchAgreesWithExhaustiveEvaluate(t *testing.T) {
	// The pruned search must find the same best plan as evaluating every
	// plan through the public Evaluate.
	m, tr, _ := LookupModel("gpt3-175b")
	hw, _ := LookupHardware("a100-80gb")
	c := Config{Model: m, Hardware: hw, Training: tr, Tunables: DefaultTunables()}
	const gpus = 512
	var best *Evaluation
	for tp := 1; tp <= 8; tp *= 2 {
		for pp := 1; pp <= m.Layers; pp++ {
			if gpus%(tp*pp) != 0 || m.Layers%pp != 0 {
				continue
			}
			for _, mbs := range []int{1, 2, 4, 8} {
				for v := 1; v <= 4; v++ {
					ev, err := c.Evaluate(Plan{TP: tp, PP: pp, DP: gpus / (tp * pp), MicroBatch: mbs, VirtualStages: v})
					if err != nil || !ev.Fits {
						continue
					}
					if best == nil || ev.StepSeconds < best.StepSeconds {
						e := ev
						best = &e
					}
				}
			}
		}
	}
	ranked, _ := Search(m, hw, gpus, Options{Training: tr, Tunables: DefaultTunables(), MaxVirtualStages: 4})
	if best == nil || len(ranked) == 0 {
		t.Fatalf("exhaustive best %v, search found %d", best, len(ranked))
	}
	if ranked[0].Plan != best.Plan || ranked[0].StepSeconds != best.StepSeconds {
		t.Fatalf("search best %s (%.4f s), exhaustive best %s (%.4f s)", ranked[0].Plan, ranked[0].StepSeconds, best.Plan, best.StepSeconds)
	}
	for _, ev := range ranked {
		again, err := c.Evaluate(ev.Plan)
		if err != nil || !reflect.DeepEqual(again, ev) {
			t.Fatalf("search and Evaluate disagree on %s: %v", ev.Plan, err)
		}
	}
}

func TestSearchFixedPlan(t *testing.T) {
	ranked, _ := searchPreset(t, "gpt3-175b", "a100-80gb", 1024, func(o *Options) { o.TP, o.PP, o.DP = 8, 8, 16 })
	if len(ranked) == 0 {
		t.Fatal("fixed plan tp 8 pp 8 dp 16 should fit")
	}
	for _, ev := range ranked {
		if ev.TP != 8 || ev.PP != 8 || ev.DP != 16 {
			t.Fatalf("fixed search returned %s", ev.Plan)
		}
	}
	ranked, rejected := searchPreset(t, "gpt3-175b", "a100-80gb", 1024, func(o *Options) { o.TP, o.PP, o.DP = 8, 8, 8 })
	if len(ranked) != 0 || reasons(rejected)[ReasonGPUsNotDivisible] != 1 {
		t.Fatalf("tp 8 × pp 8 × dp 8 on 1024 GPUs: ranked %d, rejected %v", len(ranked), rejected)
	}
}

func TestSearchRejectionReasons(t *testing.T) {
	tests := []struct {
		name  string
		model Model
		batch int
		gpus  int
		opt   func(*Options)
		want  Reason
	}{
		{"tp beyond node", Model{Layers: 4, Hidden: 2048, Heads: 32, SeqLen: 512, Vocab: 1000}, 64, 32, nil, ReasonTPExceedsNode},
		{"heads", Model{Layers: 4, Hidden: 1536, Heads: 12, SeqLen: 512, Vocab: 1000}, 64, 16, nil, ReasonHeadsNotDivisible},
		{"kv heads", Model{Layers: 4, Hidden: 2048, Heads: 16, KVHeads: 2, SeqLen: 512, Vocab: 1000}, 64, 16, nil, ReasonHeadsNotDivisible},
		{"gpus", Model{Layers: 4, Hidden: 2048, Heads: 16, SeqLen: 512, Vocab: 1000}, 64, 12, func(o *Options) { o.TP = 8 }, ReasonGPUsNotDivisible},
		{"layers", Model{Layers: 6, Hidden: 2048, Heads: 16, SeqLen: 512, Vocab: 1000}, 64, 16, nil, ReasonLayersNotDivisible},
		{"batch", Model{Layers: 4, Hidden: 2048, Heads: 16, SeqLen: 512, Vocab: 1000}, 6, 16, nil, ReasonBatchNotDivisible},
		{"interleave", Model{Layers: 8, Hidden: 2048, Heads: 16, SeqLen: 512, Vocab: 1000}, 12, 8, func(o *Options) { o.TP, o.PP = 1, 4 }, ReasonInterleaveImpossible},
		{"memory", Model{Layers: 96, Hidden: 12288, Heads: 96, SeqLen: 2048, Vocab: 50000}, 64, 8, nil, ReasonOutOfMemory},
		{"invalid", Model{Layers: 0, Hidden: 2048, Heads: 16, SeqLen: 512, Vocab: 1000}, 64, 8, nil, ReasonInvalidInput},
	}
	hw, _ := LookupHardware("h100")
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			opt := Options{Training: Training{GlobalBatch: tt.batch, SequenceParallel: true}, Tunables: DefaultTunables(), MaxVirtualStages: 2}
			if tt.opt != nil {
				tt.opt(&opt)
			}
			_, rejected := Search(tt.model, hw, tt.gpus, opt)
			if reasons(rejected)[tt.want] == 0 {
				t.Fatalf("no %q rejection; got %v", tt.want, rejected)
			}
		})
	}
}

func TestSearchTopAndSlower(t *testing.T) {
	all, _ := searchPreset(t, "llama2-70b", "h100", 256, nil)
	top, rejected := searchPreset(t, "llama2-70b", "h100", 256, func(o *Options) { o.Top = 3 })
	if len(all) <= 3 || len(top) != 3 {
		t.Fatalf("all %d, top %d", len(all), len(top))
	}
	if !reflect.DeepEqual(top, all[:3]) {
		t.Fatalf("top 3 differ from the first 3 of the full ranking")
	}
	slower := 0
	for _, r := range rejected {
		if r.Reason == ReasonSlower {
			slower++
			if r.Evaluation == nil || !strings.HasPrefix(r.Detail, "slower by ") {
				t.Fatalf("slower rejection %+v lacks numbers", r)
			}
		}
	}
	if slower != len(all)-3 {
		t.Fatalf("%d slower rejections, want %d", slower, len(all)-3)
	}
}

func TestSearchUnevenPipeline(t *testing.T) {
	_, rejected := searchPreset(t, "llama3-405b", "h100", 2048, nil)
	if reasons(rejected)[ReasonLayersNotDivisible] == 0 {
		t.Fatal("126 layers: pp 4 should be refused without uneven pipelines")
	}
	ranked, _ := searchPreset(t, "llama3-405b", "h100", 2048, func(o *Options) { o.AllowUnevenPipeline = true })
	if !slices.ContainsFunc(ranked, func(e Evaluation) bool { return len(e.Notes) > 0 }) {
		t.Fatal("uneven plans carry no note")
	}
}

func TestSearchLlama405BOn8192H100(t *testing.T) {
	// gpuctl plan --model llama3-405b --gpus 8192 --gpu h100 must find a
	// plan that fits; the published layout (tp 8, pp 16, dp 64, Llama 3
	// Table 4) is among them, with 126 layers split unevenly.
	ranked, rejected := searchPreset(t, "llama3-405b", "h100", 8192, func(o *Options) { o.AllowUnevenPipeline = true; o.MaxVirtualStages = 8 })
	if len(ranked) == 0 {
		t.Fatalf("no plan fits; rejections %v", reasons(rejected))
	}
	if !ranked[0].Fits || ranked[0].GPUs() != 8192 {
		t.Fatalf("best %s fits %v", ranked[0].Plan, ranked[0].Fits)
	}
	if !slices.ContainsFunc(ranked, func(e Evaluation) bool { return e.TP == 8 && e.PP == 16 && e.DP == 64 && e.Fits }) {
		t.Errorf("the published layout tp 8 × pp 16 × dp 64 is not among the plans that fit")
	}
}

func TestSearchContextParallelismForLongSequences(t *testing.T) {
	m, tr, _ := LookupModel("llama3-405b")
	m.SeqLen, tr.GlobalBatch = 131072, 128
	hw, _ := LookupHardware("h100")
	ranked, _ := Search(m, hw, 16384, Options{Training: tr, Tunables: DefaultTunables(), MaxVirtualStages: 8, AllowUnevenPipeline: true})
	if len(ranked) == 0 || !slices.ContainsFunc(ranked, func(e Evaluation) bool { return e.CP > 1 }) {
		t.Fatalf("%d plans for 128K tokens, none with context parallelism", len(ranked))
	}
	// NeMo's recipes split 8K sequences in two; 4K sequences stay whole
	// unless asked.
	if eight, _ := searchPreset(t, "llama3-405b", "h100", 8192, func(o *Options) { o.AllowUnevenPipeline = true }); !slices.ContainsFunc(eight, func(e Evaluation) bool { return e.CP == 2 }) ||
		slices.ContainsFunc(eight, func(e Evaluation) bool { return e.CP > 2 }) {
		t.Errorf("8K sequences: want cp 2 tried and nothing wider")
	}
	if short, _ := searchPreset(t, "llama2-70b", "h100", 256, nil); slices.ContainsFunc(short, func(e Evaluation) bool { return e.CP > 1 }) {
		t.Errorf("context parallelism tried for 4K sequences without being asked")
	}
}

func TestSearchRanksByEffectiveStepWithFailures(t *testing.T) {
	ranked, _ := searchPreset(t, "llama2-70b", "h100", 256, func(o *Options) { o.Tunables.MTBF = 2 * time.Hour })
	if len(ranked) < 2 {
		t.Fatal("too few plans")
	}
	for i, e := range ranked {
		if e.Goodput == nil {
			t.Fatalf("ranked[%d] has no goodput with an MTBF set", i)
		}
		if i > 0 && e.Goodput.EffectiveStepSec < ranked[i-1].Goodput.EffectiveStepSec {
			t.Fatalf("ranked[%d] not sorted by effective step", i)
		}
	}
}

func TestSearchDeterministic(t *testing.T) {
	a1, r1 := searchPreset(t, "gpt-1t", "h100", 3072, nil)
	a2, r2 := searchPreset(t, "gpt-1t", "h100", 3072, nil)
	if !reflect.DeepEqual(a1, a2) || !reflect.DeepEqual(r1, r2) {
		t.Fatal("two searches over the same input differ")
	}
}

// BenchmarkSearch1T3072 is a full search of a trillion-parameter model on
// 3,072 H100s, with the options earlier versions took and with the uneven
// pipelines gpuctl plan tries by default.
func BenchmarkSearch1T3072(b *testing.B) {
	m, tr, _ := LookupModel("gpt-1t")
	hw, _ := LookupHardware("h100")
	b.Run("even", func(b *testing.B) {
		benchSearch(b, m, hw, 3072, Options{Training: tr, Tunables: DefaultTunables(), MaxVirtualStages: 8})
	})
	b.Run("uneven", func(b *testing.B) {
		benchSearch(b, m, hw, 3072, Options{Training: tr, Tunables: DefaultTunables(), MaxVirtualStages: 8, AllowUnevenPipeline: true})
	})
}

func benchSearch(b *testing.B, m Model, hw Hardware, gpus int, opt Options) {
	plans := 0
	for b.Loop() {
		ranked, rejected := Search(m, hw, gpus, opt)
		plans += len(ranked) + len(rejected)
	}
	sec := b.Elapsed().Seconds()
	b.ReportMetric(float64(plans)/sec, "plans/s")
	b.ReportMetric(sec*1e3/float64(b.N), "ms/search")
}

func BenchmarkEvaluate(b *testing.B) {
	m, tr, _ := LookupModel("gpt-1t")
	hw, _ := LookupHardware("h100")
	c := Config{Model: m, Hardware: hw, Training: tr, Tunables: DefaultTunables()}
	p := Plan{TP: 8, PP: 64, DP: 6, MicroBatch: 1, VirtualStages: 2}
	for b.Loop() {
		if _, err := c.Evaluate(p); err != nil {
			b.Fatal(err)
		}
	}
	b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "plans/s")
}
