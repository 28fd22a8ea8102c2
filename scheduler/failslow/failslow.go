// Package failslow finds ranks and links that run slow (fail-slow), from
// every rank's entry into and exit from each collective, by sequence number
// per communicator, with the GPUs' clocks as evidence:
//
//   - compute-slow: one rank enters collective k last, collective after
//     collective, by more than a share of the cadence; the others wait for
//     it. Its GPU's clocks and throttle reasons are the evidence.
//   - communication-slow: the ranks enter together, but the collective
//     (from the last entry to the exits) takes longer than its own baseline
//     for its op and size; the ranks that leave it last name the node.
//   - job-wide: the cadence of the job's busiest communicator (its step
//     time) shifts up, with no rank or collective to blame: CUSUM on the log
//     of the interval against the baseline.
//
// Lateness and collective times are relative (to the peers, to the
// communicator's own baseline), so a job needs no setting. Baselines start
// over on a new attempt or a change of communicator size. Memory is bounded
// per communicator.
//
// The package is pure: an Analyzer is the memory between passes; times are
// the calls' own.
package failslow

import (
	"cmp"
	"fmt"
	"math"
	"slices"
	"strings"
	"time"
)

// Class is what a finding blames.
type Class string

// The classes of findings.
const (
	ComputeSlow       Class = "compute-slow"
	CommunicationSlow Class = "communication-slow"
	JobWide           Class = "job-wide"
)

// Classes lists every class, in the order listings show them.
var Classes = []Class{ComputeSlow, CommunicationSlow, JobWide}

// Call is one rank's completed collective.
type Call struct {
	// Comm is the communicator's creation index, the same on every rank.
	Comm int
	// NRanks is the communicator's size; Seq the call's number on it.
	NRanks int32
	Seq    uint64
	Rank   int32
	Node   string
	Op     string
	Bytes  uint64
	// Enter and Exit are unix ns.
	Enter, Exit int64
}

// GPU is the evidence a rank's GPU gives now.
type GPU struct {
	Rank int32
	// Clock is its SM clock over the median of the job's GPUs' (the
	// peers run the same work), 0 when unknown.
	Clock float64
	// Throttle names the slowdown reasons it reports (idle excluded).
	Throttle []string
}

// Job is one running job as a pass sees it.
type Job struct {
	ID      string
	Attempt uint32
	GPUs    []GPU
}

// Finding is one slow rank, link or job.
type Finding struct {
	Job   string
	Class Class
	// Rank is the slow rank (compute-slow), -1 otherwise; Node its node,
	// or the node a communication-slow finding names ("" when none).
	Rank int32
	Node string
	// Comm is the communicator it was seen on (-1 for job-wide).
	Comm int
	// Since is when it was found (unix ns, from the calls).
	Since int64
	// Late is how late the rank enters, on the median (compute-slow).
	Late time.Duration
	// Slowdown is how much longer the thing takes than it should: the
	// cadence with the rank's lateness over without, the collective's time
	// over its baseline, the step time over its baseline.
	Slowdown float64
	// Evidence says what was seen, for people.
	Evidence string
}

// Key names a finding for watchers and listings: job, class and who.
func (f *Finding) Key() string {
	switch f.Class {
	case ComputeSlow:
		return fmt.Sprintf("%s/%s/rank-%d", f.Job, f.Class, f.Rank)
	case CommunicationSlow:
		return fmt.Sprintf("%s/%s/comm-%d", f.Job, f.Class, f.Comm)
	}
	return fmt.Sprintf("%s/%s", f.Job, f.Class)
}

// Change is a finding raised or cleared by a pass.
type Change struct {
	Finding Finding
	Cleared bool
	// Why a cleared finding ended.
	Why string
}

// Config holds the rules' settings; the zero value takes the defaults.
type Config struct {
	// Window is how many complete collectives of a communicator a rule
	// judges, default 10.
	Window int
	// LateShare and LateFloor: a rank is late when it enters a collective
	// after the median of its peers by more than max(LateShare × the
	// communicator's cadence, LateFloor); defaults 0.1 and 10 ms.
	LateShare float64
	LateFloor time.Duration
	// LastShare is the share of the window in which one rank must be the
	// late one, default 0.7.
	LastShare float64
	// CommSlow is the factor by which a collective's time must exceed its
	// baseline, on the median of the last CommWindow collectives (default
	// 3 × Window, so a burst of noise does not count), default 1.8; only
	// collectives of MinBytes (64 KiB) and more count, smaller ones being
	// latency, not bandwidth.
	CommSlow   float64
	CommWindow int
	MinBytes   uint64
	// Baseline is how many samples make a baseline, default 20. A
	// collective's baseline is the median of its last BaselineMax
	// (default 100) times before the judged window, kept while no
	// communication-slow finding stands on it.
	Baseline    int
	BaselineMax int
	// StepBaseline is how many step intervals make the step time's
	// baseline (their median), default 50.
	StepBaseline int
	// Drift, Limit and Clip are the step-time CUSUM's allowance, alarm
	// level and per-sample clip, in log units: defaults 0.05 (half of a
	// 10% shift), 1.5 and 0.3 (one checkpoint step counts as a 35% step).
	Drift, Limit, Clip float64
	// Hold is how long (in the collectives' own time) a finding must hold
	// before it is raised, default 3 s; DiffuseHold the same for one that
	// names no node (communication-slow on every link, job-wide), default
	// 20 s.
	Hold, DiffuseHold time.Duration
}

func (c Config) withDefaults() Config {
	def := func(v *float64, d float64) {
		if *v <= 0 {
			*v = d
		}
	}
	if c.Window <= 0 {
		c.Window = 10
	}
	if c.LateFloor <= 0 {
		c.LateFloor = 10 * time.Millisecond
	}
	if c.MinBytes == 0 {
		c.MinBytes = 64 << 10
	}
	if c.Baseline <= 0 {
		c.Baseline = 20
	}
	if c.StepBaseline <= 0 {
		c.StepBaseline = 50
	}
	if c.CommWindow <= 0 {
		c.CommWindow = 3 * c.Window
	}
	if c.BaselineMax < c.Baseline {
		c.BaselineMax = max(100, c.Baseline)
	}
	if c.Hold <= 0 {
		c.Hold = 3 * time.Second
	}
	if c.DiffuseHold <= 0 {
		c.DiffuseHold = 20 * time.Second
	}
	def(&c.LateShare, 0.1)
	def(&c.LastShare, 0.7)
	def(&c.CommSlow, 1.8)
	def(&c.Drift, 0.05)
	def(&c.Limit, 1.5)
	def(&c.Clip, 0.3)
	return c
}

// hold is how long f must hold before it is raised: a finding that names
// no node (every link of a communicator slow, the whole job slower) is
// what a busy shared host or a noisy neighbour looks like for a while, so
// it must last longer than one that points at a rank or a node.
func (a *Analyzer) hold(f *Finding) time.Duration {
	if f.Class == ComputeSlow || f.Node != "" {
		return a.cfg.Hold
	}
	return a.cfg.DiffuseHold
}

// Defaults returns the settings a zero Config takes.
func Defaults() Config { return Config{}.withDefaults() }

// pendingMax bounds the collectives of a communicator waiting for ranks
// (a second of telemetry from a late node at a high rate): one whose ranks
// never all report (a lost event) is dropped when its slot is needed.
const pendingMax = 64

// Analyzer is the memory between passes. It is not safe for concurrent use.
type Analyzer struct {
	cfg  Config
	jobs map[string]*jobState
	// scratch space for summarize and the rules
	scratch  []float64
	ratios   []float64
	bases    []keyBase
	byNode   map[string]int64
	exitNode map[string]int
}

type keyBase struct {
	key  baseKey
	base float64
}

// New returns an empty analyzer.
func New(cfg Config) *Analyzer {
	return &Analyzer{cfg: cfg.withDefaults(), jobs: map[string]*jobState{}, byNode: map[string]int64{}, exitNode: map[string]int{}}
}

type jobState struct {
	attempt  uint32
	comms    map[int]*commState
	late     map[int32]time.Duration // rolling lateness per rank
	findings map[string]*Finding
	// pending is when (the data's time) each finding not yet raised was
	// first seen to hold.
	pending map[string]int64
}

func newJob(attempt uint32) *jobState {
	return &jobState{attempt: attempt, comms: map[int]*commState{}, late: map[int32]time.Duration{}, findings: map[string]*Finding{},
		pending: map[string]int64{}}
}

// complete is one collective every rank has reported.
type complete struct {
	seq       uint64
	lastEnter int64
	exit      int64 // the median exit
	last      int32 // the rank that entered last
	lastNode  string
	medEnter  int64
	lateBy    int64 // how far after the median of the others it entered
	exitLast  string
	exitLate  int64 // how far after the median exit its node's ranks left
	took      int64 // exit − lastEnter
	bytes     uint64
	op        string
}

type commState struct {
	nranks int32
	// slots hold the collectives waiting for ranks, by seq modulo
	// pendingMax: a slot taken by a newer seq drops the older one.
	slots  []slot
	done   uint64               // highest complete seq
	window []complete           // the last CommWindow
	base   map[baseKey]*history // collective time per op and size
	slow   bool                 // a communication-slow finding stands
	bytes  uint64               // bytes over its life, to pick the busiest
	step   cusum                // its cadence, the job's step time when busiest
}

type slot struct {
	seq   uint64
	op    string
	bytes uint64
	calls []arrival
}

// arrival is one rank's part in a collective.
type arrival struct {
	rank        int32
	node        string
	enter, exit int64
}

type baseKey struct {
	op    string
	bytes uint64
}

// history is a bounded ring of a collective's times.
type history struct {
	vals []float64
	next int
	// med is the median of vals while fresh: judged four times a second,
	// it changes only as collectives leave the window.
	med   float64
	fresh bool
}

func (h *history) push(v float64, max int) {
	h.fresh = false
	if len(h.vals) < max {
		h.vals = append(h.vals, v)
		return
	}
	h.vals[h.next] = v
	h.next = (h.next + 1) % max
}

// median is the median of the history, sorted in scratch (returned for
// reuse).
func (h *history) median(scratch []float64) (float64, []float64) {
	if !h.fresh {
		scratch = append(scratch[:0], h.vals...)
		h.med, h.fresh = median(scratch), true
	}
	return h.med, scratch
}

type baseline struct {
	samples []float64
	value   float64 // median once len(samples) reaches Baseline
}

// cusum is the change-point state of a communicator's cadence.
type cusum struct {
	lastExit int64
	base     baseline
	mu       float64 // log baseline interval
	s        float64
	recent   []float64
	alarm    bool
}

// Add folds in one completed call of job's attempt. A call of a newer
// attempt starts the job over; one of an older attempt is ignored.
func (a *Analyzer) Add(job string, attempt uint32, c Call) {
	j := a.jobs[job]
	if j == nil || attempt > j.attempt {
		j = newJob(attempt)
		a.jobs[job] = j
	}
	if attempt < j.attempt || c.NRanks < 2 || c.Seq == 0 {
		return
	}
	cs := j.comms[c.Comm]
	if cs == nil || cs.nranks != c.NRanks {
		// A new size is a new baseline.
		cs = &commState{nranks: c.NRanks, slots: make([]slot, pendingMax), base: map[baseKey]*history{}}
		j.comms[c.Comm] = cs
	}
	if c.Seq+pendingMax <= cs.done {
		return
	}
	sl := &cs.slots[c.Seq%pendingMax]
	if sl.seq != c.Seq {
		if sl.seq > c.Seq {
			return // the slot has moved on: this seq is too old
		}
		sl.seq, sl.op, sl.bytes, sl.calls = c.Seq, c.Op, c.Bytes, sl.calls[:0]
	}
	sl.calls = append(sl.calls, arrival{rank: c.Rank, node: c.Node, enter: c.Enter, exit: c.Exit})
	if int32(len(sl.calls)) < cs.nranks {
		return
	}
	cs.done = max(cs.done, c.Seq)
	cs.bytes += c.Bytes
	cp := a.summarize(sl)
	for _, r := range sl.calls {
		d := time.Duration(max(r.enter-cp.medEnter, 0))
		j.late[r.rank] = j.late[r.rank]*9/10 + d/10
	}
	sl.seq, sl.calls = 0, sl.calls[:0]
	if st := &cs.step; cp.exit > st.lastExit {
		if st.lastExit > 0 {
			a.stepSample(st, math.Log(float64(cp.exit-st.lastExit)))
		}
		st.lastExit = cp.exit
	}
	if len(cs.window) == a.cfg.CommWindow {
		// The oldest leaves the judged window for the baseline, unless
		// the communicator is slow now: a slowdown is not the new normal.
		if old := cs.window[0]; !cs.slow && old.bytes >= a.cfg.MinBytes && old.took > 0 {
			k := baseKey{old.op, old.bytes}
			h := cs.base[k]
			if h == nil {
				h = &history{}
				cs.base[k] = h
			}
			h.push(float64(old.took), a.cfg.BaselineMax)
		}
		copy(cs.window, cs.window[1:])
		cs.window = cs.window[:len(cs.window)-1]
	}
	cs.window = append(cs.window, cp)
}

func (b *baseline) add(v float64, n int) {
	if len(b.samples) >= n {
		return
	}
	b.samples = append(b.samples, v)
	if len(b.samples) == n {
		b.value = median(slices.Clone(b.samples))
	}
}

// summarize reduces a collective every rank has reported to what the rules
// judge, with the analyzer's scratch space.
func (a *Analyzer) summarize(sl *slot) complete {
	p := sl.calls
	cp := complete{seq: sl.seq, op: sl.op, bytes: sl.bytes}
	li := 0
	for i, r := range p {
		if r.enter >= cp.lastEnter {
			cp.lastEnter, cp.last, cp.lastNode, li = r.enter, r.rank, r.node, i
		}
	}
	v := a.scratch[:0]
	for _, r := range p {
		v = append(v, float64(r.enter))
	}
	cp.medEnter = int64(median(v))
	// Against the others, so that of two ranks the late one is late by
	// the whole gap.
	v = v[:0]
	for i, r := range p {
		if i != li {
			v = append(v, float64(r.enter))
		}
	}
	cp.lateBy = cp.lastEnter - int64(median(v))
	v = v[:0]
	for _, r := range p {
		v = append(v, float64(r.exit))
	}
	cp.exit = int64(median(v))
	cp.took = cp.exit - cp.lastEnter
	// The node whose ranks leave last, by their earliest exit: a node
	// holding a slow link keeps all its ranks in the collective.
	byNode := a.byNode
	clear(byNode)
	for _, r := range p {
		if e, ok := byNode[r.node]; !ok || r.exit < e {
			byNode[r.node] = r.exit
		}
	}
	for n, e := range byNode {
		if cp.exitLast == "" || e > byNode[cp.exitLast] || e == byNode[cp.exitLast] && n < cp.exitLast {
			cp.exitLast = n
		}
	}
	v = v[:0]
	for n, e := range byNode {
		if n != cp.exitLast {
			v = append(v, float64(e))
		}
	}
	if len(v) > 0 {
		cp.exitLate = byNode[cp.exitLast] - int64(median(v))
	}
	a.scratch = v
	return cp
}

// median sorts v.
func median(v []float64) float64 {
	if len(v) == 0 {
		return 0
	}
	slices.Sort(v)
	n := len(v)
	if n%2 == 1 {
		return v[n/2]
	}
	return (v[n/2-1] + v[n/2]) / 2
}

// Judge runs the rules over every job in jobs (the running ones: the
// others are forgotten, their findings cleared) and returns what was
// raised and cleared, in job, class, key order.
func (a *Analyzer) Judge(jobs []Job) []Change {
	var out []Change
	running := map[string]bool{}
	for _, in := range jobs {
		running[in.ID] = true
		j := a.jobs[in.ID]
		if j == nil {
			continue
		}
		if in.Attempt > j.attempt {
			// Restarted: nothing seen so far is about the new attempt.
			out = append(out, clearAll(in.ID, j, "the job restarted")...)
			a.jobs[in.ID] = newJob(in.Attempt)
			continue
		}
		out = append(out, a.judgeJob(in, j)...)
	}
	for id, j := range a.jobs {
		if !running[id] {
			out = append(out, clearAll(id, j, "the job is no longer running")...)
			delete(a.jobs, id)
		}
	}
	slices.SortStableFunc(out, func(x, y Change) int {
		return cmp.Or(cmp.Compare(x.Finding.Job, y.Finding.Job), cmp.Compare(x.Finding.Key(), y.Finding.Key()))
	})
	return out
}

func clearAll(id string, j *jobState, why string) []Change {
	var out []Change
	for _, f := range j.findings {
		out = append(out, Change{Finding: *f, Cleared: true, Why: why})
	}
	return out
}

// judgeJob applies the rules to one job: compute-slow first, then a slow
// collective on a communicator no late rank explains, then the step time
// when neither explains it.
func (a *Analyzer) judgeJob(in Job, j *jobState) []Change {
	now := map[string]*Finding{}
	gpus := map[int32]GPU{}
	for _, g := range in.GPUs {
		gpus[g.Rank] = g
	}
	idx := slices.Sorted(mapsKeys(j.comms))
	busiest, blamed := -1, false
	for _, ci := range idx {
		cs := j.comms[ci]
		if busiest < 0 || cs.bytes > j.comms[busiest].bytes {
			busiest = ci
		}
		f, lateCount := a.computeSlow(in.ID, ci, cs, gpus, j.findings)
		if f == nil {
			f = a.commSlow(in.ID, ci, cs, j.findings)
		}
		cs.slow = f != nil && f.Class == CommunicationSlow
		if f != nil {
			now[f.Key()] = f
		}
		// One rank late in a quarter of the window: a slow rank may be
		// building up, and the step time is not every rank's.
		blamed = blamed || 4*lateCount >= a.cfg.Window
	}
	// A slowdown a rank or a collective explains is not job-wide, nor a
	// new step-time level to alarm on once it ends.
	switch {
	case busiest < 0:
	case len(now) > 0 || blamed:
		st := &j.comms[busiest].step
		st.s, st.alarm = 0, false
	default:
		_, had := j.findings[(&Finding{Job: in.ID, Class: JobWide}).Key()]
		if f := a.stepShift(in.ID, j.comms[busiest], had); f != nil {
			now[f.Key()] = f
		}
	}
	for k := range j.pending {
		if _, ok := now[k]; !ok {
			delete(j.pending, k)
		}
	}
	var out []Change
	for k, f := range now {
		if old, ok := j.findings[k]; ok {
			f.Since = old.Since
			continue
		}
		// Raised once it has held for its hold time, from when it began.
		first, ok := j.pending[k]
		if !ok {
			first = f.Since
			j.pending[k] = first
		}
		if time.Duration(f.Since-first) < a.hold(f) {
			delete(now, k)
			continue
		}
		delete(j.pending, k)
		f.Since = first
		out = append(out, Change{Finding: *f})
	}
	for k, f := range j.findings {
		if _, ok := now[k]; !ok {
			out = append(out, Change{Finding: *f, Cleared: true, Why: "it runs at its usual pace again"})
		}
	}
	j.findings = now
	return out
}

func mapsKeys[M ~map[K]V, K comparable, V any](m M) func(func(K) bool) {
	return func(yield func(K) bool) {
		for k := range m {
			if !yield(k) {
				return
			}
		}
	}
}

// cadence is the median interval between the window's collectives.
func cadence(w []complete) float64 {
	if len(w) < 2 {
		return 0
	}
	iv := make([]float64, 0, len(w)-1)
	for i := 1; i < len(w); i++ {
		iv = append(iv, float64(w[i].lastEnter-w[i-1].lastEnter))
	}
	return median(iv)
}

// computeSlow: one rank entered last, late by more than the threshold, in
// LastShare of a full window (half of it to stay found). It also returns
// in how many of the window the most often late rank was late.
func (a *Analyzer) computeSlow(job string, ci int, cs *commState, gpus map[int32]GPU, had map[string]*Finding) (*Finding, int) {
	if len(cs.window) < a.cfg.Window {
		return nil, 0
	}
	w := cs.window[len(cs.window)-a.cfg.Window:]
	cad := cadence(w)
	thr := max(a.cfg.LateShare*cad, float64(a.cfg.LateFloor))
	count := map[int32]int{}
	lates := map[int32][]float64{}
	node := map[int32]string{}
	for _, c := range w {
		if float64(c.lateBy) > thr {
			count[c.last]++
			lates[c.last] = append(lates[c.last], float64(c.lateBy))
			node[c.last] = c.lastNode
		}
	}
	var best int32 = -1
	for r, n := range count {
		if best < 0 || n > count[best] || n == count[best] && r < best {
			best = r
		}
	}
	if best < 0 {
		return nil, 0
	}
	need := a.cfg.LastShare
	if _, ok := had[(&Finding{Job: job, Class: ComputeSlow, Rank: best}).Key()]; ok {
		need /= 2
	}
	if float64(count[best]) < need*float64(len(w)) {
		return nil, count[best]
	}
	late := median(lates[best])
	f := &Finding{Job: job, Class: ComputeSlow, Rank: best, Node: node[best], Comm: ci,
		Since: cs.window[len(cs.window)-1].exit, Late: time.Duration(late)}
	if cad > late {
		f.Slowdown = cad / (cad - late)
	}
	ev := fmt.Sprintf("rank %d entered last in %d of the last %d collectives on communicator %d, %s after the median of its peers",
		best, count[best], len(w), ci, f.Late.Round(time.Millisecond))
	if g, ok := gpus[best]; ok && (g.Clock > 0 && g.Clock < 0.95 || len(g.Throttle) > 0) {
		ev += fmt.Sprintf("; its GPU's SM clock is %.0f%% of its peers'", 100*g.Clock)
		if len(g.Throttle) > 0 {
			ev += " (" + strings.Join(g.Throttle, ", ") + ")"
		}
	} else {
		ev += "; its GPU shows no slowdown (host CPU, data loading?)"
	}
	f.Evidence = ev
	return f, count[best]
}

// commSlow: the window's collectives of a size with a baseline take
// CommSlow times their baseline on the median (a finding stays while they
// take more than half the excess).
func (a *Analyzer) commSlow(job string, ci int, cs *commState, had map[string]*Finding) *Finding {
	if len(cs.window) < a.cfg.CommWindow {
		return nil
	}
	ratios := a.ratios[:0]
	defer func() { a.ratios = ratios }()
	exitNode := a.exitNode
	clear(exitNode)
	var bus float64
	// A window holds few sizes: a short list beats a map of string keys.
	base := a.bases[:0]
	defer func() { a.bases = base }()
	for _, c := range cs.window {
		k := baseKey{c.op, c.bytes}
		i := slices.IndexFunc(base, func(kb keyBase) bool { return kb.key == k })
		if i < 0 {
			var b float64
			if h := cs.base[k]; h != nil && len(h.vals) >= a.cfg.Baseline {
				b, a.scratch = h.median(a.scratch)
			}
			i = len(base)
			base = append(base, keyBase{k, b})
		}
		b := base[i].base
		if b <= 0 || c.took <= 0 {
			continue
		}
		ratios = append(ratios, float64(c.took)/b)
		if c.exitLate > 0 && float64(c.exitLate) > 0.2*float64(c.took) {
			exitNode[c.exitLast]++
		}
		bus = float64(c.bytes) * 2 * float64(cs.nranks-1) / float64(cs.nranks) / (float64(c.took) / 1e9)
	}
	if len(ratios) < a.cfg.CommWindow/2 {
		return nil
	}
	r := median(ratios)
	need := a.cfg.CommSlow
	k := (&Finding{Job: job, Class: CommunicationSlow, Comm: ci}).Key()
	if _, ok := had[k]; ok {
		need = 1 + (need-1)/2
	}
	if r < need {
		return nil
	}
	f := &Finding{Job: job, Class: CommunicationSlow, Rank: -1, Comm: ci, Since: cs.window[len(cs.window)-1].exit, Slowdown: r}
	ev := fmt.Sprintf("the ranks enter together but collectives on communicator %d take %.2f× their baseline (bus bandwidth %.0f MB/s, %.0f%% of its own)",
		ci, r, bus/1e6, 100/r)
	for n, c := range exitNode {
		if 2*c >= len(ratios) && (f.Node == "" || c > exitNode[f.Node] || c == exitNode[f.Node] && n < f.Node) {
			f.Node = n
		}
	}
	if f.Node != "" {
		ev += fmt.Sprintf("; node %s's ranks leave them last in %d of %d", f.Node, exitNode[f.Node], len(ratios))
	}
	f.Evidence = ev
	return f
}

// stepShift returns a job-wide finding while the busiest communicator's
// cadence CUSUM alarms and the median of its recent intervals shows the
// shift (twice the drift, about 10%), so a burst of slow steps is not a
// new level; once found it stays until the alarm clears.
func (a *Analyzer) stepShift(job string, cs *commState, had bool) *Finding {
	st := &cs.step
	if !st.alarm {
		return nil
	}
	m := median(slices.Clone(st.recent)) - st.mu
	if !had && m < 2*a.cfg.Drift {
		return nil
	}
	sd := math.Exp(m)
	return &Finding{Job: job, Class: JobWide, Rank: -1, Comm: -1, Since: st.lastExit, Slowdown: sd,
		Evidence: fmt.Sprintf("every rank is slower: the step time is %.2f× its baseline of %s, with no late rank or slow collective to blame (storage, data loading, checkpoints?)",
			sd, time.Duration(math.Exp(st.mu)).Round(time.Millisecond))}
}

func (a *Analyzer) stepSample(st *cusum, x float64) {
	if st.base.value == 0 {
		st.base.add(x, a.cfg.StepBaseline)
		if st.base.value != 0 {
			st.mu = st.base.value
		}
		return
	}
	st.recent = append(st.recent, x)
	if len(st.recent) > a.cfg.Window {
		st.recent = st.recent[1:]
	}
	d := min(x-st.mu, a.cfg.Clip)
	st.s = max(0, st.s+d-a.cfg.Drift)
	switch {
	case !st.alarm && st.s > a.cfg.Limit:
		st.alarm = true
	case st.alarm && len(st.recent) == a.cfg.Window && median(slices.Clone(st.recent))-st.mu < a.cfg.Drift:
		st.alarm, st.s = false, 0
	}
}

// Lateness returns each rank's rolling lateness in job (how far after the
// median of its peers it enters collectives, an exponential average).
func (a *Analyzer) Lateness(job string) map[int32]time.Duration {
	j := a.jobs[job]
	if j == nil {
		return nil
	}
	return j.late
}

// Slowdown returns job's step time (the cadence of its busiest
// communicator) over its baseline, 1 before a baseline exists.
func (a *Analyzer) Slowdown(job string) float64 {
	j := a.jobs[job]
	if j == nil {
		return 1
	}
	var busiest *commState
	for _, cs := range j.comms {
		if busiest == nil || cs.bytes > busiest.bytes {
			busiest = cs
		}
	}
	if busiest == nil || busiest.step.mu == 0 || len(busiest.step.recent) == 0 {
		return 1
	}
	return math.Exp(median(slices.Clone(busiest.step.recent)) - busiest.step.mu)
}

// Findings returns the findings standing now, by job and key.
func (a *Analyzer) Findings() []Finding {
	var out []Finding
	for _, j := range a.jobs {
		for _, f := range j.findings {
			out = append(out, *f)
		}
	}
	slices.SortFunc(out, func(x, y Finding) int { return cmp.Or(cmp.Compare(x.Job, y.Job), cmp.Compare(x.Key(), y.Key())) })
	return out
}
