package controlplane

import (
	"context"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"google.golang.org/protobuf/proto"

	"github.com/gpuctl/gpuctl/api"
	"github.com/gpuctl/gpuctl/jobspec"
)

// NCCL stall detection. Every rank numbers the collectives it makes on a
// communicator (the eBPF probe's per-(pid, communicator) seq), so the
// ranks of a healthy job never disagree for long: a collective completes
// on every rank or on none. When ranks disagree on where they are (some
// inside collective k+1 or past it, others still at k), or all sit inside
// the same collective, for longer than the job's stall threshold, the
// communicator is stalled; the ranks furthest behind (or, when all are
// inside, the stopped or idle ones) are the ones holding it up.

// stallRank is one live rank at one instant, as the detector sees it.
type stallRank struct {
	rank      int32
	node      string
	pid       uint32
	procState string
	cpu       float64
	// comms are the rank's communicators in creation order, so the i-th
	// communicator of every rank of a job is the same one: the handles
	// themselves are addresses in each rank's own memory.
	comms []stallComm
}

// stallComm is one communicator of one rank.
type stallComm struct {
	handle uint64
	// created is when ncclCommInitRank returned (unix ns), 0 if not traced.
	created int64
	// done is the last completed collective's seq and op.
	done   uint64
	doneOp api.NCCLOp
	// in is the collective in progress, nil between calls.
	in *api.CollectiveRecord
}

// position orders a rank's progress on a communicator: 2k once it has
// completed collective k, 2k-1 while it is inside collective k.
func (c *stallComm) position() uint64 {
	p := 2 * c.done
	if c.in != nil && c.in.GetSeq() > 0 && 2*c.in.GetSeq()-1 > p {
		p = 2*c.in.GetSeq() - 1
	}
	return p
}

// inCall reports whether the rank is inside the collective after done.
func (c *stallComm) inCall() bool { return c.position()%2 == 1 }

// stallJob is one running job at one instant.
type stallJob struct {
	id        string
	attempt   uint32
	threshold time.Duration
	ranks     []stallRank
}

type stallKey struct {
	job  string
	comm int
}

type pidKey struct {
	node string
	pid  uint32
}

// stallTrack follows one communicator while its ranks disagree.
type stallTrack struct {
	// low is the lowest position of its ranks; since is when the ranks
	// began to disagree with the lowest at low. Progress of the lowest
	// rank restarts the clock.
	low   uint64
	since time.Time
	// stall is set once declared.
	stall *api.Stall
}

type cpuMark struct {
	seconds float64
	changed time.Time
}

// stallChange is a stall declared or cleared by one update.
type stallChange struct {
	stall   *api.Stall
	cleared bool
	// why a cleared stall ended.
	why string
	// lasted is how long a cleared stall lasted from its start.
	lasted time.Duration
}

// stallDetector is the detector's memory between updates. update is a
// pure function of it, the time and the snapshot, so tests drive it with
// constructed snapshots.
type stallDetector struct {
	mu     sync.Mutex
	tracks map[stallKey]*stallTrack
	cpu    map[pidKey]cpuMark
}

func newStallDetector() *stallDetector {
	return &stallDetector{tracks: map[stallKey]*stallTrack{}, cpu: map[pidKey]cpuMark{}}
}

// update folds in one snapshot of every running job and returns the
// stalls declared and cleared by it, declared ones in job and comm order.
func (d *stallDetector) update(now time.Time, jobs []stallJob) []stallChange {
	d.mu.Lock()
	defer d.mu.Unlock()
	var changes []stallChange
	running := map[string]bool{}
	seen := map[stallKey]bool{}
	seenPid := map[pidKey]bool{}
	for _, j := range jobs {
		running[j.id] = true
		ncomm := 0
		for _, r := range j.ranks {
			k := pidKey{r.node, r.pid}
			seenPid[k] = true
			if m, ok := d.cpu[k]; !ok || m.seconds != r.cpu {
				d.cpu[k] = cpuMark{seconds: r.cpu, changed: now}
			}
			ncomm = max(ncomm, len(r.comms))
		}
		for c := range ncomm {
			var members []*stallRank
			for i := range j.ranks {
				if c < len(j.ranks[i].comms) {
					members = append(members, &j.ranks[i])
				}
			}
			if len(members) < 2 {
				continue
			}
			low, agree := progress(members, c)
			if agree {
				continue
			}
			key := stallKey{j.id, c}
			seen[key] = true
			t := d.tracks[key]
			if t != nil && t.low != low {
				if t.stall != nil {
					changes = append(changes, stallChange{stall: t.stall, cleared: true, why: "the ranks progress again", lasted: now.Sub(t.since)})
				}
				t = nil
			}
			if t == nil {
				t = &stallTrack{low: low, since: now}
				d.tracks[key] = t
			}
			if now.Sub(t.since) < j.threshold {
				continue
			}
			s := d.diagnose(j, c, members, t.since, now)
			if t.stall == nil {
				changes = append(changes, stallChange{stall: s})
			}
			t.stall = s
		}
	}
	for key, t := range d.tracks {
		if seen[key] {
			continue
		}
		if t.stall != nil {
			why := "the ranks progress again"
			if !running[key.job] {
				why = "the job is no longer running"
			}
			changes = append(changes, stallChange{stall: t.stall, cleared: true, why: why, lasted: now.Sub(t.since)})
		}
		delete(d.tracks, key)
	}
	for k := range d.cpu {
		if !seenPid[k] {
			delete(d.cpu, k)
		}
	}
	slices.SortStableFunc(changes, func(a, b stallChange) int { return compareStalls(a.stall, b.stall) })
	return changes
}

// progress returns the lowest position of the members on communicator c,
// and whether they agree: all between the same two collectives.
func progress(members []*stallRank, c int) (low uint64, agree bool) {
	low = members[0].comms[c].position()
	high := low
	for _, r := range members[1:] {
		p := r.comms[c].position()
		low, high = min(low, p), max(high, p)
	}
	return low, low == high && low%2 == 0
}

// diagnose names the ranks holding communicator c up and the ones waiting.
func (d *stallDetector) diagnose(j stallJob, c int, members []*stallRank, since, now time.Time) *api.Stall {
	low, _ := progress(members, c)
	allInside := true
	for _, r := range members {
		if r.comms[c].position() != low {
			allInside = false
		}
	}
	var lagging, waiting []*stallRank
	switch {
	case !allInside:
		// The ranks furthest behind are the ones the others wait for.
		for _, r := range members {
			if r.comms[c].position() == low {
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
			if stopped(r.procState) {
				lagging = append(lagging, r)
			}
		}
		if len(lagging) == 0 {
			var idle []*stallRank
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
	s := &api.Stall{Job: j.id, Comm: members[0].comms[c].handle, SinceUnixNano: since.UnixNano(), ThresholdNs: int64(j.threshold)}
	for _, r := range lagging {
		s.LaggingRanks = append(s.LaggingRanks, stalledRank(r, c))
	}
	for _, r := range waiting {
		s.WaitingRanks = append(s.WaitingRanks, stalledRank(r, c))
	}
	s.Diagnosis = d.diagnosis(c, members, lagging, waiting, since, now)
	return s
}

func stalledRank(r *stallRank, c int) *api.StalledRank {
	cm := &r.comms[c]
	sr := &api.StalledRank{Rank: r.rank, Node: r.node, Pid: r.pid, Op: cm.doneOp, Seq: cm.done, ProcState: r.procState}
	if cm.inCall() {
		sr.InCall, sr.Op, sr.Seq = true, cm.in.GetOp(), cm.in.GetSeq()
	}
	return sr
}

func stopped(procState string) bool { return procState == "T" || procState == "t" }

// cpuSince reports whether r used CPU after t.
func (d *stallDetector) cpuSince(r *stallRank, t time.Time) bool {
	m, ok := d.cpu[pidKey{r.node, r.pid}]
	return ok && m.changed.After(t)
}

// diagnosis says in a sentence what holds the communicator up:
// "rank 2 (node-01 pid 4242) is stopped (SIGSTOP?) after allreduce seq 41;
// ranks 0,1,3 wait in allreduce seq 42 for 5.2s".
func (d *stallDetector) diagnosis(c int, members, lagging, waiting []*stallRank, since, now time.Time) string {
	dur := now.Sub(since).Round(100 * time.Millisecond)
	var parts []string
	for _, r := range lagging {
		parts = append(parts, fmt.Sprintf("rank %d (%s pid %d) %s %s", r.rank, r.node, r.pid, d.doing(r, c, since), where(&r.comms[c])))
	}
	if len(lagging) == 0 {
		cm := &members[0].comms[c]
		return fmt.Sprintf("all %d ranks wait in %s seq %d for %s and none is stopped or idle: suspect the network between them or a hung GPU",
			len(members), cm.in.GetOp().Short(), cm.in.GetSeq(), dur)
	}
	// Group the waiting ranks by where they are.
	type at struct {
		in  bool
		op  api.NCCLOp
		seq uint64
	}
	var order []at
	groups := map[at][]int32{}
	for _, r := range waiting {
		sr := stalledRank(r, c)
		a := at{sr.GetInCall(), sr.GetOp(), sr.GetSeq()}
		if _, ok := groups[a]; !ok {
			order = append(order, a)
		}
		groups[a] = append(groups[a], r.rank)
	}
	for _, a := range order {
		verb := "wait in"
		if !a.in {
			verb = "are past"
		}
		parts = append(parts, fmt.Sprintf("%s %s %s seq %d", rankList(groups[a]), verb, a.op.Short(), a.seq))
	}
	return strings.Join(parts, "; ") + " for " + dur.String()
}

// doing says what a lagging rank's process is doing.
func (d *stallDetector) doing(r *stallRank, c int, since time.Time) string {
	switch r.procState {
	case "T", "t":
		return "is stopped (SIGSTOP?)"
	case "Z", "X":
		return "has exited"
	case "D":
		return "is blocked in the kernel (state D)"
	}
	if d.cpuSince(r, since) {
		if r.comms[c].inCall() {
			return "is running"
		}
		return "is busy outside NCCL"
	}
	return "makes no CPU progress"
}

// where says where a rank is on its communicator.
func where(cm *stallComm) string {
	switch {
	case cm.inCall():
		return fmt.Sprintf("inside %s seq %d", cm.in.GetOp().Short(), cm.in.GetSeq())
	case cm.done > 0:
		return fmt.Sprintf("after %s seq %d", cm.doneOp.Short(), cm.done)
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

func compareStalls(a, b *api.Stall) int {
	if c := strings.Compare(a.GetJob(), b.GetJob()); c != 0 {
		return c
	}
	if c := cmpInt(a.GetSinceUnixNano(), b.GetSinceUnixNano()); c != 0 {
		return c
	}
	return cmpInt(a.GetComm(), b.GetComm())
}

// list returns copies of the declared stalls of job ("" = every job),
// by job, oldest first.
func (d *stallDetector) list(job string) []*api.Stall {
	d.mu.Lock()
	defer d.mu.Unlock()
	var out []*api.Stall
	for key, t := range d.tracks {
		if t.stall != nil && (job == "" || key.job == job) {
			out = append(out, proto.Clone(t.stall).(*api.Stall))
		}
	}
	slices.SortFunc(out, compareStalls)
	return out
}

// stalledJobs is the set of jobs with a declared stall.
func (d *stallDetector) stalledJobs() map[string]bool {
	d.mu.Lock()
	defer d.mu.Unlock()
	out := map[string]bool{}
	for key, t := range d.tracks {
		if t.stall != nil {
			out[key.job] = true
		}
	}
	return out
}

// ------------------------------------------------------------ inputs

func isCollective(op api.NCCLOp) bool {
	switch op {
	case api.NCCLOp_NCCL_OP_ALL_REDUCE, api.NCCLOp_NCCL_OP_ALL_GATHER, api.NCCLOp_NCCL_OP_REDUCE_SCATTER,
		api.NCCLOp_NCCL_OP_BROADCAST, api.NCCLOp_NCCL_OP_REDUCE:
		return true
	}
	return false
}

// stallJobs lists the jobs the detector watches: running, not being
// stopped, with the stall threshold of their job file.
func (m *jobManager) stallJobs() []stallJob {
	m.mu.Lock()
	defer m.mu.Unlock()
	var out []stallJob
	for _, en := range m.sortedLocked() {
		j := en.job
		if j.GetState() != api.JobState_JOB_STATE_RUNNING || j.GetStopping() != api.JobStop_JOB_STOP_NONE || en.spec == nil {
			continue
		}
		th := en.spec.StallThreshold
		if th <= 0 {
			th = jobspec.DefaultStallThreshold
		}
		out = append(out, stallJob{id: j.GetId(), attempt: j.GetAttempt(), threshold: th})
	}
	return out
}

// markStalled sets Job.stalled on exactly the jobs in stalled, persisting
// the jobs whose flag changed (a flag left from before a restart clears).
func (m *jobManager) markStalled(stalled map[string]bool) {
	m.mu.Lock()
	defer m.mu.Unlock()
	for id, en := range m.jobs {
		if en.job.GetStalled() != stalled[id] {
			en.job.Stalled = stalled[id]
			m.persistLocked(en)
		}
	}
}

// lookup returns a copy of the job named by id or name.
func (m *jobManager) lookup(key string) (*api.Job, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	en, err := m.findLocked(key)
	if err != nil {
		return nil, err
	}
	return proto.Clone(en.job).(*api.Job), nil
}

// fillStallRanks adds to each job the live ranks of its current attempt
// that connected nodes report, with their communicators' progress: the
// last completed collective per communicator and the one in progress.
func (s *state) fillStallRanks(jobs []stallJob) {
	s.mu.RLock()
	defer s.mu.RUnlock()
	idx := make(map[string]int, len(jobs))
	for i, j := range jobs {
		idx[j.id] = i
	}
	type ref struct{ job, rank int }
	refs := map[pidKey]ref{}
	comms := map[pidKey]map[uint64]*stallComm{}
	comm := func(k pidKey, handle uint64) *stallComm {
		m := comms[k]
		if m == nil {
			m = map[uint64]*stallComm{}
			comms[k] = m
		}
		c := m[handle]
		if c == nil {
			c = &stallComm{handle: handle}
			m[handle] = c
		}
		return c
	}
	for name, e := range s.nodes {
		// A lost node's last report is stale; the failure detector acts on it.
		if e.session == nil || e.down {
			continue
		}
		for _, r := range e.ranks {
			i, ok := idx[r.GetJob()]
			if !ok || (r.GetAttempt() != 0 && r.GetAttempt() != jobs[i].attempt) {
				continue
			}
			jobs[i].ranks = append(jobs[i].ranks, stallRank{rank: r.GetRank(), node: name, pid: r.GetPid(),
				procState: r.GetProcState(), cpu: r.GetCpuSeconds()})
			refs[pidKey{name, r.GetPid()}] = ref{i, len(jobs[i].ranks) - 1}
		}
		for _, c := range e.inFlight {
			k := pidKey{name, c.GetPid()}
			if _, ok := refs[k]; !ok || !isCollective(c.GetOp()) {
				continue
			}
			sc := comm(k, c.GetComm())
			if sc.in == nil || c.GetSeq() > sc.in.GetSeq() {
				sc.in = c
			}
		}
	}
	for k, st := range s.collectives {
		pk := pidKey{k.node, k.pid}
		if _, ok := refs[pk]; !ok {
			continue
		}
		switch {
		case k.op == api.NCCLOp_NCCL_OP_COMM_INIT_RANK:
			if k.comm != 0 {
				comm(pk, k.comm).created = st.GetLastUnixNano()
			}
		case isCollective(k.op):
			if sc := comm(pk, k.comm); st.GetSeq() > sc.done {
				sc.done, sc.doneOp = st.GetSeq(), k.op
			}
		}
	}
	for pk, rf := range refs {
		r := &jobs[rf.job].ranks[rf.rank]
		for _, c := range comms[pk] {
			r.comms = append(r.comms, *c)
		}
		slices.SortFunc(r.comms, func(a, b stallComm) int {
			// Traced creation order first; communicators whose creation was
			// not seen follow, by handle.
			switch {
			case a.created != 0 && b.created != 0 && a.created != b.created:
				return cmpInt(a.created, b.created)
			case a.created != 0 && b.created == 0:
				return -1
			case a.created == 0 && b.created != 0:
				return 1
			}
			return cmpInt(a.handle, b.handle)
		})
	}
	for i := range jobs {
		slices.SortFunc(jobs[i].ranks, func(a, b stallRank) int { return int(a.rank) - int(b.rank) })
	}
}

func cmpInt[T int64 | uint64](a, b T) int {
	switch {
	case a < b:
		return -1
	case a > b:
		return 1
	}
	return 0
}

// ------------------------------------------------------------ the loop

// watchStalls runs the stall detector until ctx ends.
func (s *Server) watchStalls(ctx context.Context) {
	t := time.NewTicker(s.cfg.StallEvery)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			s.checkStalls(s.now())
		}
	}
}

// checkStalls is one pass of the detector: raise an event for every stall
// declared or cleared, keep Job.stalled in step, and hand new stalls to
// the recovery hook.
func (s *Server) checkStalls(now time.Time) {
	// A listing sees a pass whole: a stall shows once its event is stored
	// and its job marked, never before.
	s.stallPass.Lock()
	defer s.stallPass.Unlock()
	jobs := s.jobs.stallJobs()
	s.st.fillStallRanks(jobs)
	changes := s.stalls.update(now, jobs)
	for _, ch := range changes {
		st := ch.stall
		e := &api.Event{TimeUnixNano: now.UnixNano(), Kind: api.EventKind_EVENT_KIND_STALL, Job: st.GetJob(),
			Attrs: map[string]string{"comm": fmt.Sprintf("%#x", st.GetComm())}}
		if first := firstRank(st); first != nil {
			e.Node, e.Pid, e.Rank = first.GetNode(), first.GetPid(), first.GetRank()
		}
		if ch.cleared {
			e.Severity = api.Severity_SEVERITY_INFO
			e.Message = fmt.Sprintf("NCCL stall cleared after %s: %s (was: %s)", ch.lasted.Round(100*time.Millisecond), ch.why, st.GetDiagnosis())
			s.log.Info("stall cleared", "job", st.GetJob(), "comm", e.Attrs["comm"], "why", ch.why)
		} else {
			e.Severity = api.Severity_SEVERITY_CRITICAL
			e.Message = "NCCL stall: " + st.GetDiagnosis()
			s.log.Warn("stall declared", "job", st.GetJob(), "comm", e.Attrs["comm"], "diagnosis", st.GetDiagnosis())
		}
		s.st.raise(e)
		if !ch.cleared && s.onStall != nil {
			go s.onStall(proto.Clone(st).(*api.Stall))
		}
	}
	s.jobs.markStalled(s.stalls.stalledJobs())
}

// firstRank is the rank an event about the stall names: the first
// lagging one, else the first waiting one.
func firstRank(st *api.Stall) *api.StalledRank {
	if len(st.GetLaggingRanks()) > 0 {
		return st.GetLaggingRanks()[0]
	}
	if len(st.GetWaitingRanks()) > 0 {
		return st.GetWaitingRanks()[0]
	}
	return nil
}

// raise persists a server-side event and hands it to the event hook.
func (s *state) raise(e *api.Event) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.raiseLocked(e)
}

// Stalls returns the NCCL stalls declared now, of one job (id or name) or
// of every job when job is "".
func (s *Server) Stalls(job string) ([]*api.Stall, error) {
	s.stallPass.Lock()
	defer s.stallPass.Unlock()
	if job == "" {
		return s.stalls.list(""), nil
	}
	j, err := s.jobs.lookup(job)
	if err != nil {
		return nil, err
	}
	return s.stalls.list(j.GetId()), nil
}
