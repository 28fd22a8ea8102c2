// Package stall finds NCCL stalls from the sequence numbers ranks report.
// Every rank numbers the collectives it makes on a communicator, so the
// ranks of a healthy job never disagree for long: a collective completes on
// every rank or on none. When ranks disagree on where they are (some inside
// collective k+1 or past it, others still at k), or all sit inside the same
// collective, and the communicator has made no progress for longer than its
// limit (Rule: learned from its own cadence, bounded by the job's
// stall_threshold), it is stalled; the ranks furthest behind (or, when all
// are inside, the stopped or idle ones) are the ones holding it up.
//
// The package is pure: a Detector is the memory between passes, and Update
// is a function of it, the time it is given and the ranks' reports.
package stall

import (
	"cmp"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"
)

// Call is a collective in progress.
type Call struct {
	// Op is the collective's short name (allreduce, allgather, …).
	Op  string
	Seq uint64
	// Bytes is its size on this rank.
	Bytes uint64
}

// Comm is one rank's progress on one communicator.
type Comm struct {
	// Handle is the communicator's address in the rank's own memory.
	Handle uint64
	// Created is when ncclCommInitRank returned (unix ns), 0 if not traced.
	Created int64
	// Done is the last completed collective's seq and op.
	Done   uint64
	DoneOp string
	// In is the collective in progress, nil between calls.
	In *Call
}

// position orders a rank's progress on a communicator: 2k once it has
// completed collective k, 2k-1 while it is inside collective k.
func (c *Comm) position() uint64 {
	p := 2 * c.Done
	if c.In != nil && c.In.Seq > 0 && 2*c.In.Seq-1 > p {
		p = 2*c.In.Seq - 1
	}
	return p
}

// inCall reports whether the rank is inside the collective after Done.
func (c *Comm) inCall() bool { return c.position()%2 == 1 }

// Rank is one live rank at one instant.
type Rank struct {
	Rank int32
	Node string
	Pid  uint32
	// ProcState is the process state from /proc (R, S, D, T, Z).
	ProcState string
	// CPU is the CPU seconds it has used.
	CPU float64
	// Comms are its communicators in creation order (SortComms), so the
	// i-th communicator of every rank of a job is the same one: handles
	// are addresses private to each rank.
	Comms []Comm
}

// SortComms orders a rank's communicators by traced creation; those whose
// creation was not seen follow, by handle.
func SortComms(cs []Comm) {
	slices.SortFunc(cs, func(a, b Comm) int {
		switch {
		case a.Created != 0 && b.Created != 0 && a.Created != b.Created:
			return cmp.Compare(a.Created, b.Created)
		case a.Created != 0 && b.Created == 0:
			return -1
		case a.Created == 0 && b.Created != 0:
			return 1
		}
		return cmp.Compare(a.Handle, b.Handle)
	})
}

// Job is one running job at one instant.
type Job struct {
	ID string
	// Attempt is the job's launch: what a communicator learned of its
	// cadence starts over with a new one.
	Attempt uint32
	// Threshold is the job's stall_threshold, 0 when it sets none.
	Threshold time.Duration
	Ranks     []Rank
}

// StalledRank is a rank as a stall names it.
type StalledRank struct {
	Rank int32
	Node string
	Pid  uint32
	// Op and Seq are the collective it sits in when InCall, else the last
	// it completed.
	Op        string
	Seq       uint64
	InCall    bool
	ProcState string
}

// Stall is one stalled communicator of a job.
type Stall struct {
	Job string
	// Comm is the communicator's creation index, and Handle its address in
	// its lowest rank's memory.
	Comm    int
	Handle  uint64
	Lagging []StalledRank
	Waiting []StalledRank
	// Since is when its ranks began to disagree where they are now.
	Since time.Time
	// Threshold is the limit it was held to, Limit why.
	Threshold time.Duration
	Limit     Limit
	Diagnosis string
}

// Change is a stall declared or cleared by one update.
type Change struct {
	Stall   Stall
	Cleared bool
	// Why a cleared stall ended; Lasted how long it lasted.
	Why    string
	Lasted time.Duration
}

type key struct {
	job  string
	comm int
}

type pidKey struct {
	node string
	pid  uint32
}

// track follows one communicator while its ranks disagree.
type track struct {
	// low is the lowest position of its ranks; since is when the ranks
	// began to disagree with the lowest at low. Progress of the lowest
	// rank restarts the clock. Counting from the disagreement, not from
	// the last progress, leaves out a pause every rank makes together (a
	// checkpoint all write at once shows only its skew).
	low   uint64
	since time.Time
	stall *Stall
	// in is the collective every rank has sat inside since it began, nil
	// once one was not.
	in *opSize
}

// cpuMark is a rank's CPU time as passes saw it change: the latest value
// first, then the values before it with when each was first seen.
type cpuMark struct {
	seen [4]cpuSeen
}

type cpuSeen struct {
	at      time.Time
	seconds float64
}

// cpuBusy is how much CPU a rank must use after a stall began to count as
// working: a rank asleep on a kernel that never ends still wakes to poll
// (about a tick a minute), and one stalled between steps finishes the
// step's bookkeeping a report late; either can move its CPU time by a
// tick, a rank that computes or loads data moves it by many.
const cpuBusy = 0.03

// cpuReportLag is how old the CPU time in a rank's report can be when a
// pass sees it: nodes sample it every second and their batch reaches a
// pass up to half a second later. Two changes seen after a moment may
// both still be CPU used before it.
const cpuReportLag = 1500 * time.Millisecond

// Detector is the memory between updates. It is not safe for concurrent
// use.
type Detector struct {
	rule Rule
	// last is the previous update's time.
	last   time.Time
	tracks map[key]*track
	cad    map[key]*cadence
	cpu    map[pidKey]cpuMark
}

// New returns an empty detector running DefaultRule.
func New() *Detector { return NewRule(DefaultRule) }

// NewRule returns an empty detector running r.
func NewRule(r Rule) *Detector {
	return &Detector{rule: r, tracks: map[key]*track{}, cad: map[key]*cadence{}, cpu: map[pidKey]cpuMark{}}
}

// Update folds in one report of every running job and returns the stalls
// it declared and cleared, in job then start order.
func (d *Detector) Update(now time.Time, jobs []Job) []Change {
	if gap := now.Sub(d.last); d.rule.Pass > 0 && !d.last.IsZero() && gap > d.rule.Pass+500*time.Millisecond {
		for _, t := range d.tracks {
			if t.stall == nil {
				t.since = t.since.Add(gap - d.rule.Pass)
			}
		}
	}
	d.last = now
	var changes []Change
	running := map[string]bool{}
	seen := map[key]bool{}
	live := map[key]bool{}
	seenPid := map[pidKey]bool{}
	for _, j := range jobs {
		running[j.ID] = true
		ncomm := 0
		for _, r := range j.Ranks {
			k := pidKey{r.Node, r.Pid}
			seenPid[k] = true
			if m, ok := d.cpu[k]; !ok || m.seen[0].seconds != r.CPU {
				copy(m.seen[1:], m.seen[:])
				m.seen[0] = cpuSeen{at: now, seconds: r.CPU}
				d.cpu[k] = m
			}
			ncomm = max(ncomm, len(r.Comms))
		}
		for c := range ncomm {
			var members []*Rank
			for i := range j.Ranks {
				if c < len(j.Ranks[i].Comms) {
					members = append(members, &j.Ranks[i])
				}
			}
			if len(members) < 2 {
				continue
			}
			low, agree := progress(members, c)
			k := key{j.ID, c}
			live[k] = true
			cd := d.cad[k]
			fresh := cd == nil || cd.attempt != j.Attempt
			if fresh {
				cd = &cadence{attempt: j.Attempt}
				d.cad[k] = cd
			}
			t := d.tracks[k]
			if t != nil && (agree || t.low != low) {
				// The slowest rank moved: the others' wait ends. A wait that
				// was a stall is not learned as the job's pace.
				if t.stall != nil {
					changes = append(changes, Change{Stall: *t.stall, Cleared: true, Why: "the ranks progress again", Lasted: now.Sub(t.since)})
				} else if !fresh {
					cd.add(now.Sub(t.since))
					if t.in != nil {
						cd.addOp(*t.in, now.Sub(t.since))
					}
				}
				delete(d.tracks, k)
				t = nil
			}
			if t == nil && cd.seen && low != cd.low && !fresh {
				// Progress with nobody seen waiting: a wait of nothing,
				// so a job whose waits a pass rarely catches learns too.
				cd.add(0)
			}
			cd.low, cd.seen = low, true
			if agree {
				continue
			}
			seen[k] = true
			in := allIn(members, c, low)
			if t == nil {
				t = &track{low: low, since: now, in: in}
				d.tracks[k] = t
			}
			if in == nil || t.in == nil || *in != *t.in {
				t.in = nil
			}
			lim := d.rule.limit(&cd.waits, j.Threshold)
			if t.in != nil {
				// Every rank inside one collective: held to that op at that
				// size, once enough of it is learned.
				if op := cd.ops[*t.in]; op != nil && int(op.n) >= d.rule.MinSamples {
					lim = d.rule.limit(op, j.Threshold)
				}
			}
			if now.Sub(t.since) < lim.Limit {
				continue
			}
			s := d.diagnose(j, c, members, t.since, now)
			s.Threshold, s.Limit = lim.Limit, lim
			if t.stall == nil {
				changes = append(changes, Change{Stall: s})
			}
			t.stall = &s
		}
	}
	for k, t := range d.tracks {
		if seen[k] {
			continue
		}
		if t.stall != nil {
			why := "the ranks progress again"
			if !running[k.job] {
				why = "the job is no longer running"
			}
			changes = append(changes, Change{Stall: *t.stall, Cleared: true, Why: why, Lasted: now.Sub(t.since)})
		}
		delete(d.tracks, k)
	}
	for k := range d.cad {
		if !live[k] {
			delete(d.cad, k)
		}
	}
	for k := range d.cpu {
		if !seenPid[k] {
			delete(d.cpu, k)
		}
	}
	slices.SortStableFunc(changes, func(a, b Change) int { return compare(&a.Stall, &b.Stall) })
	return changes
}

// allIn returns the collective every member sits inside, at position low,
// or nil.
func allIn(members []*Rank, c int, low uint64) *opSize {
	if low%2 == 0 {
		return nil
	}
	for _, r := range members {
		if r.Comms[c].position() != low {
			return nil
		}
	}
	k := opSizeOf(members[0].Comms[c].In)
	return &k
}

// progress returns the lowest position of the members on communicator c,
// and whether they agree: all between the same two collectives.
func progress(members []*Rank, c int) (low uint64, agree bool) {
	low = members[0].Comms[c].position()
	high := low
	for _, r := range members[1:] {
		p := r.Comms[c].position()
		low, high = min(low, p), max(high, p)
	}
	return low, low == high && low%2 == 0
}

// diagnose names the ranks holding communicator c up and the ones waiting.
func (d *Detector) diagnose(j Job, c int, members []*Rank, since, now time.Time) Stall {
	low, _ := progress(members, c)
	allInside := true
	for _, r := range members {
		if r.Comms[c].position() != low {
			allInside = false
		}
	}
	var lagging, waiting []*Rank
	switch {
	case !allInside:
		// The ranks furthest behind are the ones the others wait for; but
		// when some of them are stopped, the others there that sit inside
		// a call, on this communicator or another, wait on those (a ring
		// holds the stopped rank's successor up).
		var gone []*Rank
		for _, r := range members {
			if r.Comms[c].position() == low && stopped(r.ProcState) {
				gone = append(gone, r)
			}
		}
		for _, r := range members {
			held := len(gone) > 0 && !slices.Contains(gone, r) && inAnyCall(r)
			if r.Comms[c].position() == low && !held {
				lagging = append(lagging, r)
			} else {
				waiting = append(waiting, r)
			}
		}
	default:
		// Everyone is inside the same collective: a stopped rank, else
		// ranks that have used no CPU since the stall began while others
		// have, are the suspects.
		for _, r := range members {
			if stopped(r.ProcState) {
				lagging = append(lagging, r)
			}
		}
		if len(lagging) == 0 {
			var idle []*Rank
			for _, r := range members {
				if !d.cpuSince(r, since) {
					idle = append(idle, r)
				}
			}
			if len(idle) > 0 && len(idle) < len(members) {
				lagging = idle
			}
		}
		for _, r := range members {
			if !slices.Contains(lagging, r) {
				waiting = append(waiting, r)
			}
		}
	}
	s := Stall{Job: j.ID, Comm: c, Handle: members[0].Comms[c].Handle, Since: since}
	for _, r := range lagging {
		s.Lagging = append(s.Lagging, stalledRank(r, c))
	}
	for _, r := range waiting {
		s.Waiting = append(s.Waiting, stalledRank(r, c))
	}
	s.Diagnosis = d.diagnosis(c, members, lagging, waiting, since, now)
	return s
}

func stalledRank(r *Rank, c int) StalledRank {
	cm := &r.Comms[c]
	sr := StalledRank{Rank: r.Rank, Node: r.Node, Pid: r.Pid, Op: cm.DoneOp, Seq: cm.Done, ProcState: r.ProcState}
	if cm.inCall() {
		sr.InCall, sr.Op, sr.Seq = true, cm.In.Op, cm.In.Seq
	}
	return sr
}

func stopped(procState string) bool { return procState == "T" || procState == "t" }

// inAnyCall reports whether r sits inside a collective on any communicator.
func inAnyCall(r *Rank) bool {
	for i := range r.Comms {
		if r.Comms[i].inCall() {
			return true
		}
	}
	return false
}

// cpuSince reports whether r surely used CPU after t: its CPU time grew by
// cpuBusy past the value a pass saw cpuReportLag after t (a report seen
// sooner may carry CPU used before t).
func (d *Detector) cpuSince(r *Rank, t time.Time) bool {
	m, ok := d.cpu[pidKey{r.Node, r.Pid}]
	if !ok {
		return false
	}
	from := t.Add(cpuReportLag)
	base := m.seen[0].seconds
	for _, s := range m.seen {
		if s.at.IsZero() {
			break
		}
		// Without a value seen by then, the oldest kept is the base: it
		// can only undercount.
		base = s.seconds
		if !s.at.After(from) {
			break
		}
	}
	return m.seen[0].seconds-base >= cpuBusy
}

// diagnosis says in a sentence what holds the communicator up:
// "rank 2 (node-01 pid 4242) is stopped (SIGSTOP?) after allreduce seq 41;
// ranks 0,1,3 wait in allreduce seq 42 for 5.2s".
func (d *Detector) diagnosis(c int, members, lagging, waiting []*Rank, since, now time.Time) string {
	dur := now.Sub(since).Round(100 * time.Millisecond)
	var parts []string
	for _, r := range lagging {
		parts = append(parts, fmt.Sprintf("rank %d (%s pid %d) %s %s", r.Rank, r.Node, r.Pid, d.doing(r, c, since), where(&r.Comms[c])))
	}
	if len(lagging) == 0 {
		cm := &members[0].Comms[c]
		return fmt.Sprintf("all %d ranks wait in %s seq %d for %s and none is stopped or idle: suspect the network between them or a hung GPU",
			len(members), cm.In.Op, cm.In.Seq, dur)
	}
	// Group the waiting ranks by where they are.
	type at struct {
		in  bool
		op  string
		seq uint64
	}
	var order []at
	groups := map[at][]int32{}
	for _, r := range waiting {
		sr := stalledRank(r, c)
		a := at{sr.InCall, sr.Op, sr.Seq}
		if _, ok := groups[a]; !ok {
			order = append(order, a)
		}
		groups[a] = append(groups[a], r.Rank)
	}
	for _, a := range order {
		verb := "wait in"
		if !a.in {
			verb = "are past"
		}
		if len(groups[a]) == 1 {
			verb = map[string]string{"wait in": "waits in", "are past": "is past"}[verb]
		}
		parts = append(parts, fmt.Sprintf("%s %s %s seq %d", rankList(groups[a]), verb, a.op, a.seq))
	}
	return strings.Join(parts, "; ") + " for " + dur.String()
}

// doing says what a lagging rank's process is doing.
func (d *Detector) doing(r *Rank, c int, since time.Time) string {
	switch r.ProcState {
	case "T", "t":
		return "is stopped (SIGSTOP?)"
	case "Z", "X":
		return "has exited"
	case "D":
		return "is blocked in the kernel (state D)"
	}
	if d.cpuSince(r, since) {
		if r.Comms[c].inCall() {
			return "is running"
		}
		return "is busy outside NCCL"
	}
	return "is hung (no CPU progress)"
}

// where says where a rank is on its communicator.
func where(cm *Comm) string {
	switch {
	case cm.inCall():
		return fmt.Sprintf("inside %s seq %d", cm.In.Op, cm.In.Seq)
	case cm.Done > 0:
		return fmt.Sprintf("after %s seq %d", cm.DoneOp, cm.Done)
	}
	return "before its first collective"
}

// rankList renders "rank 3" or "ranks 0,1,3".
func rankList(ranks []int32) string {
	s := make([]string, len(ranks))
	for i, r := range ranks {
		s[i] = strconv.Itoa(int(r))
	}
	if len(ranks) == 1 {
		return "rank " + s[0]
	}
	return "ranks " + strings.Join(s, ",")
}

func compare(a, b *Stall) int {
	return cmp.Or(strings.Compare(a.Job, b.Job), a.Since.Compare(b.Since), cmp.Compare(a.Handle, b.Handle))
}

// Declared returns the stalls declared now, of job ("" = every job), by
// job, oldest first.
func (d *Detector) Declared(job string) []Stall {
	var out []Stall
	for k, t := range d.tracks {
		if t.stall != nil && (job == "" || k.job == job) {
			out = append(out, *t.stall)
		}
	}
	slices.SortFunc(out, func(a, b Stall) int { return compare(&a, &b) })
	return out
}
