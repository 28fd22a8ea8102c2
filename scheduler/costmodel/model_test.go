package costmodel

import (
	"math"
	"strings"
	"testing"
)

func TestPresetParamsMatchPublishedSizes(t *testing.T) {
	tests := []struct {
		name      string
		published float64
	}{
		{"gpt3-175b", 175e9},
		{"llama2-70b", 70e9},
		{"llama3-405b", 405e9},
		{"gpt-1t", 1008e9},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			m, tr, err := LookupModel(tt.name)
			if err != nil {
				t.Fatal(err)
			}
			if err := m.Validate(); err != nil {
				t.Fatalf("preset does not validate: %v", err)
			}
			if tr.GlobalBatch <= 0 {
				t.Errorf("preset global batch %d", tr.GlobalBatch)
			}
			got := m.Params()
			if rel := math.Abs(got-tt.published) / tt.published; rel > 0.03 {
				t.Errorf("Params() = %.4g, published %.4g (%.1f%% off)", got, tt.published, rel*100)
			}
		})
	}
}

// megatronFLOPs is eq. (3) of Narayanan et al. SC'21 and its full
// recomputation variant, written out independently of the package.
func megatronFLOPs(m Model, batch int, full bool) float64 {
	b, s, l, h, v := float64(batch), float64(m.SeqLen), float64(m.Layers), float64(m.Hidden), float64(m.Vocab)
	if full {
		return 96 * b * s * l * h * h * (1 + s/(6*h) + v/(16*l*h))
	}
	return 72 * b * s * l * h * h * (1 + s/(6*h) + v/(12*l*h))
}

func TestIterationFLOPsMatchMegatronFormula(t *testing.T) {
	for _, name := range []string{"gpt3-175b", "gpt-1t"} {
		m, tr, _ := LookupModel(name)
		modelF, hwNone := m.IterationFLOPs(tr.GlobalBatch, RecomputeNone)
		_, hwFull := m.IterationFLOPs(tr.GlobalBatch, RecomputeFull)
		_, hwSel := m.IterationFLOPs(tr.GlobalBatch, RecomputeSelective)
		for _, c := range []struct {
			what      string
			got, want float64
		}{
			{"model", modelF, megatronFLOPs(m, tr.GlobalBatch, false)},
			{"hardware, no recompute", hwNone, megatronFLOPs(m, tr.GlobalBatch, false)},
			{"hardware, full recompute", hwFull, megatronFLOPs(m, tr.GlobalBatch, true)},
		} {
			if rel := math.Abs(c.got-c.want) / c.want; rel > 1e-9 {
				t.Errorf("%s %s FLOPs = %.6g, Megatron formula %.6g", name, c.what, c.got, c.want)
			}
		}
		if !(hwSel > hwNone && hwSel < hwFull) {
			t.Errorf("%s: selective recompute FLOPs %.4g not between none %.4g and full %.4g", name, hwSel, hwNone, hwFull)
		}
	}
}

func TestIterationFLOPsNearSixNT(t *testing.T) {
	// For any preset, model FLOPs are 6·N·tokens plus attention terms.
	for _, name := range ModelNames() {
		m, tr, _ := LookupModel(name)
		f, _ := m.IterationFLOPs(tr.GlobalBatch, RecomputeNone)
		sixNT := 6 * m.Params() * float64(tr.GlobalBatch) * float64(m.SeqLen)
		if r := f / sixNT; r < 1 || r > 1.25 {
			t.Errorf("%s: FLOPs / 6NT = %.3f, want in [1, 1.25]", name, r)
		}
	}
}

func TestModelValidate(t *testing.T) {
	ok := Model{Layers: 2, Hidden: 64, Heads: 4, SeqLen: 16, Vocab: 100}
	tests := []struct {
		name   string
		mutate func(*Model)
		want   string
	}{
		{"valid", func(*Model) {}, ""},
		{"no layers", func(m *Model) { m.Layers = 0 }, "layers must be positive"},
		{"no hidden", func(m *Model) { m.Hidden = -1 }, "hidden size must be positive"},
		{"no heads", func(m *Model) { m.Heads = 0 }, "heads must be positive"},
		{"hidden not divisible by heads", func(m *Model) { m.Heads = 5 }, "not divisible by 5 heads"},
		{"kv heads not dividing heads", func(m *Model) { m.KVHeads = 3 }, "not divisible by 3 kv heads"},
		{"negative kv heads", func(m *Model) { m.KVHeads = -1 }, "kv heads must not be negative"},
		{"negative ffn", func(m *Model) { m.FFN = -1 }, "ffn size"},
		{"no seq", func(m *Model) { m.SeqLen = 0 }, "sequence length"},
		{"no vocab", func(m *Model) { m.Vocab = 0 }, "vocabulary"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			m := ok
			tt.mutate(&m)
			err := m.Validate()
			if tt.want == "" {
				if err != nil {
					t.Fatalf("unexpected error %v", err)
				}
				return
			}
			if err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Fatalf("error %v, want it to contain %q", err, tt.want)
			}
		})
	}
}

func TestLookup(t *testing.T) {
	for alias, want := range map[string]string{"H100": "h100", "a100-80": "a100-80gb", "a100": "a100-80gb", " b200 ": "b200", "h200-sxm": "h200"} {
		hw, err := LookupHardware(alias)
		if err != nil || hw.Name != want {
			t.Errorf("LookupHardware(%q) = %q, %v; want %q", alias, hw.Name, err, want)
		}
	}
	if _, err := LookupHardware("v100"); err == nil || !strings.Contains(err.Error(), "h100") {
		t.Errorf("unknown gpu error %v should list the profiles", err)
	}
	if _, _, err := LookupModel("gpt5"); err == nil || !strings.Contains(err.Error(), "gpt3-175b") {
		t.Errorf("unknown model error %v should list the presets", err)
	}
	for _, n := range HardwareNames() {
		hw, _ := LookupHardware(n)
		if err := hw.Validate(); err != nil {
			t.Errorf("profile %s: %v", n, err)
		}
	}
}

func TestHardwareSet(t *testing.T) {
	tests := []struct {
		key, value string
		check      func(Hardware) bool
		wantErr    bool
	}{
		{"peak_tflops", "500", func(h Hardware) bool { return h.PeakTFLOPS == 500 }, false},
		{"hbm_gib", "96", func(h Hardware) bool { return h.HBMBytes == 96<<30 }, false},
		{"nvlink_gbps", "300", func(h Hardware) bool { return h.NVLinkBytesPerSec == 300e9 }, false},
		{"net_gbps", "25", func(h Hardware) bool { return h.NetBytesPerSec == 25e9 }, false},
		{"gpus_per_node", "4", func(h Hardware) bool { return h.GPUsPerNode == 4 }, false},
		{"gpus_per_node", "0", nil, true},
		{"peak_tflops", "fast", nil, true},
		{"colour", "1", nil, true},
	}
	for _, tt := range tests {
		t.Run(tt.key+"="+tt.value, func(t *testing.T) {
			hw, _ := LookupHardware("h100")
			err := hw.Set(tt.key, tt.value)
			if (err != nil) != tt.wantErr {
				t.Fatalf("Set error %v, wantErr %v", err, tt.wantErr)
			}
			if err == nil && !tt.check(hw) {
				t.Fatalf("Set(%s, %s) left %+v", tt.key, tt.value, hw)
			}
		})
	}
}

func TestDivisors(t *testing.T) {
	got := divisors(12)
	want := []int{1, 2, 3, 4, 6, 12}
	if len(got) != len(want) {
		t.Fatalf("divisors(12) = %v", got)
	}
	for i := range want {
		if got[i] != want[i] {
			t.Fatalf("divisors(12) = %v", got)
		}
	}
	if d := divisors(16); len(d) != 5 || d[2] != 4 {
		t.Fatalf("divisors(16) = %v", d)
	}
}
