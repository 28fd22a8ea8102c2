package predict

import (
	"bytes"
	"math"
	"strings"
	"testing"
)

func TestNamePattern(t *testing.T) {
	for _, tc := range []struct{ in, want string }{
		{"bert-large-run17", "bert-large-run#"},
		{"bert-large-run18", "bert-large-run#"},
		{"gpt3-175b-v2-2024", "gpt#-#b-v#-#"},
		{"plain", "plain"},
		{"", ""},
		{"007", "#"},
	} {
		if got := NamePattern(tc.in); got != tc.want {
			t.Errorf("NamePattern(%q) = %q, want %q", tc.in, got, tc.want)
		}
	}
}

// history: alice's bert runs take an hour, her other jobs ten minutes;
// bob's (no name kept) two hours; the research tenant's 8-GPU jobs four
// hours at night.
func history() []Record {
	var rs []Record
	add := func(n int, f Features, runtime int64) {
		for range n {
			rs = append(rs, Record{Features: f, Runtime: runtime})
		}
	}
	add(3, Features{User: "alice", Name: "bert-run1", Tenant: "nlp", GPUs: 8, Hour: 10}, 3600)
	add(3, Features{User: "alice", Name: "sweep7", Tenant: "nlp", GPUs: 8, Hour: 10}, 600)
	add(3, Features{User: "bob", Tenant: "vision", GPUs: 4, Hour: 3}, 7200)
	add(4, Features{Tenant: "research", GPUs: 8, Hour: 2}, 4*3600)
	add(1, Features{GPUs: 64, Hour: 12}, 10)
	return rs
}

func TestPredictBacksOff(t *testing.T) {
	m := Train(history(), 3)
	for _, tc := range []struct {
		name    string
		f       Features
		seconds int64
		basis   string
	}{
		{"same user and name pattern", Features{User: "alice", Name: "bert-run9", Tenant: "nlp", GPUs: 8, Hour: 15}, 3600, "user+name"},
		{"another user's job of the same name pattern", Features{User: "dave", Name: "bert-run4", GPUs: 2, Hour: 1}, 3600, "name"},
		{"same user, a new name: her mean", Features{User: "alice", Name: "new", Tenant: "nlp", GPUs: 8, Hour: 15}, 1470, "user"},
		{"a user with too few jobs: the tenant at that size", Features{User: "carol", Tenant: "research", GPUs: 6, Hour: 14}, 4 * 3600, "tenant+gpus"},
		{"nothing but size and hour", Features{GPUs: 4, Hour: 4}, 7200, "gpus+hour"},
		{"size only (hour unknown)", Features{GPUs: 3, Hour: -1}, 7200, "gpus"},
		{"a size never seen: every job", Features{GPUs: 1000, Hour: -1}, 2776, "all"},
		{"the job's own limit caps it", Features{User: "bob", GPUs: 4, Hour: 3, Limit: 1800}, 1800, "user"},
	} {
		p := m.Predict(tc.f)
		// Geometric means: allow rounding.
		if math.Abs(float64(p.Seconds-tc.seconds)) > float64(tc.seconds)/100 || p.Basis != tc.basis {
			t.Errorf("%s: predicted %d s from %q, want %d s from %q", tc.name, p.Seconds, p.Basis, tc.seconds, tc.basis)
		}
	}
	if got := m.Overall(); got != 2776 {
		t.Errorf("Overall = %d, want the all-jobs geometric mean 2776", got)
	}
	if got := Train(nil, 0).Overall(); got != 0 {
		t.Errorf("Overall with nothing learned = %d, want 0", got)
	}
	if p := (*Model)(nil).Predict(Features{Limit: 900}); p.Seconds != 900 || p.Basis != "limit" {
		t.Errorf("no model, a limit: %+v", p)
	}
	if p := Train(nil, 0).Predict(Features{GPUs: 8}); p.Seconds != 0 || p.Basis != "none" {
		t.Errorf("nothing learned: %+v", p)
	}
}

func TestRemaining(t *testing.T) {
	for _, tc := range []struct{ pred, ran, want int64 }{
		{3600, 0, 3600},
		{3600, 3000, 600},
		{3600, 3590, 60},   // nearly done by the prediction: a minute
		{3600, 3600, 1800}, // reached it: half as long again
		{3600, 7200, 3600}, // past it
		{100, 90, 60},      // never less than a minute
	} {
		if got := Remaining(tc.pred, tc.ran); got != tc.want {
			t.Errorf("Remaining(%d, %d) = %d, want %d", tc.pred, tc.ran, got, tc.want)
		}
	}
}

func TestModelledLimit(t *testing.T) {
	for _, tc := range []struct {
		actual int64
		z      float64
		want   int64
	}{
		{600, 0, 3600},                  // 25 minutes: an hour
		{3600, 0, 4 * 3600},             // 2.5 h: four hours
		{3600, -3, 3600},                // a factor below 1 is 1: never under the runtime
		{20 * 3600, 0, 72 * 3600},       // 50 h
		{200 * 3600, 0, 3 * 168 * 3600}, // 500 h: whole weeks
	} {
		if got := ModelledLimit(tc.actual, tc.z); got != tc.want {
			t.Errorf("ModelledLimit(%d, %v) = %d, want %d", tc.actual, tc.z, got, tc.want)
		}
		if got := ModelledLimit(tc.actual, tc.z); got < tc.actual {
			t.Errorf("ModelledLimit(%d, %v) = %d is below the runtime", tc.actual, tc.z, got)
		}
	}
}

func TestScore(t *testing.T) {
	a := Score([]int64{100, 300, 50, 1000}, []int64{100, 100, 100, 100})
	if a.N != 4 || a.MedianFactor != 2.5 || a.Within2 != 0.5 || a.Under != 0.25 {
		t.Errorf("Score: %+v", a)
	}
	if a := Score(nil, nil); a.N != 0 {
		t.Errorf("empty: %+v", a)
	}
}

func TestModelFileRoundTrip(t *testing.T) {
	m := Train(history(), 3)
	var b bytes.Buffer
	if err := m.Write(&b); err != nil {
		t.Fatal(err)
	}
	back, err := Read(&b)
	if err != nil {
		t.Fatal(err)
	}
	f := Features{User: "alice", Name: "bert-run2", GPUs: 8, Hour: 1}
	if got, want := back.Predict(f), m.Predict(f); got != want {
		t.Errorf("read back predicts %+v, want %+v", got, want)
	}
}

func TestReadRefusesBadModels(t *testing.T) {
	for _, tc := range []struct{ file, want string }{
		{`{"version": 2, "min_support": 3, "groups": {}}`, "format version 2"},
		{`{"version": 1, "min_support": 0, "groups": {}}`, "min_support 0"},
		{`{"version": 1, "min_support": 3, "groups": {"colour:red": {"n": 3, "log_mean": 5}}}`, `group "colour:red" is of no known kind`},
		{`{"version": 1, "min_support": 3, "groups": {"all:*": {"n": 0, "log_mean": 5}}}`, "has 0 jobs"},
		{`{"version": 1, "min_support": 3, "groups": {"all:*": {"n": 3, "log_mean": 99}}}`, "outside 0–30"},
		{`{"version": 1, "min_support": 3, "extra": 1}`, `unknown field "extra"`},
		{`{"version": 1,`, "unexpected EOF"},
	} {
		_, err := Read(strings.NewReader(tc.file))
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("Read(%s): %v, want an error saying %q", tc.file, err, tc.want)
		}
	}
}

func FuzzRead(f *testing.F) {
	var b bytes.Buffer
	Train(history(), 3).Write(&b)
	f.Add(b.Bytes())
	f.Add([]byte(`{"version": 1, "min_support": 1, "groups": {"gpus:8": {"n": 1, "log_mean": 1e308}}}`))
	f.Fuzz(func(t *testing.T, data []byte) {
		m, err := Read(bytes.NewReader(data))
		if err != nil {
			return
		}
		// A model that reads predicts a runtime of at least a second
		// for any job, or none.
		for _, g := range []int{1, 8, 1 << 20} {
			p := m.Predict(Features{GPUs: g, Hour: 5, User: "u", Name: "n1", Tenant: "t"})
			if p.Basis != "none" && p.Seconds < 1 {
				t.Fatalf("predicted %d s from %s", p.Seconds, p.Basis)
			}
		}
	})
}
