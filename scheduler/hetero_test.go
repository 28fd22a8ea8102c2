package scheduler

import (
	"errors"
	"fmt"
	"strings"
	"testing"
)

// typedCluster is one node of 8 GPUs per model given, named after it.
func typedCluster(models ...string) *Snapshot {
	s := &Snapshot{Now: 1000}
	for i, m := range models {
		n := Node{Name: fmt.Sprintf("%s-%d", m, i), GPUModel: m, Labels: map[string]string{}}
		for g := range 8 {
			n.GPUs = append(n.GPUs, GPU{Index: g, Healthy: true})
		}
		s.Nodes = append(s.Nodes, n)
	}
	return s
}

// twoTypes is a job of gpus GPUs allowing h100 (speedup× its a100 rate)
// and a100, with the plan of each (tp 8 on h100, tp 4 on a100).
func twoTypes(id string, submit int64, gpus int, speedup float64) JobRequest {
	return JobRequest{ID: id, Submit: submit, Types: []TypeOption{
		{Model: "h100", Shape: Shape{TP: min(gpus, 8), PP: 1, DP: gpus / min(gpus, 8)}, Rate: speedup},
		{Model: "a100", Shape: Shape{TP: min(gpus, 4), PP: 1, DP: gpus / min(gpus, 4)}, Rate: 1},
	}}
}

func startedOn(r JobRequest, model string, reshardable bool) JobRequest {
	r.StartedOn, r.Reshardable = model, reshardable
	return r
}

func startsOf(ds []Decision) map[string]Start {
	out := map[string]Start{}
	for _, d := range ds {
		if s, ok := d.(Start); ok {
			out[s.Job] = s
		}
	}
	return out
}

func TestHeteroAllocation(t *testing.T) {
	for _, tc := range []struct {
		name    string
		models  []string
		pending []JobRequest
		policy  Policy
		want    map[string]string // job → model it starts on
		reason  map[string]string
		shape   map[string]Shape
	}{{
		name:    "type-agnostic: the first job in the queue takes the h100",
		models:  []string{"h100", "a100"},
		pending: []JobRequest{twoTypes("small-gain", 1, 8, 1.2), twoTypes("big-gain", 2, 8, 2)},
		policy:  FIFO{},
		want:    map[string]string{"small-gain": "h100", "big-gain": "a100"},
		reason:  map[string]string{"small-gain": "h100: best placement; type-agnostic"},
	}, {
		name:    "max-throughput: the h100 goes to the job it speeds up most",
		models:  []string{"h100", "a100"},
		pending: []JobRequest{twoTypes("small-gain", 1, 8, 1.2), twoTypes("big-gain", 2, 8, 2)},
		policy:  WithHetero(FIFO{}, MaxThroughput),
		want:    map[string]string{"small-gain": "a100", "big-gain": "h100"},
		reason: map[string]string{
			"big-gain":   "h100: 2.00× its a100 throughput; max-throughput",
			"small-gain": "a100: 0.83× its h100 throughput; max-throughput, its faster type is worth more to other jobs",
		},
		shape: map[string]Shape{"big-gain": {TP: 8, PP: 1, DP: 1}, "small-gain": {TP: 4, PP: 1, DP: 2}},
	}, {
		// a gains 1.5× on 8 GPUs, b 2× on 4: the GPU-weighted sum is
		// larger with a on the h100s (8+4·0.5 against 4+8·0.67), the
		// smallest normalised throughput larger with b there (0.67 > 0.5).
		name:    "max-throughput weighs GPUs",
		models:  []string{"h100", "a100", "a100"},
		pending: []JobRequest{twoTypes("a", 1, 8, 1.5), twoTypes("b", 2, 4, 2)},
		policy:  WithHetero(FIFO{}, MaxThroughput),
		want:    map[string]string{"a": "h100", "b": "a100"},
	}, {
		name:    "max-min-fair spares the job the slow type hurts most",
		models:  []string{"h100", "a100", "a100"},
		pending: []JobRequest{twoTypes("a", 1, 8, 1.5), twoTypes("b", 2, 4, 2)},
		policy:  WithHetero(FIFO{}, MaxMinFair),
		want:    map[string]string{"a": "a100", "b": "h100"},
	}, {
		name:    "a job that cannot reshard restarts on the model it started on",
		models:  []string{"h100"},
		pending: []JobRequest{startedOn(twoTypes("pinned", 1, 8, 2), "a100", false)},
		policy:  WithHetero(FIFO{}, MaxThroughput),
		want:    map[string]string{},
	}, {
		name:    "a reshardable job moves to the free type",
		models:  []string{"h100"},
		pending: []JobRequest{startedOn(twoTypes("moves", 1, 8, 2), "a100", true)},
		policy:  WithHetero(FIFO{}, MaxThroughput),
		want:    map[string]string{"moves": "h100"},
	}, {
		name:    "a pinned job on its model says why",
		models:  []string{"a100"},
		pending: []JobRequest{startedOn(twoTypes("pinned", 1, 8, 2), "a100", false)},
		policy:  WithHetero(FIFO{}, MaxThroughput),
		want:    map[string]string{"pinned": "a100"},
		reason:  map[string]string{"pinned": "a100: the model it started on (its checkpoint cannot be resharded)"},
	}, {
		name:    "the allocated type is full: the job falls back to the other",
		models:  []string{"a100"},
		pending: []JobRequest{twoTypes("j", 1, 8, 2)},
		policy:  WithHetero(FIFO{}, MaxThroughput),
		want:    map[string]string{"j": "a100"},
		reason:  map[string]string{"j": "a100: 0.50× its h100 throughput; max-throughput, no h100 free"},
	}, {
		name:    "jobs bound to one model keep it and take its GPUs first",
		models:  []string{"h100", "a100"},
		pending: []JobRequest{{ID: "fixed", Submit: 1, GPUs: 8, GPUModel: "h100"}, twoTypes("flex", 2, 8, 2)},
		policy:  WithHetero(FIFO{}, MaxThroughput),
		want:    map[string]string{"fixed": "", "flex": "a100"},
	}} {
		t.Run(tc.name, func(t *testing.T) {
			s := typedCluster(tc.models...)
			s.Pending = tc.pending
			ds := Schedule(s, tc.policy)
			got := startsOf(ds)
			if len(got) != len(tc.want) {
				t.Fatalf("started %v, want %v", got, tc.want)
			}
			for job, model := range tc.want {
				st, ok := got[job]
				if !ok {
					t.Fatalf("%s did not start: %v", job, ds)
				}
				if st.Placement.Model != model {
					t.Errorf("%s on %q, want %q", job, st.Placement.Model, model)
				}
				for _, sl := range st.Placement.Ranks {
					if n := s.Nodes[nodeIndex(s, sl.Node)]; model != "" && n.GPUModel != model {
						t.Errorf("%s: rank on %s (%s), want %s", job, sl.Node, n.GPUModel, model)
					}
				}
				if want, ok := tc.reason[job]; ok && st.TypeReason != want {
					t.Errorf("%s: reason %q, want %q", job, st.TypeReason, want)
				}
				if want, ok := tc.shape[job]; ok && st.Placement.Shape != want {
					t.Errorf("%s: shape %s, want %s", job, st.Placement.Shape, want)
				}
			}
		})
	}
}

func nodeIndex(s *Snapshot, name string) int {
	for i := range s.Nodes {
		if s.Nodes[i].Name == name {
			return i
		}
	}
	return -1
}

func TestHeteroValidate(t *testing.T) {
	base := twoTypes("j", 1, 8, 2)
	for _, tc := range []struct {
		name string
		edit func(r *JobRequest)
		want string
	}{
		{"with a gpu model", func(r *JobRequest) { r.GPUModel = "h100" }, "gpu model h100 and a list of types"},
		{"with allow mixed", func(r *JobRequest) { r.AllowMixed = true }, "allow mixed and a list of types"},
		{"with a shape", func(r *JobRequest) { r.Shape = Shape{1, 1, 8} }, "a shape and a list of types"},
		{"twice", func(r *JobRequest) { r.Types[1].Model = "h100" }, "model h100 listed twice"},
		{"no rate", func(r *JobRequest) { r.Types[1].Rate = 0 }, "throughput 0 on a100"},
		{"gpus differ", func(r *JobRequest) { r.GPUs = 16 }, "gpus 16 does not match"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := base
			r.Types = append([]TypeOption(nil), base.Types...)
			tc.edit(&r)
			err := r.Validate()
			if !errors.Is(err, ErrInvalidRequest) || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("Validate: %v, want %q", err, tc.want)
			}
		})
	}
}

func TestParseObjective(t *testing.T) {
	for _, o := range Objectives {
		if got, err := ParseObjective(string(o)); err != nil || got != o {
			t.Errorf("ParseObjective(%s) = %s, %v", o, got, err)
		}
	}
	if _, err := ParseObjective("fastest"); err == nil || !strings.Contains(err.Error(), "max-throughput or max-min-fair") {
		t.Errorf("ParseObjective(fastest): %v", err)
	}
}
