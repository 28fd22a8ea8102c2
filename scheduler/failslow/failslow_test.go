package failslow

import (
	"fmt"
	"math/rand/v2"
	"strings"
	"testing"
)

// run describes a recorded job: 4 ranks on 2 nodes, one step = compute,
// a 4 MiB all-reduce on communicator 0, an 8-byte one on communicator 1,
// as ringtrain does, with jitter, a checkpoint every 50 steps and the
// faults below between their steps.
type run struct {
	steps     int
	computeMS float64
	jitterMS  float64
	// slowRank runs at slowFactor of its speed in [slowFrom, slowTo).
	slowRank           int32
	slowFactor         float64
	slowFrom, slowTo   int
	linkNode           string
	linkFactor         float64
	linkFrom, linkTo   int
	shift              float64 // every rank's compute × shift
	shiftFrom, shiftTo int
	warmup             int // the first steps take 3× as long
	gpuEvidence        bool
}

const ranks = 4

func node(r int32) string { return fmt.Sprintf("node-%02d", r/2) }

type event struct {
	step    int
	change  Change
	cleared bool
}

// replay feeds the run's calls to an analyzer, judging every other step
// (a pass every ~250 ms), and returns the changes with the step they came at.
func replay(t *testing.T, r run) ([]event, *Analyzer) {
	t.Helper()
	a := New(Config{})
	rng := rand.New(rand.NewPCG(1, 2))
	now := int64(1_700_000_000_000_000_000)
	ms := func(v float64) int64 { return int64(v * 1e6) }
	var evs []event
	for s := 1; s <= r.steps; s++ {
		enter := make([]int64, ranks)
		last := int64(0)
		for rk := range int32(ranks) {
			c := r.computeMS
			if s <= r.warmup {
				c *= 3
			}
			if s%50 == 0 {
				c += 250 // a checkpoint
			}
			if r.shift > 0 && s >= r.shiftFrom && s < r.shiftTo {
				c *= r.shift
			}
			if rk == r.slowRank && r.slowFactor > 0 && s >= r.slowFrom && s < r.slowTo {
				c /= r.slowFactor
			}
			enter[rk] = now + ms(c+rng.Float64()*r.jitterMS)
			last = max(last, enter[rk])
		}
		took := 6.0 + rng.Float64()
		linkSlow := r.linkFactor > 0 && s >= r.linkFrom && s < r.linkTo
		if linkSlow {
			took /= r.linkFactor
		}
		var end int64
		for rk := range int32(ranks) {
			exit := last + ms(took+rng.Float64()*0.3)
			if linkSlow && node(rk) == r.linkNode {
				exit += ms(0.4 * took)
			}
			a.Add("job", 1, Call{Comm: 0, NRanks: ranks, Seq: uint64(s), Rank: rk, Node: node(rk), Op: "allreduce",
				Bytes: 4 << 20, Enter: enter[rk], Exit: exit})
			end = max(end, exit)
		}
		for rk := range int32(ranks) {
			e := end + ms(rng.Float64()*0.1)
			a.Add("job", 1, Call{Comm: 1, NRanks: ranks, Seq: uint64(s), Rank: rk, Node: node(rk), Op: "allreduce",
				Bytes: 8, Enter: e, Exit: end + ms(0.3)})
		}
		now = end + ms(0.4)
		if s%2 == 0 {
			var gpus []GPU
			for rk := range int32(ranks) {
				g := GPU{Rank: rk, Clock: 1}
				if r.gpuEvidence && rk == r.slowRank && s >= r.slowFrom && s < r.slowTo {
					g = GPU{Rank: rk, Clock: r.slowFactor, Throttle: []string{"hw_slowdown"}}
				}
				gpus = append(gpus, g)
			}
			for _, c := range a.Judge([]Job{{ID: "job", Attempt: 1, GPUs: gpus}}) {
				evs = append(evs, event{step: s, change: c, cleared: c.Cleared})
			}
		}
	}
	return evs, a
}

func TestFindings(t *testing.T) {
	type want struct {
		class    Class
		rank     int32
		node     string
		within   int // steps after the fault starts
		clearsBy int // step by which it has cleared, 0: stays
		evidence string
	}
	cases := []struct {
		name string
		run  run
		want []want
	}{
		{name: "healthy jitter and periodic checkpoints", run: run{steps: 600, computeMS: 100, jitterMS: 4}},
		{name: "healthy with warm-up", run: run{steps: 300, computeMS: 100, jitterMS: 4, warmup: 5}},
		{name: "healthy, jitter as large as the late floor", run: run{steps: 300, computeMS: 100, jitterMS: 10}},
		{name: "0.7× compute-slow rank", run: run{steps: 400, computeMS: 100, jitterMS: 4,
			slowRank: 2, slowFactor: 0.7, slowFrom: 200, slowTo: 1000, gpuEvidence: true},
			want: []want{{class: ComputeSlow, rank: 2, node: "node-01", within: 45, evidence: "70% of its peers' (hw_slowdown)"}}},
		{name: "0.7× compute-slow rank, no GPU evidence", run: run{steps: 400, computeMS: 100, jitterMS: 4,
			slowRank: 1, slowFactor: 0.7, slowFrom: 200, slowTo: 1000},
			want: []want{{class: ComputeSlow, rank: 1, node: "node-00", within: 45, evidence: "no slowdown"}}},
		{name: "0.5× link", run: run{steps: 400, computeMS: 100, jitterMS: 4,
			linkNode: "node-01", linkFactor: 0.5, linkFrom: 200, linkTo: 1000},
			want: []want{{class: CommunicationSlow, rank: -1, node: "node-01", within: 60, evidence: "their baseline"}}},
		{name: "15% job-wide step-time shift", run: run{steps: 500, computeMS: 100, jitterMS: 4,
			shift: 1.15, shiftFrom: 200, shiftTo: 1000},
			want: []want{{class: JobWide, rank: -1, within: 250, evidence: "1.1"}}},
		{name: "a slow rank that recovers", run: run{steps: 500, computeMS: 100, jitterMS: 4,
			slowRank: 3, slowFactor: 0.7, slowFrom: 200, slowTo: 300},
			want: []want{{class: ComputeSlow, rank: 3, node: "node-01", within: 45, clearsBy: 320}}},
		{name: "a step-time shift that ends", run: run{steps: 700, computeMS: 100, jitterMS: 4,
			shift: 1.2, shiftFrom: 200, shiftTo: 500},
			want: []want{{class: JobWide, rank: -1, within: 250, clearsBy: 520}}},
		{name: "a step-time shift of 10 s (a busy shared host) is not raised", run: run{steps: 500, computeMS: 100, jitterMS: 4,
			shift: 1.2, shiftFrom: 200, shiftTo: 290}},
		{name: "a slow link that recovers", run: run{steps: 500, computeMS: 100, jitterMS: 4,
			linkNode: "node-00", linkFactor: 0.5, linkFrom: 200, linkTo: 300},
			want: []want{{class: CommunicationSlow, rank: -1, node: "node-00", within: 60, clearsBy: 320}}},
		{name: "every link slow for 10 s (a busy shared host) is not raised", run: run{steps: 500, computeMS: 100, jitterMS: 4,
			linkFactor: 0.5, linkFrom: 200, linkTo: 290}},
		{name: "every link slow for a minute is raised, naming no node", run: run{steps: 800, computeMS: 100, jitterMS: 4,
			linkFactor: 0.5, linkFrom: 200, linkTo: 1000},
			want: []want{{class: CommunicationSlow, rank: -1, within: 250, evidence: "their baseline"}}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			evs, _ := replay(t, c.run)
			from := max(c.run.slowFrom, c.run.linkFrom, c.run.shiftFrom)
			var raised, cleared []event
			for _, e := range evs {
				if e.cleared {
					cleared = append(cleared, e)
				} else {
					raised = append(raised, e)
				}
			}
			if len(raised) != len(c.want) {
				var got []string
				for _, e := range evs {
					got = append(got, fmt.Sprintf("step %d cleared=%v %s rank %d node %s: %s", e.step, e.cleared, e.change.Finding.Class,
						e.change.Finding.Rank, e.change.Finding.Node, e.change.Finding.Evidence))
				}
				t.Fatalf("raised %d findings, want %d:\n%s", len(raised), len(c.want), strings.Join(got, "\n"))
			}
			for i, w := range c.want {
				e := raised[i]
				f := e.change.Finding
				if f.Class != w.class || f.Rank != w.rank || f.Node != w.node {
					t.Errorf("finding %s rank %d node %q, want %s rank %d node %q", f.Class, f.Rank, f.Node, w.class, w.rank, w.node)
				}
				if e.step < from || e.step > from+w.within {
					t.Errorf("%s found at step %d, want within %d steps of %d", f.Class, e.step, w.within, from)
				}
				if !strings.Contains(f.Evidence, w.evidence) {
					t.Errorf("evidence %q, want it to say %q", f.Evidence, w.evidence)
				}
				t.Logf("%s at step %d (%d after the fault): %s", f.Class, e.step, e.step-from, f.Evidence)
				switch {
				case w.clearsBy == 0 && len(cleared) > 0:
					t.Errorf("cleared at step %d though the fault lasts: %s", cleared[0].step, cleared[0].change.Why)
				case w.clearsBy > 0 && (len(cleared) != 1 || cleared[0].step > w.clearsBy):
					t.Errorf("cleared %v, want once by step %d", cleared, w.clearsBy)
				}
			}
		})
	}
}

// A restart (a newer attempt) clears what the old attempt showed and
// starts the baselines over; so does a new communicator size.
func TestBaselinesStartOver(t *testing.T) {
	_, a := replay(t, run{steps: 300, computeMS: 100, jitterMS: 4, slowRank: 2, slowFactor: 0.7, slowFrom: 100, slowTo: 1000})
	if len(a.Findings()) != 1 {
		t.Fatalf("findings before the restart: %v", a.Findings())
	}
	ch := a.Judge([]Job{{ID: "job", Attempt: 2}})
	if len(ch) != 1 || !ch[0].Cleared || ch[0].Why != "the job restarted" {
		t.Errorf("on restart: %+v, want the finding cleared because the job restarted", ch)
	}
	if len(a.Findings()) != 0 || len(a.Lateness("job")) != 0 {
		t.Errorf("after the restart: findings %v, lateness %v", a.Findings(), a.Lateness("job"))
	}
	// A call of the old attempt arriving late is not the new one's.
	a.Add("job", 1, Call{Comm: 0, NRanks: 4, Seq: 9, Rank: 0, Enter: 1, Exit: 2})
	if len(a.Lateness("job")) != 0 {
		t.Errorf("a call of the old attempt counted in the new one")
	}

	// Size: a communicator of 4 that becomes one of 2 forgets its window.
	b := New(Config{})
	for s := uint64(1); s <= 60; s++ {
		for r := range int32(4) {
			b.Add("j", 1, Call{Comm: 0, NRanks: 4, Seq: s, Rank: r, Node: node(r), Op: "allreduce", Bytes: 1 << 20,
				Enter: int64(s)*1e8 + int64(r)*5e7*boolInt(r == 3), Exit: int64(s)*1e8 + 6e7})
		}
		b.Judge([]Job{{ID: "j", Attempt: 1}})
	}
	if len(b.Findings()) != 1 {
		t.Fatalf("4 ranks, rank 3 late: findings %v", b.Findings())
	}
	b.Add("j", 1, Call{Comm: 0, NRanks: 2, Seq: 31, Rank: 0, Enter: 31e8, Exit: 31e8 + 1e6})
	if ch := b.Judge([]Job{{ID: "j", Attempt: 1}}); len(ch) != 1 || !ch[0].Cleared {
		t.Errorf("after the size change: %+v, want the finding cleared", ch)
	}
}

func boolInt(b bool) int64 {
	if b {
		return 1
	}
	return 0
}

// Collectives whose ranks never all report (lost events) do not pile up.
func TestPendingBounded(t *testing.T) {
	a := New(Config{})
	for s := uint64(1); s <= 10_000; s++ {
		a.Add("j", 1, Call{Comm: 0, NRanks: 8, Seq: s, Rank: 0, Enter: int64(s), Exit: int64(s) + 1})
	}
	cs := a.jobs["j"].comms[0]
	n := 0
	for _, sl := range cs.slots {
		if sl.seq != 0 {
			n++
		}
	}
	if n > pendingMax || len(cs.slots) != pendingMax {
		t.Errorf("%d collectives pending in %d slots, want at most %d", n, len(cs.slots), pendingMax)
	}
	// A straggler of a collective long gone is dropped, not kept.
	a.Add("j", 1, Call{Comm: 0, NRanks: 8, Seq: 5, Rank: 1, Enter: 5, Exit: 6})
	if sl := cs.slots[5%pendingMax]; sl.seq == 5 {
		t.Errorf("seq 5, %d collectives old, took a slot", 10_000-5)
	}
}

// A job that stops running takes its findings with it.
func TestJobGone(t *testing.T) {
	_, a := replay(t, run{steps: 300, computeMS: 100, jitterMS: 4, slowRank: 0, slowFactor: 0.5, slowFrom: 100, slowTo: 1000})
	ch := a.Judge(nil)
	if len(ch) != 1 || !ch[0].Cleared || ch[0].Why != "the job is no longer running" {
		t.Errorf("job gone: %+v", ch)
	}
	if len(a.jobs) != 0 {
		t.Errorf("a gone job is remembered")
	}
}
