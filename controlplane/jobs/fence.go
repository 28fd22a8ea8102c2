package jobs

import (
	"context"
	"fmt"
	"maps"
	"slices"
	"strings"
	"time"

	"github.com/gpuctl/gpuctl/api"
	"github.com/gpuctl/gpuctl/scheduler/fencing"
)

// Fencing: a rank never runs twice. Every attempt of a job is an epoch;
// a node's ranks run on a lease (nodes.Config.Lease), which their shims
// enforce, renewed by the server or, while no server answers, by a quorum
// of the attempt's witnesses (scheduler/fencing; Job.witnesses is the
// pool, LaunchRanks.witnesses each node's share). When a node is lost, its
// ranks of the job are given up, but they may still run there: no new
// attempt of the job starts until each such node is fenced, either
// confirmed free of the old attempt (it came back and reported, or killed,
// its ranks) or past its lease: enough of its witnesses acknowledged a
// Supersede that it can renew no more, and the lease from its last contact
// and from their last vouch, plus fenceMargin, has passed, by when its
// shims have stopped them. A node that comes back has its ranks of superseded attempts killed
// before it is ready (nodes.Registry, from Superseded) and again here,
// from the owner's own state, which the committed view may trail.

// fencer keeps the owner's fences: it sets them when a node is lost,
// tells the witnesses, and lifts each once its node is confirmed free of
// the old attempt or past its lease. What it keeps is per job, on the
// entry (fences, supersedeSent), so it goes with the job; the jobs and the
// current step are the owner's, reached through m. It runs on the owner's
// goroutine only.
type fencer struct{ m *Manager }

// fenceMargin is added to a lost node's lease: its shims send SIGKILL
// within a fraction of it after the lease ends.
const fenceMargin = time.Second

// fence is a lost node that may still run an attempt of a job.
type fence struct {
	attempt uint32
	// lastContact is the node's last word to the server.
	lastContact time.Time
	// witnesses may renew the node's lease while it is cut off; acks are
	// those that acknowledged the attempt superseded.
	witnesses []string
	acks      []fencing.Ack
	// stuckNoted: the event saying too few witnesses answer was raised.
	stuckNoted bool
}

// until is when the node's lease has surely passed; ok is false while too
// few of its witnesses acknowledged to tell.
func (f fence) until(lease time.Duration) (time.Time, bool) {
	return fencing.Until(f.witnesses, f.acks, f.lastContact, lease, fenceMargin)
}

// supersedeRetry is how often a Supersede a witness has not acknowledged
// (it was down, or the command failed) is sent again.
const supersedeRetry = 2 * time.Second

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
func (f *Front) Superseded(node string, running []*api.RankStatus) []*api.RankStatus {
	v := f.View()
	if v == nil {
		return nil
	}
	return superseded(func(id string) *api.Job { return v.byID[id] }, node, running)
}

// awaitFence records that node, just lost, may still run job en's current
// attempt until its lease has passed (counted from the node's last
// contact).
func (fc *fencer) awaitFence(en *entry, node string, now time.Time) {
	if fc.m.cfg.Lease <= 0 {
		return
	}
	last := now
	for _, n := range fc.m.cfg.Nodes.Nodes() {
		if n.GetRegistration().GetName() == node && n.GetLastSeenUnixNano() > 0 {
			if seen := time.Unix(0, n.GetLastSeenUnixNano()); seen.Before(last) {
				last = seen
			}
		}
	}
	if en.fences == nil {
		en.fences = map[string]fence{}
	}
	f := fence{attempt: en.job.GetAttempt(), lastContact: last, witnesses: fencing.Of(en.job.GetWitnesses(), node)}
	if old, ok := en.fences[node]; ok && old.attempt == f.attempt {
		if old.lastContact.After(f.lastContact) {
			f.lastContact = old.lastContact
		}
		f.acks = old.acks
	}
	en.fences[node] = f
	fc.keepFences(en)
	fc.supersede(en, now)
}

// supersede tells the witnesses of en's fences that their attempt is
// superseded, each once every supersedeRetry until it acknowledges.
func (fc *fencer) supersede(en *entry, now time.Time) {
	todo := map[string]uint32{}
	for _, f := range en.fences {
		for _, w := range f.witnesses {
			acked := slices.ContainsFunc(f.acks, func(a fencing.Ack) bool { return a.Witness == w })
			if !acked && now.Sub(en.supersedeSent[w]) >= supersedeRetry {
				todo[w] = max(todo[w], f.attempt)
			}
		}
	}
	if len(todo) == 0 {
		return
	}
	if en.supersedeSent == nil {
		en.supersedeSent = map[string]time.Time{}
	}
	id, timeout, post, clock := en.job.GetId(), fc.m.cfg.CommandTimeout, fc.m.in.post, fc.m.cfg.Now
	for _, w := range slices.Sorted(mapKeys(todo)) {
		en.supersedeSent[w] = now
		attempt := todo[w]
		fc.m.act(func(d *dispatcher) {
			d.enqueue(w, &api.Command{Body: &api.Command_Supersede{Supersede: &api.Supersede{Job: id, Attempt: attempt}}}, timeout,
				func(ack *api.CommandAck, err error) {
					post(msgSuperseded{job: id, attempt: attempt, witness: w, received: clock(),
						ago: time.Duration(ack.GetVouchedAgoMs()) * time.Millisecond, err: err})
				})
		})
	}
}

// superseded applies a witness's acknowledgement to the fences it
// witnesses.
func (fc *fencer) superseded(msg msgSuperseded) {
	en := fc.m.jobs[msg.job]
	if en == nil {
		return
	}
	if msg.err != nil {
		fc.m.log.Warn("witness did not take a superseded attempt; sent again shortly", "job", msg.job, "attempt", msg.attempt, "witness", msg.witness, "err", msg.err)
		return
	}
	for node, f := range en.fences {
		if f.attempt > msg.attempt || !slices.Contains(f.witnesses, msg.witness) {
			continue
		}
		f.acks = append(f.acks, fencing.Ack{Witness: msg.witness, Received: msg.received, VouchedAgo: msg.ago})
		en.fences[node] = f
	}
	fc.m.kick()
}

// keepFences stores which nodes en waits for, so that a restarted server
// waits for them too (afterLoad).
func (fc *fencer) keepFences(en *entry) {
	nodes := slices.Sorted(mapKeys(en.fences))
	if slices.Equal(nodes, en.job.GetFencedNodes()) {
		return
	}
	en.job.FencedNodes = nodes
	fc.m.save(en)
}

// afterLoad restores, after a server restart, the fences of a job
// that will start again (recovering, moving, preempted): the nodes it
// waited for, and any node whose ranks of it were lost. Such a node may
// still run its ranks until a lease from the last renewal the old server
// sent, which was no later than now.
func (fc *fencer) afterLoad(en *entry, now time.Time) {
	if fc.m.cfg.Lease <= 0 {
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
		en.fences[node] = fence{attempt: en.job.GetAttempt(), lastContact: now, witnesses: fencing.Of(en.job.GetWitnesses(), node)}
	}
	fc.keepFences(en)
	fc.supersede(en, now)
}

// unfenced returns the nodes that may still run an old attempt of en at
// now; a fence whose lease has passed is dropped with an event.
func (fc *fencer) unfenced(en *entry, now time.Time) []string {
	var wait []string
	for _, node := range slices.Sorted(mapKeys(en.fences)) {
		f := en.fences[node]
		until, ok := f.until(fc.m.cfg.Lease)
		if !ok && !f.stuckNoted && !now.Before(f.lastContact.Add(fc.m.cfg.Lease+fenceMargin)) {
			// Past the lease the node's own renewals are over; only its
			// witnesses' silence holds the job back now, and if they are
			// gone for good only the operator can say the node is down.
			f.stuckNoted = true
			en.fences[node] = f
			fc.m.rec.event(en.job, api.Severity_SEVERITY_WARNING, 0,
				"attempt %d still waits on %s: %d of its %d witnesses acknowledged it superseded, %d are needed; if %s and its ranks are down for good, run `gpuctl node remove %s --confirm-fenced`",
				f.attempt, node, len(f.acks), len(f.witnesses), fencing.AcksToFence(len(f.witnesses)), node, node)
		}
		if !ok || now.Before(until) {
			wait = append(wait, node)
			continue
		}
		delete(en.fences, node)
		how := "its lease has passed without word from the node, so its shims have stopped its ranks"
		if len(f.witnesses) > 0 {
			var acked []string
			for _, a := range f.acks {
				acked = append(acked, a.Witness)
			}
			how = fmt.Sprintf("its lease has passed without word from the node, and %d of its witnesses (%s) vouch for it no more, so its shims have stopped its ranks",
				len(acked), strings.Join(acked, ","))
		}
		fc.m.rec.event(en.job, api.Severity_SEVERITY_INFO, 0, "attempt %d fenced on %s: %s", f.attempt, node, how)
	}
	fc.keepFences(en)
	if len(wait) > 0 {
		fc.supersede(en, now)
	}
	return wait
}

// confirmFenced drops the fence of en on node: the node says the attempt
// is gone there (or the operator does, with sev a warning).
func (fc *fencer) confirmFenced(en *entry, node string, sev api.Severity, how string) {
	f, ok := en.fences[node]
	if !ok {
		return
	}
	delete(en.fences, node)
	fc.keepFences(en)
	fc.m.rec.event(en.job, sev, 0, "attempt %d fenced on %s: %s", f.attempt, node, how)
	fc.m.kick()
}

// ConfirmFenced lifts every fence that waits on node, on the word of
// the operator who that the node and its ranks are down for good: the way
// out when its witnesses are gone too, so that too few of them can ever
// acknowledge the Supersede. It returns the jobs whose fence was lifted.
// A node that is connected, or that no fence waits on, is refused.
func (m *Manager) ConfirmFenced(ctx context.Context, node, who string) ([]string, error) {
	v, err := m.do(ctx, func() (any, error) { return m.fence.confirmFencedBy(node, who) })
	if err != nil {
		return nil, err
	}
	return v.([]string), nil
}

func (fc *fencer) confirmFencedBy(node, who string) ([]string, error) {
	for _, n := range fc.m.cfg.Nodes.Nodes() {
		if n.GetRegistration().GetName() == node && n.GetConnected() {
			return nil, fmt.Errorf("node %s is connected, so it fences its own ranks: there is nothing to confirm; remove it without --confirm-fenced", node)
		}
	}
	var ids []string
	for _, en := range fc.m.sorted() {
		f, ok := en.fences[node]
		if !ok {
			continue
		}
		ids = append(ids, en.job.GetId())
		fc.confirmFenced(en, node, api.Severity_SEVERITY_WARNING, fmt.Sprintf(
			"%s confirmed that the node and its ranks are down (gpuctl node remove --confirm-fenced), with %d of its %d witnesses acknowledging; if they are not, two attempts may run",
			who, len(f.acks), len(f.witnesses)))
	}
	if len(ids) == 0 {
		return nil, fmt.Errorf("no job waits for node %s to be fenced: remove it without --confirm-fenced", node)
	}
	fc.m.log.Warn("fence confirmed by the operator", "node", node, "who", who, "jobs", strings.Join(ids, ","))
	return ids, nil
}

// onReturn handles a node's registration: ranks of superseded
// attempts it still reports are killed (the registry fenced the ones the
// committed view knew of before the node was ready; this catches what the
// view had not caught up with), and jobs waiting on this node learn that
// their old attempt is gone from it.
func (fc *fencer) onReturn(node string, running []*api.RankStatus) {
	stale := superseded(func(id string) *api.Job {
		if en := fc.m.jobs[id]; en != nil {
			return en.job
		}
		return nil
	}, node, running)
	fc.fenceRanks(node, stale)
	for _, en := range fc.m.sorted() {
		f, ok := en.fences[node]
		if !ok {
			continue
		}
		left := slices.ContainsFunc(running, func(rk *api.RankStatus) bool {
			return rk.GetJob() == en.job.GetId() && rk.GetAttempt() <= f.attempt
		})
		if !left {
			fc.confirmFenced(en, node, api.Severity_SEVERITY_INFO, "the node came back without any of its ranks")
		}
	}
}

// fenceRanks kills, on node, the attempts of the ranks in stale; each
// attempt confirmed gone comes back as msgFenced.
func (fc *fencer) fenceRanks(node string, stale []*api.RankStatus) {
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
	log, timeout, post := fc.m.log, fc.m.cfg.CommandTimeout, fc.m.in.post
	for _, k := range todo {
		log.Warn("fencing ranks of a superseded attempt", "node", node, "job", k.job, "attempt", k.attempt)
		fc.m.act(func(d *dispatcher) {
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
func (fc *fencer) fenced(msg msgFenced) {
	en := fc.m.jobs[msg.job]
	if en == nil {
		return
	}
	if f, ok := en.fences[msg.node]; ok && f.attempt <= msg.attempt {
		var killed []string
		for _, rk := range msg.killed {
			killed = append(killed, fmt.Sprintf("rank %d (pid %d)", rk.GetRank(), rk.GetPid()))
		}
		fc.confirmFenced(en, msg.node, api.Severity_SEVERITY_INFO, fmt.Sprintf("the node killed %s of attempt %d", strings.Join(killed, ", "), msg.attempt))
	}
}

// sweepSuperseded kills every rank of j that a node reports but that is
// not of its current attempt, wherever it runs: a cancel must leave none,
// not only none in the current placement.
func (fc *fencer) sweepSuperseded(j *api.Job) {
	for _, nr := range fc.m.cfg.Nodes.Ranks(j.GetId()) {
		var stale []*api.RankStatus
		for _, rk := range nr.Ranks {
			if !current(j, nr.Node, rk) {
				stale = append(stale, rk)
			}
		}
		fc.fenceRanks(nr.Node, stale)
	}
}

// witnessAddrs maps each node that can witness now (up, with a peer
// listener) to its peer address.
func (fc *fencer) witnessAddrs() map[string]string {
	out := map[string]string{}
	for _, n := range fc.m.cfg.Nodes.Nodes() {
		if a := n.GetRegistration().GetPeerAddr(); a != "" && n.GetConnected() && n.GetState() == api.NodeState_NODE_STATE_READY {
			out[n.GetRegistration().GetName()] = a
		}
	}
	return out
}

// witnessPool is the witness pool of an attempt on nodes (fencing.Pool),
// with every node's peer address; nil without a lease.
func (fc *fencer) witnessPool(nodes []string) ([]string, map[string]string) {
	if fc.m.cfg.Lease <= 0 {
		return nil, nil
	}
	addrs := fc.witnessAddrs()
	pool := fencing.Pool(nodes, slices.Collect(maps.Keys(addrs)), func(n string) bool { return addrs[n] != "" })
	return pool, addrs
}
