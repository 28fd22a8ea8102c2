package scheduler

import (
	"errors"
	"math/rand/v2"
	"slices"
	"strings"
	"testing"
)

func TestPlace(t *testing.T) {
	tests := []struct {
		name    string
		build   func(t *testing.T) *Snapshot
		req     JobRequest
		nodes   []string // expected distinct nodes, in rank order
		score   map[string]float64
		wantErr Reason // a reason the error must count
	}{
		{
			name: "best fit picks the partly used node",
			build: func(t *testing.T) *Snapshot {
				return newCluster(t, 1, 1, 3, 8).run("a", "s0r0n01", gpuRange(0, 4), nil).snap()
			},
			req:   JobRequest{ID: "j", GPUs: 4},
			nodes: []string{"s0r0n01"},
		},
		{
			name:  "tp groups of 8 fill two nodes of one rack",
			build: func(t *testing.T) *Snapshot { return newCluster(t, 2, 2, 4, 8).snap() },
			req:   JobRequest{ID: "j", Shape: Shape{TP: 8, PP: 2, DP: 1}},
			nodes: []string{"s0r0n00", "s0r0n01"},
			score: map[string]float64{"switches": 1, "racks": 1, "nodes": 2},
		},
		{
			name: "two racks of one switch beat one rack on each switch",
			build: func(t *testing.T) *Snapshot {
				b := newCluster(t, 2, 2, 2, 8)
				// Switch 0 has a rack with one free node; switch 1 has two
				// racks with two free nodes each.
				b.run("x", "s0r0n00", gpuRange(0, 8), nil).run("y", "s0r1n00", gpuRange(0, 8), nil).run("z", "s0r1n01", gpuRange(0, 8), nil)
				return b.snap()
			},
			req:   JobRequest{ID: "j", Shape: Shape{TP: 8, PP: 1, DP: 4}},
			nodes: []string{"s1r0n00", "s1r0n01", "s1r1n00", "s1r1n01"},
			score: map[string]float64{"switches": 1, "racks": 2},
		},
		{
			name: "cordoned, draining and down nodes are skipped",
			build: func(t *testing.T) *Snapshot {
				return newCluster(t, 1, 1, 4, 8).state("s0r0n00", NodeCordoned).state("s0r0n01", NodeDraining).state("s0r0n02", NodeDown).snap()
			},
			req:   JobRequest{ID: "j", GPUs: 8},
			nodes: []string{"s0r0n03"},
		},
		{
			name: "unhealthy GPUs are never used",
			build: func(t *testing.T) *Snapshot {
				return newCluster(t, 1, 1, 1, 8).unhealthy("s0r0n00", 0, 1).snap()
			},
			req:   JobRequest{ID: "j", GPUs: 6},
			nodes: []string{"s0r0n00"},
		},
		{
			name: "unhealthy GPUs leave too few",
			build: func(t *testing.T) *Snapshot {
				return newCluster(t, 1, 1, 1, 8).unhealthy("s0r0n00", 0).snap()
			},
			req:     JobRequest{ID: "j", Shape: Shape{TP: 8, PP: 1, DP: 1}},
			wantErr: ReasonUnhealthyGPUs,
		},
		{
			name: "model constraint",
			build: func(t *testing.T) *Snapshot {
				return newCluster(t, 1, 1, 2, 8).model("s0r0n01", "A100").snap()
			},
			req:   JobRequest{ID: "j", GPUs: 8, GPUModel: "A100"},
			nodes: []string{"s0r0n01"},
		},
		{
			name: "models never mix unless allowed",
			build: func(t *testing.T) *Snapshot {
				return newCluster(t, 1, 1, 2, 8).model("s0r0n01", "A100").snap()
			},
			req:     JobRequest{ID: "j", GPUs: 16},
			wantErr: ReasonTopology,
		},
		{
			name: "mixed models when allowed",
			build: func(t *testing.T) *Snapshot {
				return newCluster(t, 1, 1, 2, 8).model("s0r0n01", "A100").snap()
			},
			req:   JobRequest{ID: "j", GPUs: 16, AllowMixed: true},
			nodes: []string{"s0r0n00", "s0r0n01"},
		},
		{
			name: "soft preference chooses the low-carbon node",
			build: func(t *testing.T) *Snapshot {
				return newCluster(t, 1, 1, 3, 8).label("s0r0n02", "power", "low-carbon").snap()
			},
			req:   JobRequest{ID: "j", GPUs: 8, Prefer: []Preference{{Key: "power", Value: "low-carbon", Weight: 2}}},
			nodes: []string{"s0r0n02"},
			score: map[string]float64{"preference": 2},
		},
		{
			name: "tp 8 never splits over half-free nodes",
			build: func(t *testing.T) *Snapshot {
				return newCluster(t, 1, 1, 2, 8).run("a", "s0r0n00", gpuRange(0, 4), nil).run("b", "s0r0n01", gpuRange(4, 8), nil).snap()
			},
			req: JobRequest{ID: "j", Shape: Shape{TP: 8, PP: 1, DP: 1}},
			// 8 GPUs are free in total, but no node holds a group of 8.
			wantErr: ReasonAllocated,
		},
		{
			name:  "tp larger than a node",
			build: func(t *testing.T) *Snapshot { return newCluster(t, 1, 1, 2, 8).snap() },
			req:   JobRequest{ID: "j", Shape: Shape{TP: 16, PP: 1, DP: 1}},
			// No node has 16 GPUs.
			wantErr: ReasonNodeTooSmall,
		},
		{
			name:  "elastic dp falls back to a smaller size",
			build: func(t *testing.T) *Snapshot { return newCluster(t, 1, 1, 2, 8).snap() },
			req:   JobRequest{ID: "j", Shape: Shape{TP: 4, PP: 1, DP: 8}, ElasticDP: []int{2, 4}},
			nodes: []string{"s0r0n00", "s0r0n01"},
		},
		{
			name:  "nodes × GPUs per node",
			build: func(t *testing.T) *Snapshot { return newCluster(t, 1, 1, 4, 8).snap() },
			req:   JobRequest{ID: "j", GPUs: 12, GPUsPerNode: 4},
			nodes: []string{"s0r0n00", "s0r0n01", "s0r0n02"},
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			s := tc.build(t)
			p, err := Place(s, &tc.req)
			if tc.wantErr != "" {
				var pe *PlacementError
				if !errors.As(err, &pe) || !errors.Is(err, ErrUnschedulable) {
					t.Fatalf("err = %v, want a PlacementError", err)
				}
				if pe.Counts[tc.wantErr] == 0 {
					t.Fatalf("error counts %v lack %q (%v)", pe.Counts, tc.wantErr, err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			checkInvariants(t, s, &tc.req, p)
			if got := p.Nodes(); !slices.Equal(got, tc.nodes) {
				t.Fatalf("nodes = %v, want %v (score %s)", got, tc.nodes, p.Score)
			}
			for k, v := range tc.score {
				if got, _ := p.Score.Component(k); got != v {
					t.Errorf("score %s = %v, want %v (%s)", k, got, v, p.Score)
				}
			}
		})
	}
}

func TestPlaceErrorCountsPerReason(t *testing.T) {
	s := newCluster(t, 1, 1, 6, 8).
		state("s0r0n00", NodeCordoned).state("s0r0n01", NodeCordoned).state("s0r0n02", NodeDown).
		model("s0r0n03", "A100").
		run("a", "s0r0n04", gpuRange(0, 6), nil).
		snap()
	_, err := Place(s, &JobRequest{ID: "big", Shape: Shape{TP: 4, PP: 1, DP: 4}, GPUModel: "H100"})
	var pe *PlacementError
	if !errors.As(err, &pe) {
		t.Fatalf("err = %v", err)
	}
	want := map[Reason]int{ReasonCordoned: 2, ReasonDown: 1, ReasonGPUModel: 1, ReasonAllocated: 1, ReasonTopology: 1}
	for r, n := range want {
		if pe.Counts[r] != n {
			t.Errorf("count[%s] = %d, want %d", r, pe.Counts[r], n)
		}
	}
	if pe.Passing != 1 || pe.FitGroups != 2 {
		t.Errorf("passing %d fit %d, want 1 and 2", pe.Passing, pe.FitGroups)
	}
	if len(pe.Nodes) != 5 {
		t.Errorf("verdicts = %v, want 5", pe.Nodes)
	}
	if msg := err.Error(); !strings.Contains(msg, "node cordoned: 2") || !strings.Contains(msg, "room for 2 of 4 groups") {
		t.Errorf("message %q does not explain", msg)
	}
}

func TestPlaceInvalid(t *testing.T) {
	s := newCluster(t, 1, 1, 1, 8).snap()
	for _, req := range []JobRequest{
		{ID: "", GPUs: 1},
		{ID: "a", GPUs: 0},
		{ID: "a", GPUs: 4, Shape: Shape{TP: 2, PP: 1, DP: 1}},
		{ID: "a", GPUs: 6, GPUsPerNode: 4},
		{ID: "a", Shape: Shape{TP: 4, PP: 1, DP: 2}, GPUsPerNode: 2},
		{ID: "a", GPUs: 2, ElasticDP: []int{0}},
	} {
		if _, err := Place(s, &req); !errors.Is(err, ErrInvalidRequest) {
			t.Errorf("%+v: err = %v, want ErrInvalidRequest", req, err)
		}
	}
}

// TestExcludedNodes: a job's exclusions (nodes it failed on, or that
// refused it) are filtered like a cordon, for that job alone, and named in
// the explanation.
func TestExcludedNodes(t *testing.T) {
	b := newCluster(t, 1, 1, 2, 8)
	s := b.snap()
	p, err := Place(s, &JobRequest{ID: "j", GPUs: 8, Exclude: []string{"s0r0n00"}})
	if err != nil {
		t.Fatal(err)
	}
	if slices.Contains(p.Nodes(), "s0r0n00") {
		t.Fatalf("placed on the excluded node: %v", p.Nodes())
	}
	_, err = Place(s, &JobRequest{ID: "j", GPUs: 16, Exclude: []string{"s0r0n00"}})
	var pe *PlacementError
	if !errors.As(err, &pe) || pe.Counts[ReasonExcluded] != 1 || !strings.Contains(pe.Explain(&JobRequest{ID: "j", GPUs: 16}), "avoided by the job") {
		t.Fatalf("err = %v, want one node excluded, explained", err)
	}
	if _, err := Place(s, &JobRequest{ID: "k", GPUs: 16}); err != nil {
		t.Fatalf("another job may use the node: %v", err)
	}
}

func TestHotSpares(t *testing.T) {
	b := newCluster(t, 1, 1, 3, 8)
	b.s.Spares = SparesPolicy{Count: 1}
	s := b.snap()
	if _, err := Place(s, &JobRequest{ID: "j", GPUs: 24}); err == nil {
		t.Fatal("placed onto the hot spare")
	} else if pe := (*PlacementError)(nil); !errors.As(err, &pe) || pe.Counts[ReasonHotSpare] != 1 {
		t.Fatalf("err = %v, want one hot spare", err)
	}
	p, err := Place(s, &JobRequest{ID: "j", GPUs: 16})
	if err != nil {
		t.Fatal(err)
	}
	if slices.Contains(p.Nodes(), "s0r0n02") {
		t.Fatalf("used the spare (last in topology order): %v", p.Nodes())
	}
	if _, err := Place(s, &JobRequest{ID: "r", GPUs: 24, UseSpares: true}); err != nil {
		t.Fatalf("recovery may use spares: %v", err)
	}

	b = newCluster(t, 1, 1, 3, 8).label("s0r0n00", "spare", "true")
	b.s.Spares = SparesPolicy{Selector: "spare=true"}
	p, err = Place(b.snap(), &JobRequest{ID: "j", GPUs: 8})
	if err != nil || p.Nodes()[0] == "s0r0n00" {
		t.Fatalf("labelled spare: %v %v", p.Nodes(), err)
	}
}

func TestRankOrderMegatron(t *testing.T) {
	// tp2·pp2·dp2 on nodes of 4: stage 0's data-parallel ring (ranks 0-3)
	// fills the first node, stage 1 the second.
	s := newCluster(t, 1, 1, 2, 4).snap()
	p, err := Place(s, &JobRequest{ID: "j", Shape: Shape{TP: 2, PP: 2, DP: 2}})
	if err != nil {
		t.Fatal(err)
	}
	want := []Slot{{"s0r0n00", 0}, {"s0r0n00", 1}, {"s0r0n00", 2}, {"s0r0n00", 3}, {"s0r0n01", 0}, {"s0r0n01", 1}, {"s0r0n01", 2}, {"s0r0n01", 3}}
	if !slices.Equal(p.Ranks, want) {
		t.Fatalf("ranks = %v, want %v", p.Ranks, want)
	}
}

func TestLaunchEnv(t *testing.T) {
	p := Placement{Job: "j", Shape: Shape{2, 1, 2}, Ranks: []Slot{{"a", 4}, {"a", 5}, {"b", 0}, {"b", 1}}}
	env := LaunchEnv(&p, 29500, func(n string) string { return n + ".cluster" })
	if len(env) != 2 || env[1].Node != "b" || env[1].CUDAVisibleDevices != "0,1" || env[0].CUDAVisibleDevices != "4,5" {
		t.Fatalf("env = %+v", env)
	}
	r := env[1].Ranks[1]
	want := map[string]string{"RANK": "3", "LOCAL_RANK": "1", "WORLD_SIZE": "4", "MASTER_ADDR": "a.cluster", "MASTER_PORT": "29500", "NODE_RANK": "1", "LOCAL_WORLD_SIZE": "2", "CUDA_VISIBLE_DEVICES": "0,1"}
	for k, v := range want {
		if r.Env[k] != v {
			t.Errorf("%s = %q, want %q", k, r.Env[k], v)
		}
	}
	if LaunchEnv(&Placement{}, 1, nil) != nil {
		t.Error("empty placement has no launch")
	}
}

// randomCluster builds a cluster and a request from a seed: random states,
// models, health, allocations and shapes.
func randomCluster(seed uint64) (*Snapshot, JobRequest) {
	rng := rand.New(rand.NewPCG(seed, seed^0x9e3779b97f4a7c15))
	s := &Snapshot{}
	nodes := 1 + rng.IntN(40)
	gpus := []int{4, 8}[rng.IntN(2)]
	for i := 0; i < nodes; i++ {
		n := Node{
			Name:     "n" + string(rune('a'+i%26)) + string(rune('a'+i/26)),
			State:    []NodeState{NodeReady, NodeReady, NodeReady, NodeCordoned, NodeDraining, NodeDown}[rng.IntN(6)],
			Labels:   map[string]string{LabelRack: []string{"r0", "r1", "r2", "r3"}[rng.IntN(4)], LabelSwitch: []string{"s0", "s1"}[rng.IntN(2)]},
			GPUModel: []string{"H100", "H100", "A100"}[rng.IntN(3)],
		}
		if rng.IntN(3) == 0 {
			n.Labels["power"] = "low-carbon"
		}
		for g := 0; g < gpus; g++ {
			gpu := GPU{Index: g, Healthy: rng.IntN(10) > 0}
			if rng.IntN(3) == 0 {
				gpu.Job = "busy"
			}
			n.GPUs = append(n.GPUs, gpu)
		}
		s.Nodes = append(s.Nodes, n)
	}
	if rng.IntN(3) == 0 {
		s.Spares.Count = rng.IntN(3)
	}
	tp := []int{1, 2, 4, 8}[rng.IntN(4)]
	req := JobRequest{ID: "j", Shape: Shape{TP: tp, PP: 1 + rng.IntN(3), DP: 1 + rng.IntN(6)}}
	switch rng.IntN(4) {
	case 0:
		req.GPUModel = "A100"
	case 1:
		req.AllowMixed = true
	}
	if rng.IntN(3) == 0 {
		req.ElasticDP = []int{1 + rng.IntN(3)}
	}
	if rng.IntN(3) == 0 {
		req.Prefer = []Preference{{Key: "power", Value: "low-carbon", Weight: 1}}
	}
	if rng.IntN(5) == 0 && tp <= 4 {
		req.GPUsPerNode = tp * (1 + rng.IntN(2))
		req.Shape = Shape{TP: tp, PP: 1, DP: (req.GPUsPerNode / tp) * (1 + rng.IntN(3))}
		req.ElasticDP = nil
	}
	return s, req
}

// checkPlaceResult checks invariants on success and, on failure, that the
// error explains itself with a verdict for each filtered node.
func checkPlaceResult(t *testing.T, s *Snapshot, req JobRequest) {
	t.Helper()
	p, err := Place(s, &req)
	if err != nil {
		var pe *PlacementError
		if errors.Is(err, ErrInvalidRequest) {
			return
		}
		if !errors.As(err, &pe) {
			t.Fatalf("err %v is neither invalid nor a PlacementError", err)
		}
		total := 0
		for r, c := range pe.Counts {
			if r != ReasonTopology {
				total += c
			}
		}
		if total+pe.Passing != len(s.Nodes) || len(pe.Nodes) != total {
			t.Fatalf("verdicts %d + passing %d != %d nodes", total, pe.Passing, len(s.Nodes))
		}
		return
	}
	checkInvariants(t, s, &req, p)
	st := newState(s)
	for _, sl := range p.Ranks {
		if st.nodes[st.byName[sl.Node]].spare && !req.UseSpares {
			t.Fatalf("placed on hot spare %s", sl.Node)
		}
	}
	// Deterministic: the same snapshot gives the same placement.
	p2, _ := Place(s, &req)
	if !slices.Equal(p.Ranks, p2.Ranks) {
		t.Fatal("placement is not deterministic")
	}
}

func TestPlaceProperties(t *testing.T) {
	for seed := uint64(0); seed < 2000; seed++ {
		s, req := randomCluster(seed)
		checkPlaceResult(t, s, req)
	}
}

func FuzzPlace(f *testing.F) {
	for _, seed := range []uint64{0, 1, 7, 42, 1234, 99999} {
		f.Add(seed)
	}
	f.Fuzz(func(t *testing.T, seed uint64) {
		s, req := randomCluster(seed)
		checkPlaceResult(t, s, req)
	})
}
