package stall

import (
	"fmt"
	"slices"
	"testing"
	"time"
)

// done is a communicator whose rank completed allreduce seq and sits
// between calls.
func done(handle, seq uint64) Comm {
	return Comm{Handle: handle, Done: seq, DoneOp: "allreduce"}
}

// inside is a communicator whose rank completed seq and is inside seq+1.
func inside(handle, seq uint64) Comm {
	c := done(handle, seq)
	c.In = &Call{Op: "allreduce", Seq: seq + 1}
	return c
}

func rk(rank int32, node string, pid uint32, state string, cpu float64, comms ...Comm) Rank {
	return Rank{Rank: rank, Node: node, Pid: pid, ProcState: state, CPU: cpu, Comms: comms}
}

// ring4 is a 2-node × 2-rank job: rank 2 at c2, the others at c.
func ring4(cpu float64, st2 string, c, c2 Comm) []Rank { return ringCPU(cpu, 1, st2, c, c2) }

// ringCPU is ring4 with rank 2's CPU seconds cpu2.
func ringCPU(cpu, cpu2 float64, st2 string, c, c2 Comm) []Rank {
	return []Rank{
		rk(0, "node-00", 100, "S", cpu, c), rk(1, "node-00", 101, "S", cpu, c),
		rk(2, "node-01", 4242, st2, cpu2, c2), rk(3, "node-01", 4243, "S", cpu, c),
	}
}

// lagCPU is rank 2 (state st) after allreduce 41 while the others wait in
// 42, seen at 0 and at each time in at (ms) with rank 2's CPU seconds
// cpu[i] there.
func lagCPU(st string, at []int, cpu []float64) []stallStep {
	steps := []stallStep{{0, ring4(1, st, inside(0xa0, 41), done(0xc0, 41)), false}}
	for i, ms := range at {
		steps = append(steps, stallStep{time.Duration(ms) * time.Millisecond, ringCPU(1, cpu[i], st, inside(0xa0, 41), done(0xc0, 41)), false})
	}
	return steps
}

// held is the ranks seen unchanged at 0 and at d.
func held(d time.Duration, ranks ...Rank) []stallStep {
	return []stallStep{{0, ranks, false}, {d, ranks, false}}
}

type stallStep struct {
	at    time.Duration
	ranks []Rank
	// gone: the job is no longer running.
	gone bool
}

func TestStallDetector(t *testing.T) {
	healthy := func(k uint64) []Rank {
		// A fast rank already inside the next allreduce, the rest done.
		return []Rank{rk(0, "node-00", 100, "R", float64(k), inside(0xa0, k)), rk(1, "node-00", 101, "R", float64(k), done(0xb0, k)),
			rk(2, "node-01", 200, "R", float64(k), done(0xc0, k)), rk(3, "node-01", 201, "R", float64(k), inside(0xd0, k))}
	}
	cases := []struct {
		name      string
		threshold time.Duration
		steps     []stallStep
		// changes are "STEP:declared" or "STEP:cleared: WHY".
		changes []string
		// lagging and waiting of the stall listed after the last step.
		lagging, waiting []int32
		diagnosis        string
		comm             uint64
	}{
		{
			name: "stopped rank in compute", threshold: 3 * time.Second,
			steps: []stallStep{
				{0, ring4(1, "T", inside(0xa0, 41), done(0xc0, 41)), false},
				{time.Second, ring4(1, "T", inside(0xa0, 41), done(0xc0, 41)), false},
				{3100 * time.Millisecond, ring4(1, "T", inside(0xa0, 41), done(0xc0, 41)), false},
				{4 * time.Second, ring4(1, "T", inside(0xa0, 41), done(0xc0, 41)), false},
			},
			changes: []string{"2:declared"}, lagging: []int32{2}, waiting: []int32{0, 1, 3}, comm: 0xa0,
			diagnosis: "rank 2 (node-01 pid 4242) is stopped (SIGSTOP?) after allreduce seq 41; ranks 0,1,3 wait in allreduce seq 42 for 4s",
		},
		{
			name: "threshold not yet passed", threshold: 3 * time.Second,
			steps: []stallStep{
				{0, ring4(1, "T", inside(0xa0, 41), done(0xc0, 41)), false},
				{2900 * time.Millisecond, ring4(1, "T", inside(0xa0, 41), done(0xc0, 41)), false},
			},
		},
		{
			name: "all healthy", threshold: time.Second,
			steps: []stallStep{
				{0, healthy(1), false}, {600 * time.Millisecond, healthy(2), false}, {1200 * time.Millisecond, healthy(3), false},
				{1800 * time.Millisecond, healthy(4), false}, {2400 * time.Millisecond, healthy(5), false},
			},
		},
		{
			name: "all between calls is not a stall", threshold: time.Second,
			steps: []stallStep{
				{0, ring4(1, "T", done(0xa0, 7), done(0xc0, 7)), false},
				{5 * time.Second, ring4(1, "T", done(0xa0, 7), done(0xc0, 7)), false},
			},
		},
		{
			name: "stopped rank inside the call", threshold: 2 * time.Second,
			steps: []stallStep{
				{0, ring4(1, "T", inside(0xa0, 9), inside(0xc0, 9)), false},
				{2500 * time.Millisecond, ring4(1, "T", inside(0xa0, 9), inside(0xc0, 9)), false},
			},
			changes: []string{"1:declared"}, lagging: []int32{2}, waiting: []int32{0, 1, 3}, comm: 0xa0,
			diagnosis: "rank 2 (node-01 pid 4242) is stopped (SIGSTOP?) inside allreduce seq 10; ranks 0,1,3 wait in allreduce seq 10 for 2.5s",
		},
		{
			name: "idle rank inside the call while the others spin", threshold: 2 * time.Second,
			steps: []stallStep{
				{0, ring4(1, "S", inside(0xa0, 9), inside(0xc0, 9)), false},
				{time.Second, ring4(2, "S", inside(0xa0, 9), inside(0xc0, 9)), false},
				{2500 * time.Millisecond, ring4(3, "S", inside(0xa0, 9), inside(0xc0, 9)), false},
			},
			changes: []string{"2:declared"}, lagging: []int32{2}, waiting: []int32{0, 1, 3}, comm: 0xa0,
			diagnosis: "rank 2 (node-01 pid 4242) is hung (no CPU progress) inside allreduce seq 10; ranks 0,1,3 wait in allreduce seq 10 for 2.5s",
		},
		{
			// Nodes report CPU time each second: the first change seen
			// after the stall began is CPU used before it.
			name: "a hung rank's last report of CPU is not progress", threshold: 2 * time.Second,
			steps:   lagCPU("S", []int{1000, 2500}, []float64{1.5, 1.5}),
			changes: []string{"2:declared"}, lagging: []int32{2}, waiting: []int32{0, 1, 3}, comm: 0xa0,
			diagnosis: "rank 2 (node-01 pid 4242) is hung (no CPU progress) after allreduce seq 41; ranks 0,1,3 wait in allreduce seq 42 for 2.5s",
		},
		{
			// The reports of the samples before and after it stopped both
			// arrive after the stall began.
			name: "two early reports of CPU are not progress", threshold: 2 * time.Second,
			steps:   lagCPU("S", []int{250, 1250, 2500}, []float64{1.2, 1.4, 1.4}),
			changes: []string{"3:declared"}, lagging: []int32{2}, waiting: []int32{0, 1, 3}, comm: 0xa0,
			diagnosis: "rank 2 (node-01 pid 4242) is hung (no CPU progress) after allreduce seq 41; ranks 0,1,3 wait in allreduce seq 42 for 2.5s",
		},
		{
			// Stalled between steps, it finishes the step's bookkeeping
			// and then polls its hang: a tick of CPU a report, not work.
			name: "a few ticks of CPU after the stall are not progress", threshold: 2 * time.Second,
			steps:   lagCPU("S", []int{500, 1000, 1600, 2500}, []float64{1.51, 1.52, 1.53, 1.54}),
			changes: []string{"4:declared"}, lagging: []int32{2}, waiting: []int32{0, 1, 3}, comm: 0xa0,
			diagnosis: "rank 2 (node-01 pid 4242) is hung (no CPU progress) after allreduce seq 41; ranks 0,1,3 wait in allreduce seq 42 for 2.5s",
		},
		{
			name: "a lagging rank using CPU is busy", threshold: 2 * time.Second,
			steps:   lagCPU("R", []int{1000, 2500}, []float64{2, 3}),
			changes: []string{"2:declared"}, lagging: []int32{2}, waiting: []int32{0, 1, 3}, comm: 0xa0,
			diagnosis: "rank 2 (node-01 pid 4242) is busy outside NCCL after allreduce seq 41; ranks 0,1,3 wait in allreduce seq 42 for 2.5s",
		},
		{
			name: "all inside and none stopped blames the network", threshold: 2 * time.Second,
			steps: []stallStep{
				{0, ring4(1, "S", inside(0xa0, 9), inside(0xc0, 9)), false},
				{2500 * time.Millisecond, ring4(1, "S", inside(0xa0, 9), inside(0xc0, 9)), false},
			},
			changes: []string{"1:declared"}, waiting: []int32{0, 1, 2, 3}, comm: 0xa0,
			diagnosis: "all 4 ranks wait in allreduce seq 10 for 2.5s and none is stopped or idle: suspect the network between them or a hung GPU",
		},
		{
			// Ranks 0 and 1 finished the all-reduce; rank 3 still waits in
			// it for the chunk the stopped rank 2 holds.
			name: "a rank waiting in the ring with a stopped one is waiting", threshold: time.Second,
			steps: held(1500*time.Millisecond, rk(0, "node-00", 100, "S", 1, done(0xa0, 10)), rk(1, "node-00", 101, "S", 1, done(0xb0, 10)),
				rk(2, "node-01", 4242, "T", 1, inside(0xc0, 9)), rk(3, "node-01", 4243, "S", 1, inside(0xd0, 9))),
			changes: []string{"1:declared"}, lagging: []int32{2}, waiting: []int32{0, 1, 3}, comm: 0xa0,
			diagnosis: "rank 2 (node-01 pid 4242) is stopped (SIGSTOP?) inside allreduce seq 10; ranks 0,1 are past allreduce seq 10; " +
				"rank 3 waits in allreduce seq 10 for 1.5s",
		},
		{
			// Rank 3 finished allreduce 10 on the data communicator with
			// rank 2, then blocked in the control one, which the stopped
			// rank 2 never entered.
			name: "a rank blocked on another communicator by a stopped one is waiting", threshold: time.Second,
			steps: held(1500*time.Millisecond, rk(0, "node-00", 100, "S", 1, inside(0xa0, 10), done(0xa1, 10)), rk(1, "node-00", 101, "S", 1, inside(0xb0, 10), done(0xb1, 10)),
				rk(2, "node-01", 4242, "T", 1, done(0xc0, 10), done(0xc1, 9)), rk(3, "node-01", 4243, "S", 1, done(0xd0, 10), inside(0xd1, 9))),
			// Both communicators stall; the data one lists first.
			changes: []string{"1:declared", "1:declared"}, lagging: []int32{2}, waiting: []int32{0, 1, 3}, comm: 0xa0,
			diagnosis: "rank 2 (node-01 pid 4242) is stopped (SIGSTOP?) after allreduce seq 10; ranks 0,1 wait in allreduce seq 11; " +
				"rank 3 is past allreduce seq 10 for 1.5s",
		},
		{
			name: "lagging ranks on several nodes", threshold: time.Second,
			steps: held(1500*time.Millisecond, rk(0, "node-00", 10, "R", 1, inside(1, 5)), rk(1, "node-00", 11, "D", 1, done(2, 5)),
				rk(2, "node-01", 20, "R", 1, inside(3, 5)), rk(3, "node-02", 30, "T", 1, done(4, 5))),
			changes: []string{"1:declared"}, lagging: []int32{1, 3}, waiting: []int32{0, 2}, comm: 1,
			diagnosis: "rank 1 (node-00 pid 11) is blocked in the kernel (state D) after allreduce seq 5; " +
				"rank 3 (node-02 pid 30) is stopped (SIGSTOP?) after allreduce seq 5; ranks 0,2 wait in allreduce seq 6 for 1.5s",
		},
		{
			name: "two communicators where only one stalls", threshold: time.Second,
			steps: []stallStep{
				{0, []Rank{
					rk(0, "node-00", 100, "S", 1, done(0xa0, 30), inside(0xa1, 30)), rk(1, "node-00", 101, "S", 1, done(0xb0, 30), inside(0xb1, 30)),
					rk(2, "node-01", 200, "T", 1, done(0xc0, 30), done(0xc1, 30)), rk(3, "node-01", 201, "S", 1, done(0xd0, 30), inside(0xd1, 30))}, false},
				{2 * time.Second, []Rank{
					rk(0, "node-00", 100, "S", 1, done(0xa0, 30), inside(0xa1, 30)), rk(1, "node-00", 101, "S", 1, done(0xb0, 30), inside(0xb1, 30)),
					rk(2, "node-01", 200, "T", 1, done(0xc0, 30), done(0xc1, 30)), rk(3, "node-01", 201, "S", 1, done(0xd0, 30), inside(0xd1, 30))}, false},
			},
			changes: []string{"1:declared"}, lagging: []int32{2}, waiting: []int32{0, 1, 3}, comm: 0xa1,
			diagnosis: "rank 2 (node-01 pid 200) is stopped (SIGSTOP?) after allreduce seq 30; ranks 0,1,3 wait in allreduce seq 31 for 2s",
		},
		{
			name: "progress clears the stall", threshold: time.Second,
			steps: []stallStep{
				{0, ring4(1, "T", inside(0xa0, 41), done(0xc0, 41)), false},
				{1500 * time.Millisecond, ring4(1, "T", inside(0xa0, 41), done(0xc0, 41)), false},
				// SIGCONT: rank 2 enters the allreduce the others wait in.
				{1750 * time.Millisecond, ring4(1, "R", inside(0xa0, 41), inside(0xc0, 41)), false},
				{2 * time.Second, ring4(1, "R", done(0xa0, 42), done(0xc0, 42)), false},
			},
			changes: []string{"1:declared", "2:cleared: the ranks progress again"},
		},
		{
			name: "the job ending clears the stall", threshold: time.Second,
			steps: []stallStep{
				{0, ring4(1, "T", inside(0xa0, 41), done(0xc0, 41)), false},
				{1500 * time.Millisecond, ring4(1, "T", inside(0xa0, 41), done(0xc0, 41)), false},
				{2 * time.Second, nil, true},
			},
			changes: []string{"1:declared", "2:cleared: the job is no longer running"},
		},
		{
			name: "a lone rank cannot disagree", threshold: time.Second,
			steps: []stallStep{
				{0, []Rank{rk(0, "node-00", 1, "T", 1, inside(1, 3))}, false},
				{5 * time.Second, []Rank{rk(0, "node-00", 1, "T", 1, inside(1, 3))}, false},
			},
		},
	}
	t0 := time.Unix(1_800_000_000, 0)
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			// The table's passes come at any time: no pause is credited.
			r := DefaultRule
			r.Pass = 0
			d := NewRule(r)
			var got []string
			var last *Stall
			for i, st := range tc.steps {
				var jobs []Job
				if !st.gone {
					jobs = []Job{{ID: "j-1", Threshold: tc.threshold, Ranks: st.ranks}}
				}
				for _, ch := range d.Update(t0.Add(st.at), jobs) {
					if ch.Cleared {
						got = append(got, fmt.Sprintf("%d:cleared: %s", i, ch.Why))
					} else {
						got = append(got, fmt.Sprintf("%d:declared", i))
					}
				}
				if l := d.Declared(""); len(l) > 0 {
					last = &l[0]
				} else {
					last = nil
				}
			}
			if !slices.Equal(got, tc.changes) {
				t.Fatalf("changes %q, want %q", got, tc.changes)
			}
			if tc.diagnosis == "" {
				return
			}
			if last == nil {
				t.Fatal("no stall listed after the last step")
			}
			if last.Diagnosis != tc.diagnosis {
				t.Errorf("diagnosis\n got %q\nwant %q", last.Diagnosis, tc.diagnosis)
			}
			ranks := func(rs []StalledRank) []int32 {
				out := []int32{}
				for _, r := range rs {
					out = append(out, r.Rank)
				}
				return out
			}
			if got := ranks(last.Lagging); !slices.Equal(got, append([]int32{}, tc.lagging...)) {
				t.Errorf("lagging %v, want %v", got, tc.lagging)
			}
			if got := ranks(last.Waiting); !slices.Equal(got, tc.waiting) {
				t.Errorf("waiting %v, want %v", got, tc.waiting)
			}
			if last.Handle != tc.comm || last.Job != "j-1" || last.Threshold != tc.threshold || !last.Since.Equal(t0) {
				t.Errorf("stall %v", last)
			}
		})
	}
}

// TestServerPauseIsCredited: a pass 5 s late means the server stood still;
// the ranks it saw disagree before are not a stall for that, only once they
// stay so for the limit in passes that came on time.
func TestServerPauseIsCredited(t *testing.T) {
	t0 := time.Unix(1_800_000_000, 0)
	ranks := ring4(1, "T", inside(0xa0, 41), done(0xc0, 41))
	d := New()
	var declared time.Duration
	for _, at := range []time.Duration{0, 250 * time.Millisecond, 5250 * time.Millisecond, 5500 * time.Millisecond, 6 * time.Second,
		6500 * time.Millisecond, 7 * time.Second, 7500 * time.Millisecond, 8 * time.Second} {
		if ch := d.Update(t0.Add(at), []Job{{ID: "j-1", Attempt: 1, Threshold: 2 * time.Second, Ranks: ranks}}); len(ch) > 0 && declared == 0 {
			declared = at
		}
	}
	if declared != 7*time.Second {
		t.Errorf("declared at %s, want 7s: 2s of passes on time after the 4.75s pause", declared)
	}
}
