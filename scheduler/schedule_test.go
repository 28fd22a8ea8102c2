package scheduler

import (
	"errors"
	"slices"
	"strings"
	"testing"
)

func est(e int64) func(*RunningJob) {
	return func(j *RunningJob) { j.Request.Estimate = e }
}

// apply carries out Start decisions on a snapshot, as the control plane would.
func apply(s *Snapshot, ds []Decision) {
	for _, d := range ds {
		st, ok := d.(Start)
		if !ok {
			continue
		}
		i := slices.IndexFunc(s.Pending, func(r JobRequest) bool { return r.ID == st.Job })
		req := s.Pending[i]
		s.Pending = slices.Delete(s.Pending, i, i+1)
		for _, sl := range st.Placement.Ranks {
			for n := range s.Nodes {
				if s.Nodes[n].Name == sl.Node {
					s.Nodes[n].GPUs[sl.GPU].Job = st.Job
				}
			}
		}
		s.Running = append(s.Running, RunningJob{Request: req, Placement: st.Placement, Start: s.Now})
	}
}

func started(ds []Decision) []string {
	var out []string
	for _, d := range ds {
		if s, ok := d.(Start); ok {
			out = append(out, s.Job)
		}
	}
	return out
}

func reservation(ds []Decision) (Reserve, bool) {
	for _, d := range ds {
		if r, ok := d.(Reserve); ok {
			return r, true
		}
	}
	return Reserve{}, false
}

// backfillCluster: n00 busy until 100, n01 busy with no estimate, n02 free,
// n03 half busy with no estimate. The head job A needs 16 GPUs: its shadow
// time is 100 on n00+n02, leaving n03's 4 free GPUs as extra.
func backfillCluster(t *testing.T, pending ...JobRequest) *Snapshot {
	b := newCluster(t, 1, 1, 4, 8).
		run("r0", "s0r0n00", gpuRange(0, 8), est(100)).
		run("r1", "s0r0n01", gpuRange(0, 8), nil).
		run("r3", "s0r0n03", gpuRange(0, 4), nil)
	b.pending(JobRequest{ID: "A", GPUs: 16, Submit: 0, Estimate: 1000, Shape: Shape{TP: 8, PP: 1, DP: 2}})
	b.pending(pending...)
	return b.snap()
}

func TestScheduleFIFOBlocksBehindHead(t *testing.T) {
	s := backfillCluster(t, JobRequest{ID: "B", GPUs: 4, Submit: 1, Estimate: 50})
	ds := Schedule(s, FIFO{})
	if got := started(ds); len(got) != 0 {
		t.Fatalf("fifo started %v past the blocked head", got)
	}
	r, ok := reservation(ds)
	if !ok || r.Job != "A" || !r.Known || r.At != 100 {
		t.Fatalf("reserve = %+v", r)
	}
	if !slices.Equal(r.Placement.Nodes(), []string{"s0r0n00", "s0r0n02"}) {
		t.Fatalf("reserved on %v", r.Placement.Nodes())
	}
}

func TestScheduleEASYBackfill(t *testing.T) {
	tests := []struct {
		name  string
		cand  JobRequest
		start bool
	}{
		{"ends before the shadow time", JobRequest{ID: "B", GPUs: 8, Submit: 1, Estimate: 100}, true},
		{"ends after and needs reserved GPUs", JobRequest{ID: "B", GPUs: 8, Submit: 1, Estimate: 101}, false},
		{"no estimate and needs reserved GPUs", JobRequest{ID: "B", GPUs: 8, Submit: 1}, false},
		{"long but fits in the extra GPUs", JobRequest{ID: "B", GPUs: 4, Submit: 1, Estimate: 10000}, true},
		{"too big for the extra GPUs", JobRequest{ID: "B", GPUs: 5, Submit: 1, Estimate: 10000}, false},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			s := backfillCluster(t, tc.cand)
			ds := Schedule(s, EASY{Base: FIFO{}})
			got := started(ds)
			if (len(got) == 1) != tc.start {
				t.Fatalf("started %v, want start=%v", got, tc.start)
			}
			for _, d := range ds {
				if st, ok := d.(Start); ok && !st.Backfilled {
					t.Fatalf("start %s not marked backfilled", st.Job)
				}
			}
			before, _ := reservation(ds)
			// The head's reservation is never delayed by what was backfilled.
			apply(s, ds)
			after, ok := reservation(Schedule(s, FIFO{}))
			if !ok || after.Job != "A" || after.At != before.At {
				t.Fatalf("head reservation moved from %+v to %+v", before, after)
			}
		})
	}
}

func TestScheduleRejectsInvalid(t *testing.T) {
	s := newCluster(t, 1, 1, 1, 8).pending(JobRequest{ID: "bad", GPUs: 3, Shape: Shape{TP: 2, PP: 1, DP: 1}}, JobRequest{ID: "ok", GPUs: 2}).snap()
	ds := Schedule(s, FIFO{})
	var rej Reject
	for _, d := range ds {
		if r, ok := d.(Reject); ok {
			rej = r
		}
	}
	if rej.Job != "bad" || !errors.Is(rej.Err, ErrInvalidRequest) {
		t.Fatalf("reject = %+v", rej)
	}
	if got := started(ds); !slices.Equal(got, []string{"ok"}) {
		t.Fatalf("started %v", got)
	}
}

func TestPriorityAgingPreventsStarvation(t *testing.T) {
	p := PriorityAging{AgingPerHour: 1}
	order := func(now int64) []string {
		s := &Snapshot{Now: now, Pending: []JobRequest{
			{ID: "old-low", Priority: 0, Submit: 0, GPUs: 1},
			{ID: "new-high", Priority: 5, Submit: now, GPUs: 1},
		}}
		q := []*JobRequest{&s.Pending[0], &s.Pending[1]}
		p.Order(s, q)
		return []string{q[0].ID, q[1].ID}
	}
	if got := order(3 * 3600); got[0] != "new-high" {
		t.Fatalf("after 3h: %v, want the high priority job first", got)
	}
	if got := order(6 * 3600); got[0] != "old-low" {
		t.Fatalf("after 6h: %v, want the aged job first", got)
	}
	// Through Schedule: one free node, the aged job gets it.
	s := newCluster(t, 1, 1, 1, 8).now(6*3600).pending(
		JobRequest{ID: "new-high", Priority: 5, Submit: 6 * 3600, GPUs: 8},
		JobRequest{ID: "old-low", Priority: 0, Submit: 0, GPUs: 8},
	).snap()
	if got := started(Schedule(s, p)); !slices.Equal(got, []string{"old-low"}) {
		t.Fatalf("started %v", got)
	}
}

func TestPreemptCheckpointThenStop(t *testing.T) {
	low := func(j *RunningJob) {
		j.Request.Priority, j.Request.Preemptible, j.Request.Checkpoint = 0, true, true
	}
	tests := []struct {
		name       string
		build      func(b *clusterBuilder)
		victims    []string
		checkpoint bool
	}{
		{"checkpointing victim", func(b *clusterBuilder) { b.run("low", "s0r0n00", gpuRange(0, 8), low) }, []string{"low"}, true},
		{"victim without checkpoints", func(b *clusterBuilder) {
			b.run("low", "s0r0n00", gpuRange(0, 8), func(j *RunningJob) { low(j); j.Request.Checkpoint = false })
		}, []string{"low"}, false},
		{"not preemptible", func(b *clusterBuilder) {
			b.run("low", "s0r0n00", gpuRange(0, 8), func(j *RunningJob) { low(j); j.Request.Preemptible = false })
		}, nil, false},
		{"equal priority", func(b *clusterBuilder) {
			b.run("low", "s0r0n00", gpuRange(0, 8), func(j *RunningJob) { low(j); j.Request.Priority = 5 })
		}, nil, false},
		{"only the youngest of two needed", func(b *clusterBuilder) {
			b.run("older", "s0r0n00", gpuRange(0, 4), func(j *RunningJob) { low(j); j.Start = 10 })
			b.run("younger", "s0r0n00", gpuRange(4, 8), func(j *RunningJob) { low(j); j.Start = 20 })
		}, []string{"younger"}, true},
		{"already stopping", func(b *clusterBuilder) {
			b.run("low", "s0r0n00", gpuRange(0, 8), func(j *RunningJob) { low(j); j.Stopping, j.StopBy = true, 1300 })
		}, nil, false},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			b := newCluster(t, 1, 1, 1, 8).now(1000)
			tc.build(b)
			b.pending(JobRequest{ID: "high", Priority: 5, GPUs: 4, Submit: 900})
			ds := Schedule(b.snap(), DefaultPriority())
			var victims []string
			for _, d := range ds {
				if p, ok := d.(Preempt); ok {
					victims = append(victims, p.Job)
					if p.CheckpointFirst != tc.checkpoint || p.Grace != 300 || p.For != "high" || p.Reason == "" {
						t.Fatalf("preempt = %+v", p)
					}
				}
			}
			if !slices.Equal(victims, tc.victims) {
				t.Fatalf("victims %v, want %v", victims, tc.victims)
			}
			if len(started(ds)) != 0 {
				t.Fatal("started before victims stopped")
			}
			if r, ok := reservation(ds); !ok || r.Job != "high" {
				t.Fatalf("no reservation for the waiting job: %v", ds)
			}
		})
	}
}

func TestFairShareOrder(t *testing.T) {
	b := newCluster(t, 1, 1, 2, 8).run("a-run", "s0r0n00", gpuRange(0, 8), func(j *RunningJob) { j.Request.Tenant = "a" })
	b.pending(
		JobRequest{ID: "a1", Tenant: "a", Submit: 0, GPUs: 4},
		JobRequest{ID: "a2", Tenant: "a", Submit: 1, GPUs: 4},
		JobRequest{ID: "b1", Tenant: "b", Submit: 5, GPUs: 4},
		JobRequest{ID: "b2", Tenant: "b", Submit: 6, GPUs: 4},
		JobRequest{ID: "b3", Tenant: "b", Submit: 7, GPUs: 8},
	)
	s := b.snap()
	order := func() []string {
		var q []*JobRequest
		for i := range s.Pending {
			q = append(q, &s.Pending[i])
		}
		FairShare{}.Order(s, q)
		var ids []string
		for _, r := range q {
			ids = append(ids, r.ID)
		}
		return ids
	}
	// a holds 8 of 16 GPUs: b goes first until its share passes a's.
	if got, want := order(), []string{"b1", "b2", "a1", "b3", "a2"}; !slices.Equal(got, want) {
		t.Fatalf("order %v, want %v", got, want)
	}
	// Weight 4 for a makes its 8 GPUs a share of 1/8: after b's first job
	// (a share of 1/4), a's jobs go before b's others.
	s.Tenants = []Tenant{{Name: "a", Weight: 4}}
	if got, want := order(), []string{"b1", "a1", "a2", "b2", "b3"}; !slices.Equal(got, want) {
		t.Fatalf("weighted order %v, want %v", got, want)
	}
}

func TestSJFAndLASOrder(t *testing.T) {
	s := &Snapshot{Pending: []JobRequest{
		{ID: "unknown", Submit: 0},
		{ID: "long", Submit: 1, Estimate: 5000, Attained: 50000},
		{ID: "short", Submit: 2, Estimate: 100, Attained: 4000},
		{ID: "fresh", Submit: 3, Estimate: 900},
	}}
	ids := func(p Policy) string {
		var q []*JobRequest
		for i := range s.Pending {
			q = append(q, &s.Pending[i])
		}
		p.Order(s, q)
		var out []string
		for _, r := range q {
			out = append(out, r.ID)
		}
		return strings.Join(out, ",")
	}
	if got := ids(SJF{}); got != "short,fresh,long,unknown" {
		t.Errorf("sjf: %s", got)
	}
	if got := ids(DefaultLAS()); got != "unknown,fresh,short,long" {
		t.Errorf("las: %s", got)
	}
}

func TestLASPreemptsHigherQueue(t *testing.T) {
	p := DefaultLAS()
	b := newCluster(t, 1, 1, 1, 8).now(20000).
		run("hog", "s0r0n00", gpuRange(0, 8), func(j *RunningJob) { j.Request.Preemptible, j.Request.Checkpoint, j.Start = true, true, 0 })
	b.pending(JobRequest{ID: "new", GPUs: 8, Submit: 19000})
	ds := Schedule(b.snap(), p)
	if len(ds) == 0 || ds[0].JobID() != "hog" {
		t.Fatalf("decisions %v, want hog preempted", ds)
	}
	// A job that has not yet run MinRun is left alone.
	b.s.Running[0].Start = 19990
	for _, d := range Schedule(b.snap(), p) {
		if _, ok := d.(Preempt); ok {
			t.Fatalf("preempted a job younger than MinRun: %v", d)
		}
	}
}

func TestPolicyByName(t *testing.T) {
	w := &ScoreWeights{Estimate: 1}
	for _, n := range PolicyNames() {
		p, err := PolicyWithWeights(n, w)
		if err != nil || p.Name() != n {
			t.Errorf("%s: %v %v", n, p, err)
		}
	}
	if _, err := PolicyByName("learned+backfill"); err == nil || !strings.Contains(err.Error(), "--policy-weights FILE") {
		t.Errorf("learned without weights: %v", err)
	}
	if _, err := PolicyByName("lottery"); err == nil || !strings.Contains(err.Error(), "fifo") {
		t.Errorf("unknown policy error %v should list the choices", err)
	}
}

func TestAssign(t *testing.T) {
	b := newCluster(t, 1, 1, 3, 8).run("old", "s0r0n00", gpuRange(0, 8), nil)
	s := b.snap()
	p, err := Assign(s, &JobRequest{ID: "j", GPUs: 16}, []string{"s0r0n01", "s0r0n02"})
	if err != nil || !slices.Equal(p.Nodes(), []string{"s0r0n01", "s0r0n02"}) {
		t.Fatalf("assign: %v %v", p.Nodes(), err)
	}
	// The running job may be moved onto its own GPUs' node set.
	if _, err := Assign(s, &JobRequest{ID: "old", GPUs: 8}, []string{"s0r0n00"}); err != nil {
		t.Fatalf("reassign onto own node: %v", err)
	}
	_, err = Assign(s, &JobRequest{ID: "j", GPUs: 8}, []string{"s0r0n00"})
	var pe *PlacementError
	if !errors.As(err, &pe) || pe.Counts[ReasonAllocated] != 1 || pe.Counts[ReasonNotSelected] != 0 || len(pe.Nodes) != 1 {
		t.Fatalf("busy node: %v", err)
	}
	for _, nodes := range [][]string{nil, {"nope", "s0r0n01"}, {"s0r0n01", "s0r0n01"}} {
		if _, err := Assign(s, &JobRequest{ID: "j", GPUs: 8}, nodes); !errors.Is(err, ErrInvalidRequest) {
			t.Errorf("%v: err %v", nodes, err)
		}
	}
}

func TestRebalance(t *testing.T) {
	movable := func(j *RunningJob) { j.Request.Preemptible, j.Request.Checkpoint = true, true }
	// Two half-used nodes: moving one job onto the other's node empties a
	// node and leaves no fragmented one.
	s := newCluster(t, 1, 1, 2, 8).
		run("a", "s0r0n00", gpuRange(0, 4), movable).
		run("b", "s0r0n01", gpuRange(0, 4), movable).snap()
	plan := Rebalance(s, 10)
	if len(plan.Moves) != 1 || plan.Before.FragmentedNodes != 2 || plan.After.FragmentedNodes != 0 {
		t.Fatalf("plan %+v", plan)
	}
	m := plan.Moves[0]
	if len(m.To.Ranks) != 4 || m.After.Cost() >= m.Before.Cost() {
		t.Fatalf("move %+v", m)
	}
	// Already packed: nothing to do.
	s = newCluster(t, 1, 1, 2, 8).run("a", "s0r0n00", gpuRange(0, 8), movable).snap()
	if plan := Rebalance(s, 10); len(plan.Moves) != 0 {
		t.Fatalf("packed cluster got moves %+v", plan.Moves)
	}
	// Jobs that cannot checkpoint are never moved.
	s = newCluster(t, 1, 1, 2, 8).
		run("a", "s0r0n00", gpuRange(0, 4), nil).
		run("b", "s0r0n01", gpuRange(0, 4), nil).snap()
	if plan := Rebalance(s, 10); len(plan.Moves) != 0 {
		t.Fatalf("moved a job without checkpoints: %+v", plan.Moves)
	}
}
