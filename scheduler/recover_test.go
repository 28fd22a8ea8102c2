package scheduler

import (
	"slices"
	"strings"
	"testing"
)

// gang records job j running perNode GPUs on each of nodes, rank order
// following the node order, and returns its placement.
func gang(b *clusterBuilder, job string, perNode int, nodes ...string) Placement {
	p := Placement{Job: job, Shape: Shape{TP: 1, PP: 1, DP: perNode * len(nodes)}}
	for _, name := range nodes {
		n := b.node(name)
		for g := 0; g < perNode; g++ {
			n.GPUs[g].Job = job
			p.Ranks = append(p.Ranks, Slot{Node: name, GPU: g})
		}
	}
	return p
}

func TestRecover(t *testing.T) {
	four := []string{"s0r0n00", "s0r0n01", "s0r0n02", "s0r1n00"}
	cases := []struct {
		name string
		// setup changes the cluster after the job is placed on four.
		setup   func(b *clusterBuilder)
		nodes   []string
		gpus    int // GPUs per node; 0 = 2
		policy  RestartPolicy
		elastic []int
		perNode int // GPUsPerNode of the request; 0 = plain data parallel
		fail    Failure
		// restarts so far (max is 3)
		restarts int

		want    RecoveryAction
		moves   []string // healthy nodes whose ranks may change GPU
		added   []string
		removed []string
		dp      int
		reason  string
	}{
		{name: "rank crash on healthy nodes restarts in place", policy: RestartReplace,
			fail: Failure{Kind: FailRankExit}, want: RestartSame, reason: "rank exit on healthy nodes"},
		{name: "policy none gives up", policy: RestartNone,
			fail: Failure{Kind: FailRankExit}, want: GiveUp, reason: "restart_policy is none"},
		{name: "max restarts reached", policy: RestartReplace, restarts: 3,
			fail: Failure{Kind: FailNodeDown, Nodes: []string{"s0r0n01"}}, want: GiveUp, reason: "max_restarts 3 reached"},
		{name: "operator restart ignores max restarts", policy: RestartNone, restarts: 3,
			fail: Failure{Kind: FailManual}, want: RestartSame},
		{name: "node down is replaced by the next free node", policy: RestartReplace,
			setup: func(b *clusterBuilder) { b.state("s0r0n01", NodeDown) },
			fail:  Failure{Kind: FailNodeDown, Nodes: []string{"s0r0n01"}},
			want:  ReplaceNodes, added: []string{"s0r1n01"}, removed: []string{"s0r0n01"}, reason: "failed node s0r0n01 (node down); replacing with s0r1n01"},
		{name: "a crash on a GPU that faulted is a GPU fault", policy: RestartReplace,
			setup: func(b *clusterBuilder) { b.unhealthy("s0r1n00", 1) },
			fail:  Failure{Kind: FailRankExit},
			want:  ReplaceNodes, added: []string{"s0r1n01"}, removed: []string{"s0r1n00"}, reason: "s0r1n00 (GPU 1 unhealthy)"},
		{name: "restart-in-place cannot use a failed node", policy: RestartInPlace,
			setup: func(b *clusterBuilder) { b.unhealthy("s0r1n00", 0) },
			fail:  Failure{Kind: FailGPUFault, Nodes: []string{"s0r1n00"}},
			want:  GiveUp, reason: "restart-in-place needs the same nodes"},
		{name: "no spare left", policy: RestartReplace,
			setup: func(b *clusterBuilder) {
				b.state("s0r1n01", NodeCordoned).state("s0r1n02", NodeDraining).state("s0r0n02", NodeDown)
			},
			fail: Failure{Kind: FailNodeDown, Nodes: []string{"s0r0n02"}},
			want: GiveUp, reason: "no free node can replace it"},
		{name: "shrink to the largest allowed size on the healthy nodes", policy: RestartShrink, elastic: []int{2, 4, 6, 8}, perNode: 2,
			setup: func(b *clusterBuilder) {
				b.state("s0r1n01", NodeCordoned).state("s0r1n02", NodeCordoned).state("s0r0n00", NodeDown)
			},
			fail: Failure{Kind: FailNodeDown, Nodes: []string{"s0r0n00"}},
			want: ShrinkDP, dp: 6, removed: []string{"s0r0n00"}, reason: "shrinking data parallelism 8 → 6"},
		{name: "shrink prefers a spare at full size", policy: RestartShrink, elastic: []int{4, 8}, perNode: 2,
			setup: func(b *clusterBuilder) { b.state("s0r0n00", NodeDown) },
			fail:  Failure{Kind: FailNodeDown, Nodes: []string{"s0r0n00"}},
			want:  ReplaceNodes, added: []string{"s0r1n01"}, removed: []string{"s0r0n00"}},
		{name: "shrink with nothing that fits gives up", policy: RestartShrink, elastic: []int{8}, perNode: 2,
			setup: func(b *clusterBuilder) {
				b.state("s0r1n01", NodeCordoned).state("s0r1n02", NodeCordoned)
			},
			fail: Failure{Kind: FailNodeDown, Nodes: []string{"s0r0n00"}},
			want: GiveUp, reason: "no allowed data-parallel size [8] fits"},
		{name: "stall excludes the lagging node and the operator's", policy: RestartReplace,
			fail: Failure{Kind: FailStall, Nodes: []string{"s0r0n00"}, Exclude: []string{"s0r1n01"}},
			want: ReplaceNodes, added: []string{"s0r1n02"}, removed: []string{"s0r0n00"}, reason: "failed node s0r0n00 (stall)"},
		{name: "same rack first", policy: RestartReplace, nodes: []string{"s0r0n00", "s0r1n00", "s0r1n01"},
			setup: func(b *clusterBuilder) { b.state("s0r1n00", NodeDown) },
			fail:  Failure{Kind: FailNodeDown, Nodes: []string{"s0r1n00"}},
			want:  ReplaceNodes, added: []string{"s0r1n02"}, removed: []string{"s0r1n00"}},
		{name: "no one-for-one swap: re-place the gang", policy: RestartReplace,
			setup: func(b *clusterBuilder) {
				b.node("s0r1n01").GPUs[0].Job = "other"
				b.node("s0r1n02").GPUs[0].Job = "other"
				b.state("s0r0n01", NodeDown)
			},
			fail: Failure{Kind: FailNodeDown, Nodes: []string{"s0r0n01"}},
			want: Replan, removed: []string{"s0r0n01"}, added: []string{"s0r1n01", "s0r1n02"}, reason: "no one-for-one swap fits"},
		// Two jobs recovering at once: the other took a GPU this job's
		// surviving rank had just released. The node is not lost for it.
		{name: "a surviving GPU another job took moves the rank on its node", policy: RestartReplace, gpus: 4,
			setup: func(b *clusterBuilder) {
				b.node("s0r0n01").GPUs[0].Job = "other"
				b.state("s0r0n00", NodeDown)
			},
			fail: Failure{Kind: FailNodeDown, Nodes: []string{"s0r0n00"}},
			want: ReplaceNodes, moves: []string{"s0r0n01"}, added: []string{"s0r1n01"}, removed: []string{"s0r0n00"},
			reason: "s0r0n01 GPU 0 taken by other, using GPU 2"},
		{name: "a taken GPU on healthy nodes restarts in place on other GPUs", policy: RestartInPlace, gpus: 4,
			setup: func(b *clusterBuilder) { b.node("s0r1n00").GPUs[1].Job = "other" },
			fail:  Failure{Kind: FailRankExit},
			want:  RestartSame, moves: []string{"s0r1n00"}, reason: "s0r1n00 GPU 1 taken by other, using GPU 2"},
		{name: "a taken GPU with no free one left on its node fails the node", policy: RestartReplace,
			setup: func(b *clusterBuilder) { b.node("s0r0n02").GPUs[1].Job = "other" },
			fail:  Failure{Kind: FailRankExit},
			want:  ReplaceNodes, added: []string{"s0r1n01"}, removed: []string{"s0r0n02"},
			reason: "s0r0n02 (GPU 1 taken by other and 0 free GPUs left for 1 ranks)"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			gpus := c.gpus
			if gpus == 0 {
				gpus = 2
			}
			b := newCluster(t, 1, 2, 3, gpus)
			nodes := c.nodes
			if nodes == nil {
				nodes = four
			}
			old := gang(b, "j", 2, nodes...)
			if c.setup != nil {
				c.setup(b)
			}
			req := JobRequest{ID: "j", Shape: old.Shape, GPUsPerNode: c.perNode, ElasticDP: c.elastic}
			got := Recover(b.snap(), &RecoverRequest{Job: req, Placement: old, Policy: c.policy,
				Restarts: c.restarts, MaxRestarts: 3, Failure: c.fail})
			if got.Action != c.want {
				t.Fatalf("action %s (%s), want %s", got.Action, got.Reason, c.want)
			}
			if c.reason != "" && !strings.Contains(got.Reason, c.reason) {
				t.Errorf("reason %q does not say %q", got.Reason, c.reason)
			}
			if got.Action == GiveUp {
				if len(got.Placement.Ranks) != 0 {
					t.Errorf("gave up with a placement %v", got.Placement.Ranks)
				}
				return
			}
			if !slices.Equal(got.Added, c.added) || !slices.Equal(got.Removed, c.removed) {
				t.Errorf("added %v removed %v, want %v %v", got.Added, got.Removed, c.added, c.removed)
			}
			view := recoveryView(b.snap(), "j", nil)
			checkInvariants(t, &view, &req, got.Placement)
			if c.dp != 0 && got.Placement.Shape.DP != c.dp {
				t.Errorf("dp %d, want %d", got.Placement.Shape.DP, c.dp)
			}
			for _, sl := range got.Placement.Ranks {
				if slices.Contains(c.fail.Nodes, sl.Node) || slices.Contains(c.fail.Exclude, sl.Node) {
					t.Errorf("rank placed on failed or excluded node %s", sl.Node)
				}
			}
			for r, sl := range got.Placement.Ranks {
				if slices.Contains(c.moves, sl.Node) && b.node(sl.Node).GPUs[sl.GPU].Job == "other" {
					t.Errorf("rank %d placed on %v, which another job holds", r, sl)
				}
			}
			if got.Action == ReplaceNodes || got.Action == RestartSame {
				// Ranks on nodes that stay keep their GPUs.
				for r, sl := range old.Ranks {
					if !slices.Contains(got.Removed, sl.Node) && !slices.Contains(c.moves, sl.Node) && got.Placement.Ranks[r] != sl {
						t.Errorf("rank %d moved from %v to %v although its node is healthy", r, sl, got.Placement.Ranks[r])
					}
				}
			}
		})
	}
}

func TestRecoversBefore(t *testing.T) {
	cases := []struct {
		name string
		jobs []JobRequest
		want []string
	}{
		{name: "higher priority first", jobs: []JobRequest{{ID: "a", Priority: 0, Submit: 1}, {ID: "b", Priority: 5, Submit: 2}},
			want: []string{"b", "a"}},
		{name: "same priority: earlier submitted first", jobs: []JobRequest{{ID: "a", Submit: 9}, {ID: "b", Submit: 3}, {ID: "c", Submit: 5}},
			want: []string{"b", "c", "a"}},
		{name: "same priority and time: by id", jobs: []JobRequest{{ID: "j-2", Submit: 1}, {ID: "j-1", Submit: 1}},
			want: []string{"j-1", "j-2"}},
		{name: "negative priority last", jobs: []JobRequest{{ID: "low", Priority: -1}, {ID: "mid"}, {ID: "high", Priority: 1, Submit: 99}},
			want: []string{"high", "mid", "low"}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			jobs := slices.Clone(c.jobs)
			slices.SortFunc(jobs, func(a, b JobRequest) int { return RecoversBefore(&a, &b) })
			var got []string
			for _, j := range jobs {
				got = append(got, j.ID)
			}
			if !slices.Equal(got, c.want) {
				t.Errorf("order %v, want %v", got, c.want)
			}
		})
	}
}

// TestRecoverDoesNotTouchSnapshot checks Recover is pure: the snapshot it
// is given comes back unchanged.
func TestRecoverDoesNotTouchSnapshot(t *testing.T) {
	b := newCluster(t, 1, 1, 4, 2)
	old := gang(b, "j", 2, "s0r0n00", "s0r0n01")
	b.state("s0r0n01", NodeDown)
	before := b.snap().Nodes[1].GPUs[0]
	Recover(b.snap(), &RecoverRequest{Job: JobRequest{ID: "j", Shape: old.Shape}, Placement: old, Policy: RestartReplace,
		MaxRestarts: 3, Failure: Failure{Kind: FailNodeDown, Nodes: []string{"s0r0n01"}}})
	if b.snap().Nodes[1].State != NodeDown || b.snap().Nodes[1].GPUs[0] != before || b.snap().Nodes[0].GPUs[0].Job != "j" {
		t.Fatalf("snapshot changed: %+v", b.snap().Nodes[:2])
	}
}

func BenchmarkRecover(b *testing.B) {
	cb := newCluster(&testing.T{}, 4, 4, 16, 8)
	var nodes []string
	for i := 0; i < 128; i++ {
		nodes = append(nodes, cb.s.Nodes[i].Name)
	}
	old := gang(cb, "j", 8, nodes...)
	cb.s.Nodes[5].State = NodeDown
	req := &RecoverRequest{Job: JobRequest{ID: "j", Shape: old.Shape, GPUsPerNode: 8}, Placement: old, Policy: RestartReplace,
		MaxRestarts: 3, Failure: Failure{Kind: FailNodeDown, Nodes: []string{cb.s.Nodes[5].Name}}}
	b.ResetTimer()
	for b.Loop() {
		if r := Recover(cb.snap(), req); r.Action != ReplaceNodes {
			b.Fatal(r.Reason)
		}
	}
	b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "decisions/s")
}
