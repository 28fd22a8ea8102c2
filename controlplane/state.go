package controlplane

import (
	"fmt"
	"log/slog"
	"sort"
	"sync"
	"time"

	"google.golang.org/protobuf/proto"

	"github.com/gpuctl/gpuctl/api"
	"github.com/gpuctl/gpuctl/store"
)

// defaultHeartbeat is assumed for a node that registers without one.
const defaultHeartbeat = time.Second

// nodeEntry is the live state of one node.
type nodeEntry struct {
	status    *api.NodeStatus
	lastBeat  time.Time
	heartbeat time.Duration
	history   map[uint32]*ring[*api.GPUSample]
	// inFlight and ranks are the node's latest view of calls in progress
	// and of the ranks it launched, replaced by every telemetry batch that
	// carries them.
	inFlight []*api.CollectiveRecord
	ranks    []*api.RankStatus
	// session is the node's live connection; nil while disconnected.
	session *nodeSession
	// down is set while the node is lost (silent or disconnected). It is
	// kept apart from status.State so that a cordon outlives an outage.
	down bool
}

type collKey struct {
	node string
	pid  uint32
	comm uint64
	op   api.NCCLOp
}

// state is the control plane's in-memory view of the cluster. Every
// change that must survive a restart goes to the store first.
type state struct {
	log        *slog.Logger
	store      store.Store
	historyLen int

	mu          sync.RWMutex
	nodes       map[string]*nodeEntry
	collectives map[collKey]*api.CollectiveStat
	obs         *broker
	// lostAtNodes is the sum of every node's lost-record counters.
	lostAtNodes uint64
	// onEvent, when set, sees every event after it is persisted (node
	// events and the server's own), outside the state lock.
	onEvent func(*api.Event)
}

func newState(log *slog.Logger, st store.Store, historyLen, observeHistory int) (*state, error) {
	s := &state{
		log:         log,
		store:       st,
		historyLen:  historyLen,
		nodes:       map[string]*nodeEntry{},
		collectives: map[collKey]*api.CollectiveStat{},
		obs:         newBroker(observeHistory),
	}
	known, err := st.Nodes()
	if err != nil {
		return nil, fmt.Errorf("load nodes: %w", err)
	}
	for _, n := range known {
		// Until a node reconnects after a server restart it cannot be
		// vouched for: it stays down but keeps its cordon.
		n.Connected = false
		if n.State == api.NodeState_NODE_STATE_READY {
			n.State = api.NodeState_NODE_STATE_DOWN
		}
		s.nodes[n.GetRegistration().GetName()] = &nodeEntry{status: n, history: map[uint32]*ring[*api.GPUSample]{}, down: true}
	}
	return s, nil
}

// register records a node that connected and returns its entry. A known
// node keeps its cordon; its inventory is replaced by what it reports now.
func (s *state) register(reg *api.NodeRegistration, remote string, sess *nodeSession, now time.Time) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	name := reg.GetName()
	e, known := s.nodes[name]
	if !known {
		e = &nodeEntry{status: &api.NodeStatus{}, history: map[uint32]*ring[*api.GPUSample]{}}
	}
	if e.session != nil && e.session != sess {
		e.session.close("replaced by a new connection from the same node")
	}
	st := proto.Clone(e.status).(*api.NodeStatus)
	st.Registration = reg
	st.RemoteAddr = remote
	st.Connected = true
	st.LastSeenUnixNano = now.UnixNano()
	switch st.State {
	case api.NodeState_NODE_STATE_CORDONED, api.NodeState_NODE_STATE_DRAINING:
	default:
		st.State = api.NodeState_NODE_STATE_READY
	}
	st.Gpus = mergeGPUs(st.Gpus, reg.GetGpus())
	if err := s.store.PutNode(st); err != nil {
		return fmt.Errorf("persist node %s: %w", name, err)
	}
	e.status = st
	e.session = sess
	e.down = false
	e.lastBeat = now
	e.heartbeat = time.Duration(reg.GetHeartbeatIntervalMs()) * time.Millisecond
	if e.heartbeat <= 0 {
		e.heartbeat = defaultHeartbeat
	}
	s.nodes[name] = e
	kind, msg := api.EventKind_EVENT_KIND_NODE_UP, "node connected from "+remote
	if !known {
		kind, msg = api.EventKind_EVENT_KIND_NODE_JOINED, fmt.Sprintf("node joined from %s with %d GPUs", remote, len(reg.GetGpus()))
	}
	s.raiseLocked(&api.Event{Node: name, TimeUnixNano: now.UnixNano(), Kind: kind, Severity: api.Severity_SEVERITY_INFO, Message: msg})
	return nil
}

// mergeGPUs keeps health flags of GPUs that are still present (by UUID).
func mergeGPUs(old []*api.GPUStatus, infos []*api.GPUInfo) []*api.GPUStatus {
	byUUID := map[string]*api.GPUStatus{}
	for _, g := range old {
		byUUID[g.GetInfo().GetUuid()] = g
	}
	out := make([]*api.GPUStatus, 0, len(infos))
	for _, info := range infos {
		g := &api.GPUStatus{Info: info, Healthy: true}
		if prev, ok := byUUID[info.GetUuid()]; ok {
			g.Healthy, g.UnhealthyReason = prev.GetHealthy(), prev.GetUnhealthyReason()
		}
		out = append(out, g)
	}
	return out
}

// heartbeat notes that name is alive.
func (s *state) heartbeat(name string, now time.Time) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if e, ok := s.nodes[name]; ok {
		e.lastBeat = now
		e.status.LastSeenUnixNano = now.UnixNano()
		if e.down && e.session != nil {
			s.setStateLocked(name, e, api.NodeState_NODE_STATE_READY, "heartbeats resumed", now)
		}
	}
}

// disconnected records that a node's session ended.
func (s *state) disconnected(name string, sess *nodeSession, reason string, now time.Time) {
	s.mu.Lock()
	defer s.mu.Unlock()
	e, ok := s.nodes[name]
	if !ok || e.session != sess {
		return
	}
	e.session = nil
	e.status.Connected = false
	s.setStateLocked(name, e, api.NodeState_NODE_STATE_DOWN, "connection closed: "+reason, now)
}

// checkHeartbeats marks down every node silent for more than twice its
// heartbeat interval. It returns the names it marked.
func (s *state) checkHeartbeats(now time.Time) []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	var down []string
	for name, e := range s.nodes {
		if e.down || e.lastBeat.IsZero() {
			continue
		}
		if silent := now.Sub(e.lastBeat); silent > 2*e.heartbeat {
			s.setStateLocked(name, e, api.NodeState_NODE_STATE_DOWN, fmt.Sprintf("no heartbeat for %s", silent.Round(time.Millisecond)), now)
			down = append(down, name)
		}
	}
	sort.Strings(down)
	return down
}

// setStateLocked moves a node between ready and down; cordoned and draining
// nodes keep that state (their cordon outlives an outage) but still log it.
func (s *state) setStateLocked(name string, e *nodeEntry, to api.NodeState, reason string, now time.Time) {
	from := e.status.State
	down := to == api.NodeState_NODE_STATE_DOWN
	if e.down == down {
		return
	}
	e.down = down
	if !cordonedState(from) {
		e.status.State = to
	}
	if err := s.store.PutNode(e.status); err != nil {
		s.log.Error("persist node state", "node", name, "err", err)
	}
	kind, sev := api.EventKind_EVENT_KIND_NODE_UP, api.Severity_SEVERITY_INFO
	if to == api.NodeState_NODE_STATE_DOWN {
		kind, sev = api.EventKind_EVENT_KIND_NODE_DOWN, api.Severity_SEVERITY_CRITICAL
	}
	s.log.Info("node state", "node", name, "from", from, "to", to, "reason", reason)
	s.raiseLocked(&api.Event{Node: name, TimeUnixNano: now.UnixNano(), Kind: kind, Severity: sev, Message: reason})
}

// cordonedState reports whether a node in state st takes no new work by
// an operator's (or recovery's) decision.
func cordonedState(st api.NodeState) bool {
	return st == api.NodeState_NODE_STATE_CORDONED || st == api.NodeState_NODE_STATE_DRAINING
}

// raiseLocked persists a server-side event; a store failure is logged,
// since the state change itself has already happened in memory.
func (s *state) raiseLocked(e *api.Event) {
	if err := s.store.AppendEvent(e); err != nil {
		s.log.Error("persist event", "node", e.GetNode(), "kind", e.GetKind(), "err", err)
	}
	if s.onEvent != nil {
		// The hook may read state; it runs without the lock held.
		go s.onEvent(e)
	}
}

// ingest applies one telemetry batch from name.
func (s *state) ingest(name string, t *api.Telemetry, now time.Time) {
	var items []*api.ObserveItem
	s.mu.Lock()
	e, ok := s.nodes[name]
	if !ok {
		s.mu.Unlock()
		return
	}
	e.lastBeat = now
	e.status.LastSeenUnixNano = now.UnixNano()
	// Node counters are cumulative; keep the cluster total by difference
	// rather than summing every node on every batch.
	s.lostAtNodes += t.GetLostCollectives() + t.GetLostNetEvents() - e.status.GetLostCollectives() - e.status.GetLostNetEvents()
	e.status.LostCollectives = t.GetLostCollectives()
	e.status.LostNetEvents = t.GetLostNetEvents()
	e.status.DroppedBatches = t.GetDroppedBatches()
	for _, smp := range t.GetGpus() {
		for _, g := range e.status.Gpus {
			if g.GetInfo().GetIndex() == smp.GetIndex() {
				g.Last = smp
				if smp.GetLost() && g.Healthy {
					g.Healthy, g.UnhealthyReason = false, "GPU lost (no longer answers NVML)"
				}
			}
		}
		h := e.history[smp.GetIndex()]
		if h == nil {
			h = newRing[*api.GPUSample](s.historyLen)
			e.history[smp.GetIndex()] = h
		}
		h.push(smp)
	}
	if t.InFlight != nil || t.Ranks != nil || len(t.GetGpus()) > 0 {
		// Batches that sample the host carry the full current sets, even
		// when empty; flush-only batches (traced calls alone) do not.
		e.inFlight, e.ranks = t.GetInFlight(), t.GetRanks()
	}
	for _, c := range t.GetCollectives() {
		if c.GetInProgress() {
			continue
		}
		k := collKey{node: name, pid: c.GetPid(), comm: c.GetComm(), op: c.GetOp()}
		st := s.collectives[k]
		if st == nil {
			st = &api.CollectiveStat{Node: name, Pid: c.GetPid(), Comm: c.GetComm(), Op: c.GetOp()}
			s.collectives[k] = st
		}
		st.Job, st.Rank = c.GetJob(), c.GetRank()
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
	lostAtNodes := s.lostAtNodes
	s.mu.Unlock()
	s.obs.publish(items, lostAtNodes)
}

// nodeEvents persists a node's events and applies their effect on GPU
// health. It returns the highest seq persisted, which the node is acked.
func (s *state) nodeEvents(name string, events []*api.Event) (uint64, error) {
	for _, e := range events {
		e.Node = name
	}
	// A resend after a reconnect repeats events already persisted; only
	// the new ones act on health and reach the hook.
	prev, err := s.store.LastNodeEventSeq(name)
	if err != nil {
		return 0, err
	}
	fresh := events[:0:0]
	for _, e := range events {
		if e.GetSeq() > prev {
			fresh = append(fresh, e)
		}
	}
	events = fresh
	top, err := s.store.AppendNodeEvents(name, events)
	if err != nil {
		return 0, err
	}
	s.mu.Lock()
	if n, ok := s.nodes[name]; ok {
		for _, e := range events {
			applyHealth(n.status, e)
		}
		if err := s.store.PutNode(n.status); err != nil {
			s.log.Error("persist node health", "node", name, "err", err)
		}
	}
	s.mu.Unlock()
	if s.onEvent != nil {
		for _, e := range events {
			s.onEvent(e)
		}
	}
	return top, nil
}

// applyHealth marks a GPU unhealthy for faults that make it unfit to run
// ranks: XIDs whose resolution is more than restarting the application,
// uncorrectable ECC errors, and a lost GPU.
func applyHealth(n *api.NodeStatus, e *api.Event) {
	var reason string
	switch e.GetKind() {
	case api.EventKind_EVENT_KIND_XID:
		switch e.GetXidClass() {
		case api.XIDClass_XID_CLASS_RESET_GPU, api.XIDClass_XID_CLASS_REBOOT_NODE, api.XIDClass_XID_CLASS_HARDWARE:
			reason = fmt.Sprintf("XID %d (%s)", e.GetXid(), e.GetXidClass().Action())
		}
	case api.EventKind_EVENT_KIND_ECC:
		if e.GetSeverity() == api.Severity_SEVERITY_CRITICAL {
			reason = "uncorrectable ECC error"
		}
	case api.EventKind_EVENT_KIND_GPU_LOST:
		reason = "GPU lost"
	}
	if reason == "" {
		return
	}
	for _, g := range n.Gpus {
		if int32(g.GetInfo().GetIndex()) == e.GetGpuIndex() {
			g.Healthy, g.UnhealthyReason = false, reason
		}
	}
}

// listNodes returns copies of every node's status, sorted by name.
func (s *state) listNodes() []*api.NodeStatus {
	s.mu.RLock()
	defer s.mu.RUnlock()
	out := make([]*api.NodeStatus, 0, len(s.nodes))
	for _, e := range s.nodes {
		out = append(out, proto.Clone(e.status).(*api.NodeStatus))
	}
	sort.Slice(out, func(i, j int) bool {
		return out[i].GetRegistration().GetName() < out[j].GetRegistration().GetName()
	})
	return out
}

// listCollectives returns the per-rank aggregates, optionally for one job
// or node, sorted by node, pid, communicator and op.
func (s *state) listCollectives(job, node string) []*api.CollectiveStat {
	s.mu.RLock()
	defer s.mu.RUnlock()
	var out []*api.CollectiveStat
	for k, st := range s.collectives {
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

// gpuHistory returns the retained samples of one GPU, oldest first.
func (s *state) gpuHistory(node string, gpu uint32) ([]*api.GPUSample, error) {
	s.mu.RLock()
	defer s.mu.RUnlock()
	e, ok := s.nodes[node]
	if !ok {
		return nil, fmt.Errorf("unknown node %q: `gpuctl nodes` lists the known ones", node)
	}
	h := e.history[gpu]
	if h == nil {
		return nil, nil
	}
	return h.slice(), nil
}

// session returns the live session of node, or an error saying why not.
func (s *state) session(node string) (*nodeSession, error) {
	s.mu.RLock()
	defer s.mu.RUnlock()
	e, ok := s.nodes[node]
	if !ok {
		return nil, fmt.Errorf("unknown node %q: `gpuctl nodes` lists the known ones", node)
	}
	if e.session == nil {
		return nil, fmt.Errorf("node %q is not connected (state %s)", node, e.status.State.Short())
	}
	return e.session, nil
}

// NodeRanks is one node's live ranks of a job and its calls in progress.
type NodeRanks struct {
	Node     string
	Ranks    []*api.RankStatus
	InFlight []*api.CollectiveRecord
}

// jobRanks returns, per connected node, the live ranks of job (all jobs
// when job is "") and the calls those ranks have in progress.
func (s *state) jobRanks(job string) []NodeRanks {
	s.mu.RLock()
	defer s.mu.RUnlock()
	var out []NodeRanks
	for name, e := range s.nodes {
		nr := NodeRanks{Node: name}
		pids := map[uint32]bool{}
		for _, r := range e.ranks {
			if job == "" || r.GetJob() == job {
				nr.Ranks = append(nr.Ranks, r)
				pids[r.GetPid()] = true
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
