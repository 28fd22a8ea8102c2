package stall

import (
	"math/rand/v2"
	"slices"
	"testing"
	"time"
)

// never is a time a recorded sequence does not reach.
const never = time.Duration(1<<62 - 1)

// run is a recorded data-parallel job on one communicator: each step every
// rank computes, enters the all-reduce, and leaves it once the last rank
// entered and the transfer took its time.
type run struct {
	ranks    int
	compute  time.Duration
	jitter   time.Duration
	coll     time.Duration
	ckptEach int
	// ckpt is rank r's pause writing a checkpoint after every ckptEach-th
	// step (every rank writes; the next step waits for the slowest).
	ckpt func(r int) time.Duration
	// hangStep > 0 hangs rank hangRank at that step: outside (it never
	// enters the collective) or inside (it enters and never returns).
	hangStep, hangRank int
	inside             bool
	seed               uint64
}

// timeline is when each rank entered and left each collective, from step 1.
type timeline struct{ enter, leave [][]time.Duration }

func (r run) record(horizon time.Duration) timeline {
	rng := rand.New(rand.NewPCG(r.seed, 1))
	var tl timeline
	at := make([]time.Duration, r.ranks)
	for s := 1; ; s++ {
		enter, leave := make([]time.Duration, r.ranks), make([]time.Duration, r.ranks)
		last := time.Duration(0)
		for k := range r.ranks {
			if at[k] == never {
				enter[k] = never
			} else {
				enter[k] = at[k] + r.compute + time.Duration(rng.Int64N(int64(2*r.jitter)+1)) - r.jitter
				if r.ckptEach > 0 && s > 1 && (s-1)%r.ckptEach == 0 {
					enter[k] += r.ckpt(k)
				}
			}
			if s == r.hangStep && k == r.hangRank && !r.inside {
				enter[k] = never
			}
			last = max(last, enter[k])
		}
		for k := range r.ranks {
			leave[k] = never
			if last != never {
				leave[k] = last + r.coll
			}
			if s == r.hangStep && k == r.hangRank && r.inside {
				leave[k] = never
			}
			at[k] = leave[k]
		}
		tl.enter, tl.leave = append(tl.enter, enter), append(tl.leave, leave)
		if slices.Min(at) > horizon {
			return tl
		}
	}
}

// at is the job as a pass at t sees it.
func (tl timeline) at(t time.Duration) []Rank {
	n := len(tl.enter[0])
	ranks := make([]Rank, n)
	for k := range n {
		var c Comm
		c.Handle = 0xa0 + uint64(k)
		for s := range tl.enter {
			if tl.leave[s][k] <= t {
				c.Done, c.DoneOp = uint64(s+1), "allreduce"
				continue
			}
			if tl.enter[s][k] <= t {
				c.In = &Call{Op: "allreduce", Seq: uint64(s + 1)}
			}
			break
		}
		ranks[k] = rk(int32(k), "node-0"+string(rune('0'+k/2)), uint32(100+k), "S", 1, c)
	}
	return ranks
}

// replay runs the detector over the timeline with a pass every 250 ms and
// returns the first stall it declared and when, or nil.
func replay(t *testing.T, rule Rule, tl timeline, threshold, horizon time.Duration) (*Stall, time.Duration) {
	t.Helper()
	d := NewRule(rule)
	t0 := time.Unix(1_800_000_000, 0)
	for at := time.Duration(0); at <= horizon; at += 250 * time.Millisecond {
		for _, ch := range d.Update(t0.Add(at), []Job{{ID: "j-1", Attempt: 1, Threshold: threshold, Ranks: tl.at(at)}}) {
			if !ch.Cleared {
				return &ch.Stall, at
			}
		}
	}
	return nil, 0
}

func TestAdaptiveRule(t *testing.T) {
	demo := run{ranks: 4, compute: 100 * time.Millisecond, jitter: 20 * time.Millisecond, coll: 15 * time.Millisecond, seed: 1}
	withCkpt := demo
	withCkpt.ckptEach, withCkpt.ckpt = 50, func(r int) time.Duration {
		// Every rank writes; rank 0 is 1.8 s slower than the others.
		if r == 0 {
			return 2200 * time.Millisecond
		}
		return 400 * time.Millisecond
	}
	slow := run{ranks: 4, compute: 3 * time.Second, jitter: 2 * time.Second, coll: 200 * time.Millisecond, seed: 2}
	hang := func(r run, step int, inside bool) run {
		r.hangStep, r.hangRank, r.inside = step, 2, inside
		return r
	}
	cases := []struct {
		name      string
		run       run
		threshold time.Duration
		horizon   time.Duration
		// want is false for a run that must flag nothing; otherwise the
		// stall must come between after and by (from the hang's start),
		// with this basis.
		want       bool
		after, by  time.Duration
		basis      string
		hungInside bool
	}{
		{name: "healthy jitter", run: demo, horizon: 10 * time.Minute},
		{name: "periodic checkpoints with skew", run: withCkpt, horizon: 10 * time.Minute},
		{name: "slow steps", run: slow, horizon: 10 * time.Minute},
		{name: "hang between collectives at op 200", run: hang(demo, 200, false), horizon: 2 * time.Minute,
			want: true, after: 2 * time.Second, by: 3 * time.Second, basis: "learned"},
		{name: "hang inside a collective at op 200", run: hang(demo, 200, true), horizon: 2 * time.Minute,
			want: true, after: 2 * time.Second, by: 3 * time.Second, basis: "learned", hungInside: true},
		{name: "hang after checkpoints whose skew lifts the limit", run: hang(withCkpt, 333, false), horizon: 2 * time.Minute,
			want: true, after: 7 * time.Second, by: 10 * time.Second, basis: "learned"},
		{name: "slow steps learn a longer limit", run: hang(slow, 40, false), horizon: 5 * time.Minute,
			want: true, after: 12 * time.Second, by: 25 * time.Second, basis: "learned"},
		{name: "stall_threshold bounds what was learned", run: hang(slow, 40, false), threshold: 5 * time.Second, horizon: 5 * time.Minute,
			want: true, after: 5 * time.Second, by: 6 * time.Second, basis: "stall_threshold"},
		{name: "too few samples: the default applies", run: hang(demo, 3, false), horizon: 11 * time.Minute,
			want: true, after: 10 * time.Minute, by: 10*time.Minute + time.Second, basis: "default"},
		{name: "too few samples: stall_threshold applies", run: hang(demo, 3, true), threshold: 30 * time.Second, horizon: time.Minute,
			want: true, after: 30 * time.Second, by: 31 * time.Second, basis: "stall_threshold", hungInside: true},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			tl := tc.run.record(tc.horizon)
			st, at := replay(t, DefaultRule, tl, tc.threshold, tc.horizon)
			if !tc.want {
				if st != nil {
					t.Fatalf("healthy run flagged at %s: %s (%s)", at, st.Diagnosis, st.Limit)
				}
				return
			}
			if st == nil {
				t.Fatalf("hang at step %d not flagged within %s", tc.run.hangStep, tc.horizon)
			}
			// The ranks disagree from when the first other rank entered
			// (outside) or left (inside) the hung rank's collective.
			s, start := tc.run.hangStep-1, never
			for k := range tc.run.ranks {
				if k == tc.run.hangRank {
					continue
				}
				if tc.run.inside {
					start = min(start, tl.leave[s][k])
				} else {
					start = min(start, tl.enter[s][k])
				}
			}
			if took := at - start; took < tc.after || took > tc.by {
				t.Errorf("flagged %s after the hang, want %s..%s (%s)", took, tc.after, tc.by, st.Limit)
			}
			if st.Limit.Basis != tc.basis {
				t.Errorf("basis %q, want %q (%s)", st.Limit.Basis, tc.basis, st.Limit)
			}
			if len(st.Lagging) != 1 || st.Lagging[0].Rank != 2 || st.Lagging[0].InCall != tc.hungInside {
				t.Errorf("lagging %+v, want rank 2 (in call %v): %s", st.Lagging, tc.hungInside, st.Diagnosis)
			}
		})
	}
}

func TestLimitFromCadence(t *testing.T) {
	feed := func(ds ...time.Duration) *waits {
		c := &waits{}
		for _, d := range ds {
			c.add(d)
		}
		return c
	}
	repeat := func(d time.Duration, n int) []time.Duration { return slices.Repeat([]time.Duration{d}, n) }
	// A quantile reads as its bucket's upper edge.
	p99 := func(d time.Duration) time.Duration { return upper(bucketOf(d)) }
	cases := []struct {
		name  string
		c     *waits
		bound time.Duration
		want  Limit
	}{
		{"nothing learned, no bound", nil, 0, Limit{Limit: 10 * time.Minute, Basis: "default"}},
		{"nothing learned, a bound", feed(repeat(time.Second, 19)...), 45 * time.Second, Limit{Limit: 45 * time.Second, Basis: "stall_threshold"}},
		{"fast cadence sits on the floor", feed(repeat(250*time.Millisecond, 100)...), 0,
			Limit{Limit: 2 * time.Second, Basis: "learned", Samples: 100, Quantile: p99(250 * time.Millisecond), Longest: 250 * time.Millisecond}},
		{"slow cadence is k times its p99", feed(repeat(3*time.Second, 100)...), 0,
			Limit{Limit: (4 * p99(3*time.Second)).Round(time.Millisecond), Basis: "learned", Samples: 100, Quantile: p99(3 * time.Second), Longest: 3 * time.Second}},
		{"a rare long wait is kept by the longest", feed(append(repeat(250*time.Millisecond, 1000), 8*time.Second)...), 0,
			Limit{Limit: 12 * time.Second, Basis: "learned", Samples: 1001, Quantile: p99(250 * time.Millisecond), Longest: 8 * time.Second}},
		{"the bound caps it", feed(repeat(3*time.Second, 100)...), 10 * time.Second,
			Limit{Limit: 10 * time.Second, Basis: "stall_threshold", Samples: 100, Quantile: p99(3 * time.Second), Longest: 3 * time.Second}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			if got := DefaultRule.limit(tc.c, tc.bound); got != tc.want {
				t.Errorf("limit %+v, want %+v", got, tc.want)
			}
		})
	}
	// Memory stays bounded however long a job runs, and old intervals
	// fade: after a long fast run, a slow pace takes over the quantile.
	c := feed(repeat(100*time.Millisecond, 100_000)...)
	for range 10_000 {
		c.add(2 * time.Second)
	}
	if c.n >= agingAt {
		t.Errorf("histogram holds %d intervals, want fewer than %d", c.n, agingAt)
	}
	if q := c.quantile(0.5); q < 2*time.Second {
		t.Errorf("median %s after the pace slowed, want at least 2s", q)
	}
}

// TestOpDurationsLearnedApart: a job whose every step makes a 3 s
// all-gather of 1 GiB and a quick 4 KiB all-reduce (every rank inside
// both together) is held to 4 × its p99 wait, 12 s, while ranks disagree;
// but a hang inside the small all-reduce is held to what that op at that
// size showed, and named after the 2 s floor, while the big all-gather
// is never flagged.
func TestOpDurationsLearnedApart(t *testing.T) {
	at := func(seq uint64, in *Call) []Rank {
		var rs []Rank
		for k := range 4 {
			c := Comm{Handle: 0xa0 + uint64(k), Done: seq, DoneOp: "allreduce", In: in}
			rs = append(rs, rk(int32(k), "node-0"+string(rune('0'+k/2)), uint32(100+k), "S", 1, c))
		}
		return rs
	}
	d := New()
	t0 := time.Unix(1_800_000_000, 0)
	now := time.Duration(0)
	pass := func(rs []Rank) []Change {
		now += 250 * time.Millisecond
		return d.Update(t0.Add(now), []Job{{ID: "j-1", Attempt: 1, Ranks: rs}})
	}
	var seq uint64
	for range 40 {
		pass(at(seq, nil))
		for range 12 { // 3 s inside the all-gather
			if ch := pass(at(seq, &Call{Op: "allgather", Seq: seq + 1, Bytes: 1 << 30})); len(ch) > 0 {
				t.Fatalf("the all-gather flagged at %s: %s (%s)", now, ch[0].Stall.Diagnosis, ch[0].Stall.Limit)
			}
		}
		seq++
		pass(at(seq, &Call{Op: "allreduce", Seq: seq + 1, Bytes: 4096}))
		seq++
	}
	if l := d.rule.limit(&d.cad[key{"j-1", 0}].waits, 0); l.Limit < 10*time.Second {
		t.Fatalf("the communicator's limit is %s, want the all-gather's 4 × 3 s to lift it past 10s", l)
	}
	hung := now
	for range 40 {
		for _, ch := range pass(at(seq, &Call{Op: "allreduce", Seq: seq + 1, Bytes: 4096})) {
			if took := now - hung; took > 2500*time.Millisecond || ch.Stall.Limit.Limit != 2*time.Second {
				t.Fatalf("a hang in the small all-reduce declared after %s (%s), want the 2s floor", took, ch.Stall.Limit)
			}
			return
		}
	}
	t.Fatalf("a hang in the small all-reduce not declared in %s", now-hung)
}
