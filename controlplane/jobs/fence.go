package jobs

import (
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/gpuctl/gpuctl/api"
)

// Fencing: a rank never runs twice. Every attempt of a job is an epoch;
// a node's ranks run on the server's lease (nodes.Config.Lease), which
// their shims enforce. When a node is lost, its ranks of the job are given
// up, but they may still run there: no new attempt of the job starts
// until each such node is fenced, either confirmed free of the old
// attempt (it came back and reported, or killed, its ranks) or silent for
// longer than its lease plus fenceMargin, by when its shims have stopped
// them. A node that comes back has its ranks of superseded attempts killed
// before it is ready (nodes.Registry, from Superseded) and again here,
// from the owner's own state, which the committed view may trail.

// fenceMargin is added to a lost node's lease: its shims send SIGKILL
// within a fraction of it after the lease ends.
const fenceMargin = time.Second

// fence is a lost node that may still run an attempt of a job.
type fence struct {
	attempt uint32
	// until is when the node's lease has surely passed.
	until time.Time
}

// current reports whether rk, reported by node, is a live rank of j's
// current attempt as the server counts it. A rank the server gave up (lost
// with its node, unaccounted for after SIGKILL) is no longer current, even
// of the current attempt: something else may stand in for it.
func current(j *api.Job, node string, rk *api.RankStatus) bool {
	if rk.GetAttempt() != j.GetAttempt() {
		return false
	}
	r := findRank(j, node, rk.GetRank())
	return r != nil && !r.GetExited() && (r.GetPid() == 0 || r.GetPid() == rk.GetPid())
}

// superseded returns the ranks of running (reported by node) that belong
// to a job the server knows but not to its current attempt. Ranks of jobs
// it does not know (a validation gang, another cluster's) are left alone.
func superseded(job func(id string) *api.Job, node string, running []*api.RankStatus) []*api.RankStatus {
	var out []*api.RankStatus
	for _, rk := range running {
		j := job(rk.GetJob())
		if j == nil || current(j, node, rk) {
			continue
		}
		out = append(out, rk)
	}
	return out
}

// Superseded is nodes.Config.Superseded: of the ranks a (re)connecting
// node reports, those of attempts that are not current, by the committed
// jobs.
func (m *Manager) Superseded(node string, running []*api.RankStatus) []*api.RankStatus {
	v := m.View()
	if v == nil {
		return nil
	}
	return superseded(func(id string) *api.Job { return v.byID[id] }, node, running)
}

// awaitFence records that node, just lost, may still run job en's current
// attempt until its lease has passed (counted from the node's last
// contact).
func (m *Manager) awaitFence(en *entry, node string, now time.Time) {
	if m.cfg.Lease <= 0 {
		return
	}
	last := now
	for _, n := range m.cfg.Nodes.Nodes() {
		if n.GetRegistration().GetName() == node && n.GetLastSeenUnixNano() > 0 {
			if seen := time.Unix(0, n.GetLastSeenUnixNano()); seen.Before(last) {
				last = seen
			}
		}
	}
	if en.fences == nil {
		en.fences = map[string]fence{}
	}
	f := fence{attempt: en.job.GetAttempt(), until: last.Add(m.cfg.Lease + fenceMargin)}
	if old, ok := en.fences[node]; ok && old.until.After(f.until) {
		f.until = old.until
	}
	en.fences[node] = f
	m.keepFences(en)
}

// keepFences stores which nodes en waits for, so that a restarted server
// waits for them too (fenceAfterLoad).
func (m *Manager) keepFences(en *entry) {
	nodes := slices.Sorted(mapKeys(en.fences))
	if slices.Equal(nodes, en.job.GetFencedNodes()) {
		return
	}
	en.job.FencedNodes = nodes
	m.save(en)
}

// fenceAfterLoad restores, after a server restart, the fences of a job
// that will start again (recovering, moving, preempted): the nodes it
// waited for, and any node whose ranks of it were lost. Such a node may
// still run its ranks until a lease from the last renewal the old server
// sent, which was no later than now.
func (m *Manager) fenceAfterLoad(en *entry, now time.Time) {
	if m.cfg.Lease <= 0 {
		return
	}
	nodes := slices.Clone(en.job.GetFencedNodes())
	for _, jn := range en.job.GetPlacement() {
		for _, r := range jn.GetRanks() {
			if r.GetSignal() == lostRank && !slices.Contains(nodes, jn.GetNode()) {
				nodes = append(nodes, jn.GetNode())
			}
		}
	}
	for _, node := range nodes {
		if en.fences == nil {
			en.fences = map[string]fence{}
		}
		en.fences[node] = fence{attempt: en.job.GetAttempt(), until: now.Add(m.cfg.Lease + fenceMargin)}
	}
	m.keepFences(en)
}

// unfenced returns the nodes that may still run an old attempt of en at
// now; a fence whose lease has passed is dropped with an event.
func (m *Manager) unfenced(en *entry, now time.Time) []string {
	var wait []string
	for _, node := range slices.Sorted(mapKeys(en.fences)) {
		f := en.fences[node]
		if now.Before(f.until) {
			wait = append(wait, node)
			continue
		}
		delete(en.fences, node)
		m.recoveryEvent(en.job, api.Severity_SEVERITY_INFO, 0,
			"attempt %d fenced on %s: its lease has passed without word from the node, so its shims have stopped its ranks", f.attempt, node)
	}
	m.keepFences(en)
	return wait
}

// confirmFenced drops the fence of en on node: the node says the attempt
// is gone there.
func (m *Manager) confirmFenced(en *entry, node, how string) {
	f, ok := en.fences[node]
	if !ok {
		return
	}
	delete(en.fences, node)
	m.keepFences(en)
	m.recoveryEvent(en.job, api.Severity_SEVERITY_INFO, 0, "attempt %d fenced on %s: %s", f.attempt, node, how)
	m.kick()
}

// fenceOnReturn handles a node's registration: ranks of superseded
// attempts it still reports are killed (the registry fenced the ones the
// committed view knew of before the node was ready; this catches what the
// view had not caught up with), and jobs waiting on this node learn that
// their old attempt is gone from it.
func (m *Manager) fenceOnReturn(node string, running []*api.RankStatus) {
	stale := superseded(func(id string) *api.Job {
		if en := m.jobs[id]; en != nil {
			return en.job
		}
		return nil
	}, node, running)
	m.fenceRanks(node, stale)
	for _, en := range m.sorted() {
		f, ok := en.fences[node]
		if !ok {
			continue
		}
		left := slices.ContainsFunc(running, func(rk *api.RankStatus) bool {
			return rk.GetJob() == en.job.GetId() && rk.GetAttempt() <= f.attempt
		})
		if !left {
			m.confirmFenced(en, node, "the node came back without any of its ranks")
		}
	}
}

// fenceRanks kills, on node, the attempts of the ranks in stale; each
// attempt confirmed gone comes back as msgFenced.
func (m *Manager) fenceRanks(node string, stale []*api.RankStatus) {
	type key struct {
		job     string
		attempt uint32
	}
	var todo []key
	for _, rk := range stale {
		if k := (key{rk.GetJob(), rk.GetAttempt()}); !slices.Contains(todo, k) {
			todo = append(todo, k)
		}
	}
	if len(todo) == 0 {
		return
	}
	log, timeout, post := m.log, m.cfg.CommandTimeout, m.in.post
	for _, k := range todo {
		log.Warn("fencing ranks of a superseded attempt", "node", node, "job", k.job, "attempt", k.attempt)
		m.act(func(d *dispatcher) {
			d.enqueue(node, &api.Command{Body: &api.Command_Signal{Signal: &api.SignalRanks{
				Job: k.job, Attempt: k.attempt, Signal: "SIGKILL", Fence: true}}}, timeout, func(ack *api.CommandAck, err error) {
				if err != nil {
					log.Warn("fence superseded ranks; their lease stops them", "node", node, "job", k.job, "attempt", k.attempt, "err", err)
					return
				}
				post(msgFenced{node: node, job: k.job, attempt: k.attempt, killed: ack.GetKilled()})
			})
		})
	}
}

// fenced applies a node's confirmation that an attempt is gone from it.
func (m *Manager) fenced(msg msgFenced) {
	en := m.jobs[msg.job]
	if en == nil {
		return
	}
	if f, ok := en.fences[msg.node]; ok && f.attempt <= msg.attempt {
		var killed []string
		for _, rk := range msg.killed {
			killed = append(killed, fmt.Sprintf("rank %d (pid %d)", rk.GetRank(), rk.GetPid()))
		}
		m.confirmFenced(en, msg.node, fmt.Sprintf("the node killed %s of attempt %d", strings.Join(killed, ", "), msg.attempt))
	}
}

// sweepSuperseded kills every rank of j that a node reports but that is
// not of its current attempt, wherever it runs: a cancel must leave none,
// not only none in the current placement.
func (m *Manager) sweepSuperseded(j *api.Job) {
	for _, nr := range m.cfg.Nodes.Ranks(j.GetId()) {
		var stale []*api.RankStatus
		for _, rk := range nr.Ranks {
			if !current(j, nr.Node, rk) {
				stale = append(stale, rk)
			}
		}
		m.fenceRanks(nr.Node, stale)
	}
}
