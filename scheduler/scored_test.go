package scheduler

import (
	"bytes"
	"strings"
	"testing"
)

// TestScoredOrder: the weights decide the order; SJF's weights give SJF's
// order, a weight on waiting lets an old job pass a shorter new one, and
// a job without an estimate counts as the weights' unknown runtime.
func TestScoredOrder(t *testing.T) {
	jobs := func() []*JobRequest {
		return []*JobRequest{
			{ID: "long-old", GPUs: 8, Estimate: 36000, Submit: 0},
			{ID: "short-new", GPUs: 8, Estimate: 600, Submit: 86000},
			{ID: "unknown", GPUs: 8, Submit: 50000},
			{ID: "wide", GPUs: 64, Estimate: 600, Submit: 86000, Attained: 1e6},
		}
	}
	s := &Snapshot{Now: 86400}
	for _, tc := range []struct {
		name string
		w    ScoreWeights
		want string
	}{
		{"SJF's weights", ScoreWeights{Estimate: 1, Unknown: 3600}, "short-new wide unknown long-old"},
		{"size first", ScoreWeights{GPUs: 10, Estimate: 1, Unknown: 3600}, "short-new unknown long-old wide"},
		{"waiting outweighs length", ScoreWeights{Estimate: 1, Wait: 10, Unknown: 3600}, "long-old unknown short-new wide"},
		{"attained service counts", ScoreWeights{Estimate: 1, Attained: 1, Unknown: 3600}, "short-new unknown long-old wide"},
		{"unknown as long", ScoreWeights{Estimate: 1, Unknown: 1e6}, "short-new wide long-old unknown"},
	} {
		p := jobs()
		Scored{Weights: tc.w}.Order(s, p)
		var got []string
		for _, r := range p {
			got = append(got, r.ID)
		}
		if strings.Join(got, " ") != tc.want {
			t.Errorf("%s: order %v, want %s", tc.name, got, tc.want)
		}
	}
}

func TestWeightsFile(t *testing.T) {
	var b bytes.Buffer
	w := ScoreWeights{GPUs: 0.5, Estimate: 3, Attained: -0.5, Wait: 0.2, Unknown: 4000}
	if err := WriteWeights(&b, w); err != nil {
		t.Fatal(err)
	}
	got, err := ReadWeights(&b)
	w.Version = ScoreWeightsVersion
	if err != nil || got != w {
		t.Fatalf("read back %+v (%v), want %+v", got, err, w)
	}
	for _, tc := range []struct{ file, want string }{
		{`{"version": 2}`, "format version 2"},
		{`{"version": 1, "gpus": 1e9}`, "gpus weight 1e+09"},
		{`{"version": 1, "unknown_estimate_seconds": -1}`, "unknown_estimate_seconds -1"},
		{`{"version": 1, "colour": 1}`, `unknown field "colour"`},
		{`{"version":`, "unexpected EOF"},
	} {
		if _, err := ReadWeights(strings.NewReader(tc.file)); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("ReadWeights(%s): %v, want %q", tc.file, err, tc.want)
		}
	}
}

func FuzzReadWeights(f *testing.F) {
	var b bytes.Buffer
	WriteWeights(&b, ScoreWeights{GPUs: 0.5, Estimate: 3, Unknown: 4000})
	f.Add(b.Bytes())
	f.Fuzz(func(t *testing.T, data []byte) {
		w, err := ReadWeights(bytes.NewReader(data))
		if err != nil {
			return
		}
		// Weights that read give every job a finite score.
		p := Scored{Weights: w}
		for _, r := range []*JobRequest{{GPUs: 1}, {GPUs: 1 << 20, Estimate: 1 << 40, Attained: 1e18, Submit: -1 << 40}} {
			if sc := p.Score(1<<40, r); sc != sc || sc > 1e300 || sc < -1e300 {
				t.Fatalf("score %v for %+v with %+v", sc, r, w)
			}
		}
	})
}
