package nodes

import (
	"fmt"
	"slices"
	"sort"
	"sync"

	"google.golang.org/protobuf/proto"

	"github.com/gpuctl/gpuctl/api"
)

// DefaultIngestQueue bounds the telemetry batches waiting to be applied.
const DefaultIngestQueue = 512

// Shed counts the telemetry the server dropped because its ingest fell
// behind: whole batches, and the GPU samples and NCCL call records of
// those it decoded (a batch that finds the queue full is dropped unread).
type Shed struct {
	Batches, GPUSamples, Collectives uint64
}

// queued is a batch waiting to be applied; sampled says it carried the
// node's full current sets (ranks, calls in flight), even with its GPU
// samples shed.
type queued struct {
	name    string
	sess    *session
	t       *api.Telemetry
	sampled bool
}

// ingestQueue is the telemetry waiting to be applied, in arrival order,
// by one drainer at a time (so a node's batches apply in order). When it
// falls behind, the batches that arrive meanwhile lose their GPU samples
// (the console's figures go stale) and keep the NCCL call records the
// stall detector reads; past its bound whole batches are dropped. Either
// way the node was heard: shedding never costs a node its liveness.
type ingestQueue struct {
	mu       sync.Mutex
	waiting  []queued
	draining bool
	shed     Shed
}

// offer queues a batch for ingest, or sheds it (counted) when the queue
// is past half its bound (GPU samples and flows) or full (the batch).
func (r *Registry) offer(name string, sess *session, t *api.Telemetry) {
	q := &r.queue
	limit := r.cfg.IngestQueue
	q.mu.Lock()
	defer q.mu.Unlock()
	switch n := len(q.waiting); {
	case n >= limit:
		q.shed.Batches++
		q.shed.GPUSamples += uint64(len(t.GetGpus()))
		q.shed.Collectives += uint64(len(t.GetCollectives()))
		return
	case n >= limit/2 && len(t.GetGpus()) > 0:
		q.shed.GPUSamples += uint64(len(t.GetGpus()))
		sampled := sampled(t)
		t.Gpus, t.Flows = nil, nil
		q.waiting = append(q.waiting, queued{name, sess, t, sampled})
	default:
		q.waiting = append(q.waiting, queued{name, sess, t, sampled(t)})
	}
	if !q.draining {
		q.draining = true
		go r.drain()
	}
}

// drain applies queued batches until none is left.
func (r *Registry) drain() {
	q := &r.queue
	for {
		q.mu.Lock()
		if len(q.waiting) == 0 {
			q.draining = false
			q.waiting = nil
			q.mu.Unlock()
			return
		}
		b := q.waiting[0]
		q.waiting[0] = queued{}
		q.waiting = q.waiting[1:]
		q.mu.Unlock()
		r.apply(b.name, b.sess, b.t, b.sampled)
	}
}

// ingestFull reports whether the ingest queue is at its bound: the next
// batch would be shed whole.
func (r *Registry) ingestFull() bool {
	r.queue.mu.Lock()
	defer r.queue.mu.Unlock()
	return len(r.queue.waiting) >= r.cfg.IngestQueue
}

// shedUnread counts a batch shed without being decoded: its samples and
// calls are not counted.
func (r *Registry) shedUnread() {
	r.queue.mu.Lock()
	r.queue.shed.Batches++
	r.queue.mu.Unlock()
}

// Shed returns the telemetry shed since the server started.
func (r *Registry) Shed() Shed {
	r.queue.mu.Lock()
	defer r.queue.mu.Unlock()
	return r.queue.shed
}

// sampled reports whether a batch sampled the host: such batches carry
// the full current sets, even when empty; flush-only batches (traced
// calls alone) do not.
func sampled(t *api.Telemetry) bool {
	return t.InFlight != nil || t.Ranks != nil || len(t.GetGpus()) > 0
}

// ingest applies one telemetry batch from the node's session at once.
func (r *Registry) ingest(name string, sess *session, t *api.Telemetry) {
	r.beat(sess)
	r.apply(name, sess, t, sampled(t))
}

// apply applies one telemetry batch from the node's session.
func (r *Registry) apply(name string, sess *session, t *api.Telemetry, sampled bool) {
	var items []*api.ObserveItem
	r.mu.Lock()
	e, ok := r.nodes[name]
	if !ok || e.session != sess {
		// A batch from a session declared down or replaced: stale.
		r.mu.Unlock()
		return
	}
	now := r.now()
	next := copyStatus(e.rec)
	next.LastSeenUnixNano = now.UnixNano()
	// Node counters are cumulative; keep the cluster total by difference
	// rather than summing every node on every batch.
	r.lostAtNodes += t.GetLostCollectives() + t.GetLostNetEvents() - e.rec.GetLostCollectives() - e.rec.GetLostNetEvents()
	next.LostCollectives, next.LostNetEvents, next.DroppedBatches = t.GetLostCollectives(), t.GetLostNetEvents(), t.GetDroppedBatches()
	healthChanged := false
	if len(t.GetGpus()) > 0 {
		next.Stale = false
	}
	for _, smp := range t.GetGpus() {
		for i, g := range next.Gpus {
			if g.GetInfo().GetIndex() != smp.GetIndex() {
				continue
			}
			ng := &api.GPUStatus{Info: g.GetInfo(), Last: smp, Healthy: g.GetHealthy(), UnhealthyReason: g.GetUnhealthyReason()}
			if smp.GetLost() && ng.Healthy {
				ng.Healthy, ng.UnhealthyReason = false, "GPU lost (no longer answers NVML)"
				healthChanged = true
			}
			next.Gpus[i] = ng
		}
		h := e.history[smp.GetIndex()]
		if h == nil {
			h = newHistory(&r.cfg.History)
			e.history[smp.GetIndex()] = h
		}
		h.push(smp)
	}
	if sampled {
		e.inFlight, e.ranks = t.GetInFlight(), t.GetRanks()
	}
	for _, c := range t.GetCollectives() {
		if c.GetInProgress() {
			continue
		}
		k := collKey{node: name, pid: c.GetPid(), comm: c.GetComm(), op: c.GetOp()}
		st := r.collectives[k]
		if st == nil {
			st = &api.CollectiveStat{Node: name, Pid: c.GetPid(), Comm: c.GetComm(), Op: c.GetOp()}
			r.collectives[k] = st
		}
		st.Job, st.Rank = c.GetJob(), c.GetRank()
		if c.GetCompletion() {
			// Not another call: when one already counted finished its work.
			st.Completions++
			st.GpuSeconds += float64(c.GetDurationNs()) / 1e9
			st.CompletedSeq = max(st.CompletedSeq, c.GetSeq())
			r.enqueued[k] = slices.DeleteFunc(r.enqueued[k], func(e *api.CollectiveRecord) bool { return e.GetSeq() <= st.CompletedSeq })
			continue
		}
		if st.Completions > 0 && c.GetSeq() > st.CompletedSeq {
			q := r.enqueued[k]
			if len(q) == maxEnqueued {
				q = slices.Delete(q, 0, 1)
			}
			r.enqueued[k] = append(q, c)
		}
		st.Calls++
		st.Bytes += c.GetBytes()
		st.InCallSeconds += float64(c.GetDurationNs()) / 1e9
		if c.GetSeq() > st.Seq {
			st.Seq = c.GetSeq()
		}
		st.LastUnixNano = c.GetStartUnixNano() + c.GetDurationNs()
		items = append(items, &api.ObserveItem{Node: name, Body: &api.ObserveItem_Collective{Collective: c}})
	}
	for _, f := range t.GetFlows() {
		items = append(items, &api.ObserveItem{Node: name, Body: &api.ObserveItem_Flow{Flow: f}})
	}
	r.setLocked(e, next, healthChanged)
	lostAtNodes := r.lostAtNodes
	r.mu.Unlock()
	if r.cfg.Observe != nil {
		r.cfg.Observe.Publish(items, lostAtNodes)
	}
	if r.cfg.Calls != nil && len(t.GetCollectives()) > 0 {
		r.cfg.Calls(name, t.GetCollectives())
	}
}

// nodeEvents persists a node's events and applies their effect on GPU
// health. It returns the highest seq persisted, which the node is acked.
func (r *Registry) nodeEvents(name string, sess *session, events []*api.Event) (uint64, error) {
	for _, e := range events {
		e.Node = name
	}
	// A resend after a reconnect repeats events already persisted; only
	// the new ones act on health and reach the sink.
	prev, err := r.cfg.Store.LastNodeEventSeq(name)
	if err != nil {
		return 0, err
	}
	fresh := events[:0:0]
	for _, e := range events {
		if e.GetSeq() > prev {
			fresh = append(fresh, e)
		}
	}
	top, err := r.cfg.Store.AppendNodeEvents(name, fresh)
	if err != nil {
		return 0, err
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if en, ok := r.nodes[name]; ok {
		next := copyStatus(en.rec)
		changed := false
		for _, e := range fresh {
			changed = applyHealth(next, e) || changed
		}
		if changed {
			r.setLocked(en, next, true)
		}
	}
	if r.cfg.Publish != nil {
		for _, e := range fresh {
			r.cfg.Publish.PublishEvent(e)
		}
	}
	if r.cfg.Sink != nil && len(fresh) > 0 {
		r.cfg.Sink.NodeEvents(name, fresh)
	}
	return top, nil
}

// applyHealth marks a GPU unhealthy for faults that make it unfit to run
// ranks (api.GPUFault: the XID catalog's classes beyond restarting the
// application, uncorrectable ECC errors, a lost GPU), replacing its status.
func applyHealth(n *api.NodeStatus, e *api.Event) bool {
	reason, ok := api.GPUFault(e)
	if !ok {
		return false
	}
	changed := false
	for i, g := range n.Gpus {
		if int32(g.GetInfo().GetIndex()) == e.GetGpuIndex() && (g.GetHealthy() || g.GetUnhealthyReason() != reason) {
			n.Gpus[i] = &api.GPUStatus{Info: g.GetInfo(), Last: g.GetLast(), Healthy: false, UnhealthyReason: reason}
			changed = true
		}
	}
	return changed
}

// Collectives returns the per-rank NCCL aggregates, optionally of one job
// or node, sorted by node, pid, communicator and op.
func (r *Registry) Collectives(job, node string) []*api.CollectiveStat {
	r.mu.RLock()
	defer r.mu.RUnlock()
	var out []*api.CollectiveStat
	for k, st := range r.collectives {
		if (job != "" && st.GetJob() != job) || (node != "" && k.node != node) {
			continue
		}
		out = append(out, proto.Clone(st).(*api.CollectiveStat))
	}
	sort.Slice(out, func(i, j int) bool {
		a, b := out[i], out[j]
		if a.Node != b.Node {
			return a.Node < b.Node
		}
		if a.Pid != b.Pid {
			return a.Pid < b.Pid
		}
		if a.Comm != b.Comm {
			return a.Comm < b.Comm
		}
		return a.Op < b.Op
	})
	return out
}

// GPUHistory returns the retained samples of one GPU, oldest first.
func (r *Registry) GPUHistory(node string, gpu uint32) ([]*api.GPUSample, error) {
	r.mu.RLock()
	defer r.mu.RUnlock()
	e, ok := r.nodes[node]
	if !ok {
		return nil, r.unknownLocked(node)
	}
	var memTotal uint64
	found := false
	for _, g := range e.rec.GetGpus() {
		if g.GetInfo().GetIndex() == gpu {
			memTotal, found = g.GetInfo().GetMemTotalBytes(), true
		}
	}
	if !found {
		return nil, fmt.Errorf("node %s has no GPU %d: it has %d GPUs", node, gpu, len(e.rec.GetGpus()))
	}
	h := e.history[gpu]
	if h == nil {
		return nil, nil
	}
	return h.samples(gpu, memTotal), nil
}

// NodeRanks is one node's live ranks of a job and their calls in progress.
type NodeRanks struct {
	Node     string
	Ranks    []*api.RankStatus
	InFlight []*api.CollectiveRecord
}

// Ranks returns, per node that is up, the ranks it reports of job (every
// job when job is "") and the calls those ranks have in progress. The
// records are shared: callers must not modify them.
func (r *Registry) Ranks(job string) []NodeRanks {
	r.mu.RLock()
	defer r.mu.RUnlock()
	var out []NodeRanks
	for name, e := range r.nodes {
		if e.down() {
			continue
		}
		nr := NodeRanks{Node: name}
		pids := map[uint32]bool{}
		for _, rk := range e.ranks {
			if job == "" || rk.GetJob() == job {
				nr.Ranks = append(nr.Ranks, rk)
				pids[rk.GetPid()] = true
			}
		}
		for _, c := range e.inFlight {
			if pids[c.GetPid()] || job != "" && c.GetJob() == job {
				nr.InFlight = append(nr.InFlight, c)
			}
		}
		if len(nr.Ranks) > 0 || len(nr.InFlight) > 0 {
			out = append(out, nr)
		}
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Node < out[j].Node })
	return out
}

// maxEnqueued bounds the calls kept per rank, communicator and op while
// their completion is awaited.
const maxEnqueued = 64

// CommProgress is one rank's progress on one communicator: the last
// completed collective and the one in progress, from the traced calls.
// Where the profiler plugin reports completions, done is the last whose
// work completed and the one in progress may be one the rank enqueued and
// returned from.
type CommProgress struct {
	Handle uint64
	// Created is when ncclCommInitRank returned (unix ns), 0 if not traced.
	Created int64
	Done    uint64
	DoneOp  api.NCCLOp
	// In is the collective in progress, nil between calls.
	In *api.CollectiveRecord
}

// RankProgress is one live rank with its communicators.
type RankProgress struct {
	Node   string
	Status *api.RankStatus
	Comms  []CommProgress
}

// Progress returns, for each job in attempts (job id → current attempt),
// its live ranks of that attempt on nodes that are up, each with the
// progress of its communicators, unordered.
func (r *Registry) Progress(attempts map[string]uint32) map[string][]RankProgress {
	r.mu.RLock()
	defer r.mu.RUnlock()
	type pidKey struct {
		node string
		pid  uint32
	}
	type ref struct {
		job string
		i   int
	}
	out := map[string][]RankProgress{}
	refs := map[pidKey]ref{}
	pending := map[*CommProgress]*api.CollectiveRecord{}
	comms := map[pidKey]map[uint64]*CommProgress{}
	comm := func(k pidKey, handle uint64) *CommProgress {
		m := comms[k]
		if m == nil {
			m = map[uint64]*CommProgress{}
			comms[k] = m
		}
		c := m[handle]
		if c == nil {
			c = &CommProgress{Handle: handle}
			m[handle] = c
		}
		return c
	}
	for name, e := range r.nodes {
		// A lost node's last report is stale; the failure detector acts on it.
		if e.session == nil || e.down() {
			continue
		}
		for _, rk := range e.ranks {
			att, ok := attempts[rk.GetJob()]
			if !ok || (rk.GetAttempt() != 0 && rk.GetAttempt() != att) {
				continue
			}
			out[rk.GetJob()] = append(out[rk.GetJob()], RankProgress{Node: name, Status: rk})
			refs[pidKey{name, rk.GetPid()}] = ref{rk.GetJob(), len(out[rk.GetJob()]) - 1}
		}
		for _, c := range e.inFlight {
			k := pidKey{name, c.GetPid()}
			if _, ok := refs[k]; !ok || !c.GetOp().Collective() {
				continue
			}
			cp := comm(k, c.GetComm())
			if cp.In == nil || c.GetSeq() > cp.In.GetSeq() {
				cp.In = c
			}
		}
	}
	for k, st := range r.collectives {
		pk := pidKey{k.node, k.pid}
		if _, ok := refs[pk]; !ok {
			continue
		}
		switch {
		case k.op == api.NCCLOp_NCCL_OP_COMM_INIT_RANK:
			if k.comm != 0 {
				comm(pk, k.comm).Created = st.GetLastUnixNano()
			}
		case k.op.Collective():
			cp := comm(pk, k.comm)
			done := st.GetSeq()
			if st.GetCompletions() > 0 {
				// Completion-true: done is what finished, not what returned.
				done = st.GetCompletedSeq()
				if q := r.enqueued[k]; len(q) > 0 && (pending[cp] == nil || q[0].GetSeq() < pending[cp].GetSeq()) {
					pending[cp] = q[0]
				}
			}
			if done > cp.Done {
				cp.Done, cp.DoneOp = done, k.op
			}
		}
	}
	for cp, e := range pending {
		if e.GetSeq() <= cp.Done {
			continue
		}
		// Enqueued and not complete: inside it, as far as the GPU goes,
		// whatever the host thread does meanwhile.
		if cp.In == nil || e.GetSeq() < cp.In.GetSeq() {
			in := proto.Clone(e).(*api.CollectiveRecord)
			in.InProgress = true
			cp.In = in
		}
	}
	for _, m := range comms {
		for _, cp := range m {
			if cp.In != nil && cp.In.GetSeq() <= cp.Done {
				cp.In = nil // its work completed; the call is returning
			}
		}
	}
	for pk, rf := range refs {
		rp := &out[rf.job][rf.i]
		for _, c := range comms[pk] {
			rp.Comms = append(rp.Comms, *c)
		}
	}
	return out
}
