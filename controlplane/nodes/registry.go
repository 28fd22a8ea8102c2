// Package nodes is the control plane's view of its nodes: the nodemon
// sessions, each node's live state (liveness, cordon, GPU health, latest
// samples and history, the ranks it runs, calls in flight), the NCCL call
// aggregates, and the heartbeat failure detector.
//
// Liveness and schedulability are kept apart, as Kubernetes shows
// NotReady,SchedulingDisabled: a node is ready or down by what its nodemon
// does, and cordoned or draining by what an operator (or recovery)
// decided. A down node is disconnected, and its figures are stale.
//
// The registry owns node state under one lock. What the job owner must act
// on (a node up or down, its events) goes to a Sink in the order it
// happened, from inside that lock, so node up and down for one node are
// never seen the wrong way round; the sink must only queue.
package nodes

import (
	"fmt"
	"log/slog"
	"maps"
	"slices"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"google.golang.org/protobuf/proto"

	"github.com/gpuctl/gpuctl/api"
	"github.com/gpuctl/gpuctl/controlplane/observe"
	"github.com/gpuctl/gpuctl/scheduler/pace"
	"github.com/gpuctl/gpuctl/store"
	"github.com/gpuctl/gpuctl/transport"
)

// DefaultHeartbeat is assumed for a node that registers without one.
const DefaultHeartbeat = time.Second

// Sink hears what happens to nodes, in order. Its methods are called with
// the registry's lock held and must not block or call back.
type Sink interface {
	// NodeUp: a node registered (joined is true the first time ever).
	NodeUp(name string, reg *api.NodeRegistration, joined bool)
	// NodeDown: a node was declared down (connection closed, or silent).
	NodeDown(name, reason string)
	// NodeEvents: events a node sent, once persisted, each seen once.
	NodeEvents(name string, events []*api.Event)
}

// Publisher takes every new node status and persisted event, for watch
// streams. Objects handed over are never modified afterwards.
type Publisher interface {
	PublishNode(n *api.NodeStatus)
	DeleteNode(name string)
	PublishEvent(e *api.Event)
}

// Config configures a Registry; zero fields take the defaults noted.
type Config struct {
	Store store.Store
	// Publish, Observe and Sink may be nil.
	Publish Publisher
	Observe *observe.Broker
	Sink    Sink
	// ServerName is sent to nodes in the welcome.
	ServerName string
	// History sizes each GPU's sample history.
	History HistoryConfig
	// Lease is how long a node's ranks may run on the server's last word
	// (Welcome.lease_ms, renewed with every heartbeat answered); 0: no
	// lease.
	Lease time.Duration
	// Superseded names, of the ranks a (re)connecting node reports, those
	// of attempts that are no longer current; they are fenced (killed and
	// confirmed gone) before the node is ready. Nil fences nothing.
	Superseded func(node string, running []*api.RankStatus) []*api.RankStatus
	// ReceiveLag, when set, is how far behind the server's receive path
	// is (transport.Listener.ReceiveLag): a node's silence counts only
	// past it, up to MaxLagCredit, so a busy server does not take its own
	// backlog for its nodes' failure.
	ReceiveLag func() time.Duration
	// IngestQueue bounds the telemetry batches waiting to be applied
	// (default DefaultIngestQueue): past half of it GPU samples are shed,
	// past all of it whole batches.
	IngestQueue int
	// Suspect is what a recovery's loss of a node does to it (zero
	// fields: DefaultSuspectPolicy).
	Suspect SuspectPolicy
	// Calls, when set, is given every batch of a node's collective
	// records as it is applied, outside the registry's lock (the
	// fail-slow analysis reads each call's entry and exit).
	Calls func(node string, recs []*api.CollectiveRecord)
	// Now is the clock, default time.Now.
	Now func() time.Time
	Log *slog.Logger
}

// Registry is the set of known nodes.
type Registry struct {
	cfg   Config
	log   *slog.Logger
	cmdID atomic.Uint64

	mu          sync.RWMutex
	nodes       map[string]*entry
	collectives map[collKey]*api.CollectiveStat
	// enqueued holds, where the profiler plugin reports completions, the
	// calls whose work has not completed yet, oldest first (at most
	// maxEnqueued): on a GPU a rank can have returned from a collective
	// that still runs.
	enqueued map[collKey][]*api.CollectiveRecord
	// lostAtNodes is the sum of every node's lost-record counters.
	lostAtNodes uint64
	// lastCheck is when the detector last looked (Detect).
	lastCheck time.Time

	// queue is the telemetry waiting to be applied (offer).
	queue ingestQueue
	// late is how late heartbeats are heard now.
	late lateness
	// pacing asks nodes to send telemetry less often while ingest is
	// behind (judgePace); paceFactor is the factor asked for now.
	pacing     pacing
	paceFactor atomic.Uint32
	// held are the registry's own events (a node down, up, cordoned) the
	// store refused (etcd away), oldest first, at most HeldEvents: the
	// detector stores them once it takes them (storeHeld).
	held []*api.Event
	// denied is the deny-list nodes are told (SetDeniedPeers).
	denied deniedPeers
}

// entry is one node. rec is its current status; it is replaced, never
// modified, once handed out, so readers share it without copying.
type entry struct {
	rec       *api.NodeStatus
	lastBeat  time.Time
	heartbeat time.Duration
	history   map[uint32]*history
	// inFlight and ranks are the node's latest report of calls in progress
	// and of the ranks it launched, replaced by every batch that carries
	// them.
	inFlight []*api.CollectiveRecord
	ranks    []*api.RankStatus
	// session is the node's live connection; nil while it is down.
	session *session
	// written counts the writes of the node's record; a registration
	// that wrote it outside the lock checks that none came between.
	written uint64
	// downAt is when the node last went down: a recovery's loss of it is
	// that moment, so two jobs losing it at once count one loss.
	downAt time.Time
	// closed is why the node's last session ended while it was up; it is
	// down only if it does not reconnect within the detector's bound.
	closed string
}

func (e *entry) down() bool { return e.rec.GetState() != api.NodeState_NODE_STATE_READY }

type collKey struct {
	node string
	pid  uint32
	comm uint64
	op   api.NCCLOp
}

// New loads every known node from the store. Until a node reconnects it
// cannot be vouched for: it starts down, keeping its cordon.
func New(cfg Config) (*Registry, error) {
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	if cfg.Log == nil {
		cfg.Log = slog.New(slog.DiscardHandler)
	}
	cfg.History.defaults()
	if cfg.IngestQueue <= 0 {
		cfg.IngestQueue = DefaultIngestQueue
	}
	cfg.Suspect.defaults()
	r := &Registry{cfg: cfg, log: cfg.Log, nodes: map[string]*entry{}, collectives: map[collKey]*api.CollectiveStat{},
		enqueued: map[collKey][]*api.CollectiveRecord{}, pacing: pacing{rule: pace.New(pace.Rule{})}}
	known, err := cfg.Store.Nodes()
	if err != nil {
		return nil, fmt.Errorf("load nodes: %w", err)
	}
	now := cfg.Now()
	for _, n := range known {
		n = migrate(n)
		n.Connected = false
		n.Stale = true
		if n.State != api.NodeState_NODE_STATE_DOWN {
			n.State, n.DownReason, n.StateSinceUnixNano = api.NodeState_NODE_STATE_DOWN, "not reconnected since the server started", now.UnixNano()
		}
		r.nodes[n.GetRegistration().GetName()] = &entry{rec: n, history: map[uint32]*history{}, downAt: time.Unix(0, n.GetStateSinceUnixNano())}
	}
	return r, nil
}

// migrate turns a record stored before liveness and cordon were apart
// (state cordoned or draining) into today's shape. Such a state said
// nothing of liveness, which is left unknown for New to settle.
func migrate(n *api.NodeStatus) *api.NodeStatus {
	switch n.GetState() {
	case api.NodeState_NODE_STATE_CORDONED:
		n.Cordoned, n.State = true, api.NodeState_NODE_STATE_UNSPECIFIED
	case api.NodeState_NODE_STATE_DRAINING:
		n.Cordoned, n.Draining, n.State = true, true, api.NodeState_NODE_STATE_UNSPECIFIED
	}
	return n
}

func (r *Registry) now() time.Time { return r.cfg.Now() }

// setLocked makes next the node's status and announces it; persist also
// writes it to the store (a failure is logged: the change has happened).
func (r *Registry) setLocked(e *entry, next *api.NodeStatus, persist bool) {
	e.rec = next
	if persist {
		e.written++
		if err := r.cfg.Store.PutNode(next); err != nil {
			r.log.Error("persist node", "node", next.GetRegistration().GetName(), "err", err)
		}
	}
	if r.cfg.Publish != nil {
		r.cfg.Publish.PublishNode(next)
	}
}

// raiseLocked persists a server-side node event and announces it. One the
// store refuses is announced all the same and held until it takes it.
func (r *Registry) raiseLocked(e *api.Event) {
	if len(r.held) > 0 {
		r.holdLocked(e, nil) // after those held before it
	} else if err := r.cfg.Store.AppendEvent(e); err != nil {
		r.holdLocked(e, err)
	}
	if r.cfg.Publish != nil {
		r.cfg.Publish.PublishEvent(e)
	}
}

func (r *Registry) holdLocked(e *api.Event, err error) {
	if len(r.held) == HeldEvents {
		r.log.Error("node event lost: the store refuses events and the hold is full", "node", e.GetNode(), "kind", e.GetKind(), "message", e.GetMessage())
		return
	}
	if err != nil {
		r.log.Warn("persist event; held until the store takes it", "node", e.GetNode(), "kind", e.GetKind(), "err", err)
	}
	r.held = append(r.held, e)
}

// storeHeld stores the events the store refused, in order, as far as it
// takes them now.
func (r *Registry) storeHeld() {
	r.mu.Lock()
	defer r.mu.Unlock()
	for i, e := range r.held {
		if err := r.cfg.Store.AppendEvent(e); err != nil {
			r.held = r.held[i:]
			return
		}
	}
	if len(r.held) > 0 {
		r.log.Info("stored the node events held while the store refused them", "events", len(r.held))
		r.held = nil
	}
}

// register records a node that connected through sess. A known node
// keeps its cordon and GPU health; its inventory is what it reports now.
//
// A known node's record and its up event are written outside the lock, in
// one store transaction: on etcd a write takes about a millisecond, and
// thousands of nodes reconnecting at once after a failover would
// otherwise queue on the lock, holding up heartbeats, telemetry and the
// detector. Should the record be written meanwhile by another (a second
// registration, the old session's end, a cordon), the registration is
// decided again, and written, under the lock.
func (r *Registry) register(reg *api.NodeRegistration, remote string, sess *session) error {
	name := reg.GetName()
	r.mu.Lock()
	e, known := r.nodes[name]
	if !known {
		// A node joining for the first time: rare, and written under the
		// lock, as it is not listed until registered.
		defer r.mu.Unlock()
		return r.registerLocked(reg, remote, sess, nil)
	}
	now := r.now()
	restarted, err := r.admitLocked(e, name, reg, sess, now)
	if err != nil {
		r.mu.Unlock()
		return err
	}
	written := e.written
	next := registered(e.rec, reg, remote, now)
	ev := upEvent(name, remote, reg, true, restarted, now)
	r.mu.Unlock()
	err = r.cfg.Store.Update(func(tx store.Tx) error {
		if err := tx.PutNode(next); err != nil {
			return err
		}
		return tx.AppendEvent(ev)
	})
	r.mu.Lock()
	defer r.mu.Unlock()
	if err != nil {
		return fmt.Errorf("persist node %s: %w", name, err)
	}
	if r.nodes[name] != e || e.written != written {
		// Which write landed last is unknown: the record is written again
		// as it stands, then as this registration decides.
		if r.nodes[name] == e {
			if err := r.cfg.Store.PutNode(e.rec); err != nil {
				return fmt.Errorf("persist node %s: %w", name, err)
			}
		}
		return r.registerLocked(reg, remote, sess, ev)
	}
	e.written++
	r.upLocked(e, reg, sess, next, now)
	if r.cfg.Publish != nil {
		r.cfg.Publish.PublishEvent(ev)
	}
	if r.cfg.Sink != nil {
		r.cfg.Sink.NodeUp(name, reg, false)
	}
	return nil
}

// registerLocked is register with every write under the lock. stored is
// the up event already written, if any.
func (r *Registry) registerLocked(reg *api.NodeRegistration, remote string, sess *session, stored *api.Event) error {
	now := r.now()
	name := reg.GetName()
	e, known := r.nodes[name]
	if !known {
		e = &entry{rec: &api.NodeStatus{}, history: map[uint32]*history{}}
	}
	restarted, err := r.admitLocked(e, name, reg, sess, now)
	if err != nil {
		return err
	}
	next := registered(e.rec, reg, remote, now)
	if err := r.cfg.Store.PutNode(next); err != nil {
		return fmt.Errorf("persist node %s: %w", name, err)
	}
	e.written++
	r.nodes[name] = e
	r.upLocked(e, reg, sess, next, now)
	if stored == nil {
		r.raiseLocked(upEvent(name, remote, reg, known, restarted, now))
	} else if r.cfg.Publish != nil {
		r.cfg.Publish.PublishEvent(stored)
	}
	if r.cfg.Sink != nil {
		r.cfg.Sink.NodeUp(name, reg, !known)
	}
	return nil
}

// admitLocked refuses sess while the node's established session is heard
// from by another nodemon instance, and closes a silent one or one its own
// restarted nodemon left (restarted). A closed session is detached at
// once, so its end, noticed while the registration writes outside the
// lock, does not declare the node down.
func (r *Registry) admitLocked(e *entry, name string, reg *api.NodeRegistration, sess *session, now time.Time) (restarted bool, err error) {
	old := e.session
	if old == nil || old == sess {
		return false, nil
	}
	why := ""
	switch silent := now.Sub(e.lastContact()); {
	case sameInstance(e.rec.GetRegistration(), reg):
		// The same nodemon instance (its data dir's id) cannot be on
		// both connections: it restarted, and the old session is a
		// dead process's. Waiting for it to go silent would declare
		// the node down while its ranks live on.
		restarted, why = true, "superseded: nodemon restarted (same instance id)"
	case silent <= 2*e.heartbeat:
		// The established session wins while it is alive: two hosts
		// must not share one identity, and a node's GPUs must not flip
		// between two inventories.
		return false, &SessionHeldError{Msg: fmt.Sprintf("node %q is already connected from %s (heard %s ago)%s: two hosts cannot share one node identity; stop the other nodemon, or run `gpuctl node remove %s` if this host replaced it",
			name, e.rec.GetRemoteAddr(), silent.Round(time.Millisecond), instanceNote(e.rec.GetRegistration(), reg), name)}
	default:
		why = "replaced by a new connection after " + silent.Round(time.Millisecond).String() + " of silence"
	}
	old.live.Store(false)
	// The registration is contact from the node: the detector must not
	// judge it by the detached session's silence meanwhile.
	e.session, e.lastBeat = nil, now
	old.close(why)
	if restarted {
		r.log.Info("node session superseded by a restart", "node", name)
	}
	return restarted, nil
}

// registered is the status of a node that registered reg from remote at
// now, keeping what cur says of its cordon and GPU health.
func registered(cur *api.NodeStatus, reg *api.NodeRegistration, remote string, now time.Time) *api.NodeStatus {
	next := copyStatus(cur)
	next.Registration = reg
	next.RemoteAddr = remote
	next.Connected = true
	next.LastSeenUnixNano = now.UnixNano()
	next.State, next.DownReason = api.NodeState_NODE_STATE_READY, ""
	// The GPU figures kept from before are still not live (their process
	// lists least of all) until the node's first samples come.
	next.Stale = cur.GetStale() && len(cur.GetGpus()) > 0
	next.StateSinceUnixNano = now.UnixNano()
	next.Gpus = mergeGPUs(cur.GetGpus(), reg.GetGpus())
	return next
}

// upEvent is the event of a node's registration: up again (its nodemon
// restarted, superseding its old session), or joined.
func upEvent(name, remote string, reg *api.NodeRegistration, known, restarted bool, now time.Time) *api.Event {
	kind, msg := api.EventKind_EVENT_KIND_NODE_UP, "node connected from "+remote
	if restarted {
		msg = "nodemon restarted: its new session from " + remote + " supersedes the old one"
	}
	if !known {
		kind, msg = api.EventKind_EVENT_KIND_NODE_JOINED, fmt.Sprintf("node joined from %s with %d GPUs", remote, len(reg.GetGpus()))
	}
	return &api.Event{Node: name, TimeUnixNano: now.UnixNano(), Kind: kind, Severity: api.Severity_SEVERITY_INFO, Message: msg}
}

// upLocked makes sess the node's live session with its stored status next.
func (r *Registry) upLocked(e *entry, reg *api.NodeRegistration, sess *session, next *api.NodeStatus, now time.Time) {
	e.session, e.closed = sess, ""
	e.lastBeat = now
	sess.hear(now)
	sess.live.Store(true)
	e.heartbeat = time.Duration(reg.GetHeartbeatIntervalMs()) * time.Millisecond
	if e.heartbeat <= 0 {
		e.heartbeat = DefaultHeartbeat
	}
	e.ranks, e.inFlight = reg.GetRunning(), nil
	r.setLocked(e, next, false)
}

// sameInstance reports whether a registration comes from the nodemon
// instance (data dir) that made the established one. Nodemons that keep no
// instance id never match.
func sameInstance(held, next *api.NodeRegistration) bool {
	return next.GetInstanceId() != "" && next.GetInstanceId() == held.GetInstanceId()
}

// instanceNote says, for a refusal, how the two instances differ.
func instanceNote(held, next *api.NodeRegistration) string {
	if held.GetInstanceId() == "" || next.GetInstanceId() == "" {
		return ""
	}
	return fmt.Sprintf(" by nodemon instance %s, not this one's %s", held.GetInstanceId(), next.GetInstanceId())
}

// SessionHeldError refuses a registration while the node's established
// session is still heard from. It is not final: a nodemon restarted after
// a crash meets its own old session, which goes silent and is replaced
// within twice the heartbeat, so the node is told to retry, not to stop.
type SessionHeldError struct{ Msg string }

func (e *SessionHeldError) Error() string { return e.Msg }

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
			g.Healthy, g.UnhealthyReason, g.Last = prev.GetHealthy(), prev.GetUnhealthyReason(), prev.GetLast()
		}
		out = append(out, g)
	}
	return out
}

// beat notes that the node was heard through sess; it reports whether
// sess is the node's live session, whose heartbeats a lease renewal
// answers. It takes no registry lock: under load, liveness must not
// queue behind telemetry.
func (r *Registry) beat(sess *session) bool {
	sess.hear(r.now())
	return sess.live.Load()
}

// lastContact is when the node was last heard from: a heartbeat by
// datagram or stream, or a telemetry batch, applied or shed.
func (e *entry) lastContact() time.Time {
	last := e.lastBeat
	if e.session != nil {
		if h := e.session.heardAt(); h.After(last) {
			last = h
		}
	}
	return last
}

// creditPause forgives nodes the time the server itself stood still (its
// process stopped, its host frozen): silence the detector could not have
// heard end is no evidence against a node. Pushing lastBeat later only
// ever delays the moment the server reckons a node's lease over.
//
// A pause long enough for nodemon to have given its session up (past
// pauseGiveUp) also leaves every node in its reconnect backoff: each is
// given transport.NodeReconnectWithin from now to be heard again, as
// after a restart. A lastBeat in the future only delays what is reckoned
// from it.
func (r *Registry) creditPause(d time.Duration) {
	r.mu.Lock()
	defer r.mu.Unlock()
	now := r.now()
	for _, e := range r.nodes {
		if e.lastBeat.IsZero() || e.down() {
			continue
		}
		e.lastBeat = e.lastContact().Add(d)
		if e.lastBeat.After(now) {
			e.lastBeat = now
		}
		if d > pauseGiveUp {
			if back := now.Add(transport.NodeReconnectWithin - 2*e.heartbeat); back.After(e.lastBeat) {
				e.lastBeat = back
			}
		}
	}
	r.log.Warn("the server paused; nodes are not blamed for it", "pause", d.Round(time.Millisecond))
}

// pauseGiveUp is the longest silence nodemon keeps a session through
// (agent.SilenceLimit at its smallest).
const pauseGiveUp = 3 * time.Second

// disconnected records that a node's session ended. The node is not down
// yet: the detector declares it down if it stays away as long as a silent
// node would (CheckHeartbeats). A connection can end with the node well: a
// server that stood still past QUIC's idle timeout finds every connection
// timed out when it resumes, while every nodemon is already dialling again.
func (r *Registry) disconnected(name string, sess *session, reason string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	e, ok := r.nodes[name]
	if !ok || e.session != sess {
		return
	}
	e.lastBeat = e.lastContact()
	sess.live.Store(false)
	e.session, e.closed = nil, reason
	next := copyStatus(e.rec)
	next.Connected = false
	r.setLocked(e, next, false)
}

// downLocked declares a node down: its session is closed (a nodemon that
// is only slow reconnects and registers again), its figures go stale, and
// the sink hears of it.
func (r *Registry) downLocked(name string, e *entry, reason string) {
	r.markDownLocked(name, e, reason, true)
}

// markDownLocked is downLocked; persist false leaves the stored record
// alone (a node being removed, whose record is gone).
func (r *Registry) markDownLocked(name string, e *entry, reason string, persist bool) {
	last := e.lastContact()
	if e.session != nil {
		e.session.live.Store(false)
		e.session.close("declared down: " + reason)
		e.session = nil
	}
	if e.down() {
		return
	}
	now := r.now()
	next := copyStatus(e.rec)
	next.State, next.DownReason, next.Connected, next.Stale = api.NodeState_NODE_STATE_DOWN, reason, false, true
	if last.UnixNano() > next.GetLastSeenUnixNano() {
		// The last contact, heartbeats included: the server reckons the
		// node's lease from it.
		next.LastSeenUnixNano = last.UnixNano()
	}
	next.StateSinceUnixNano = now.UnixNano()
	e.inFlight = nil
	e.downAt = now
	r.setLocked(e, next, persist)
	r.log.Info("node down", "node", name, "reason", reason)
	r.raiseLocked(&api.Event{Node: name, TimeUnixNano: now.UnixNano(), Kind: api.EventKind_EVENT_KIND_NODE_DOWN,
		Severity: api.Severity_SEVERITY_CRITICAL, Message: reason})
	if r.cfg.Sink != nil {
		r.cfg.Sink.NodeDown(name, reason)
	}
}

// MaxLagCredit bounds the receive lag a node's silence is excused: a
// receive path that far behind has lost the nodes' packets anyway (and
// QUIC's idle timeout ends their connections), and a lag probe gone wrong
// must not stop the detector for good.
const MaxLagCredit = 15 * time.Second

// CheckHeartbeats declares down every node silent for more than twice its
// heartbeat interval (up to eight times while the telemetry pace is
// raised), past how far behind the server is (its receive lag, or how
// late it hears the other nodes' heartbeats), and returns their names.
func (r *Registry) CheckHeartbeats() []string {
	now := r.now()
	lag := r.late.median(now)
	if r.cfg.ReceiveLag != nil {
		lag = max(lag, r.cfg.ReceiveLag())
	}
	lag = min(lag, MaxLagCredit)
	r.judgePace(now, lag)
	// While ingest is behind (the telemetry pace raised), the median
	// lateness says how late most heartbeats are heard, not the slowest:
	// a node is given up to four times as many heartbeats before it is
	// judged. Its ranks' lease is far longer, so this delays only the
	// verdict on a node really lost.
	beats := time.Duration(2 * min(r.Pace(), 4))
	r.mu.Lock()
	defer r.mu.Unlock()
	var down []string
	for name, e := range r.nodes {
		if e.down() || e.lastBeat.IsZero() {
			continue
		}
		if silent := now.Sub(e.lastContact()); silent-lag > beats*e.heartbeat {
			reason := fmt.Sprintf("no heartbeat for %s", silent.Round(time.Millisecond))
			if e.session == nil && e.closed != "" {
				reason = fmt.Sprintf("connection closed (%s) and not back for %s", e.closed, silent.Round(time.Millisecond))
			}
			if lag > 0 {
				reason += fmt.Sprintf(" (the server %s behind)", lag.Round(time.Millisecond))
			}
			if beats > 2 {
				reason += fmt.Sprintf(" (%d heartbeats allowed: ingest is behind, telemetry paced %d×)", beats, r.Pace())
			}
			r.downLocked(name, e, reason)
			down = append(down, name)
		}
	}
	sort.Strings(down)
	return down
}

// Cordon actions.
const (
	ActionCordon   = "cordon"
	ActionUncordon = "uncordon"
	ActionDrain    = "drain"
	// ActionSuspect records a recovery's loss of the node under the
	// registry's SuspectPolicy: suspect for a while, or cordoned for good
	// when it is lost once too often.
	ActionSuspect = "suspect"
	// ActionVouch lifts a suspicion: the node passed a validation gang.
	// Its losses stay on record.
	ActionVouch = "vouch"
)

// suspectLocked applies a recovery's loss of e (why) to next under the
// suspect policy and returns the event's message; false when the loss is
// on record already and changes nothing.
func (r *Registry) suspectLocked(e *entry, next *api.NodeStatus, why string) (string, bool) {
	now := r.now()
	lost := e.downAt
	if lost.IsZero() {
		lost = now
	}
	record := make([]time.Time, len(next.GetLostUnixNano()))
	for i, ns := range next.GetLostUnixNano() {
		record[i] = time.Unix(0, ns)
	}
	v := Suspect(record, lost, now, r.cfg.Suspect)
	if !v.New && (next.GetCordoned() || Suspected(next.GetSuspectUntilUnixNano(), now)) {
		return "", false
	}
	next.LostUnixNano = make([]int64, len(v.Lost))
	for i, t := range v.Lost {
		next.LostUnixNano[i] = t.UnixNano()
	}
	if v.Cordon {
		next.SuspectUntilUnixNano, next.SuspectReason = 0, ""
		if next.GetCordoned() {
			// An operator's cordon (or drain) stands, with its reason.
			return fmt.Sprintf("lost again (%s): %s", why, v.Reason), true
		}
		next.Cordoned, next.CordonReason = true, why+"; "+v.Reason
		return "cordoned: takes no new work (" + next.CordonReason + ")", true
	}
	next.SuspectUntilUnixNano, next.SuspectReason = v.Until.UnixNano(), why+"; "+v.Reason
	return fmt.Sprintf("suspect until %s: takes no queued work until then, or until a recovery's validation passes there (%s)",
		clockOf(v.Until), next.SuspectReason), true
}

// SetCordon applies a cordon action (cordon, uncordon or drain) to node,
// persists it, raises an event and returns the node's new status. A cordon
// outlives an outage and a restart; a cordon with no reason keeps the
// reason it had.
func (r *Registry) SetCordon(node, action, reason string) (*api.NodeStatus, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	e, ok := r.nodes[node]
	if !ok {
		return nil, r.unknownLocked(node)
	}
	cur := e.rec
	next := copyStatus(cur)
	var msg string
	switch action {
	case ActionUncordon:
		if !cur.GetCordoned() && !Suspected(cur.GetSuspectUntilUnixNano(), r.now()) {
			return cur, nil
		}
		// The operator vouches for the node: its suspicion and the
		// losses that would cordon it again go too.
		next.Cordoned, next.Draining, next.CordonReason = false, false, ""
		next.SuspectUntilUnixNano, next.SuspectReason, next.LostUnixNano = 0, "", nil
		msg = "uncordoned: takes new work"
		if e.down() {
			msg += " once it reconnects"
		}
	case ActionSuspect:
		var ok bool
		if msg, ok = r.suspectLocked(e, next, reason); !ok {
			return cur, nil
		}
	case ActionVouch:
		if !Suspected(cur.GetSuspectUntilUnixNano(), r.now()) {
			return cur, nil
		}
		next.SuspectUntilUnixNano, next.SuspectReason = 0, ""
		msg = "no longer suspect: " + reason
	case ActionCordon, ActionDrain:
		if reason == "" {
			reason = cur.GetCordonReason()
		}
		drain := action == ActionDrain
		if cur.GetCordoned() && cur.GetDraining() == drain && reason == cur.GetCordonReason() {
			return cur, nil
		}
		next.Cordoned, next.Draining, next.CordonReason = true, drain, reason
		msg = "cordoned: takes no new work"
		if drain {
			msg = "draining: takes no new work; its jobs move elsewhere"
		}
		if reason != "" {
			msg += " (" + reason + ")"
		}
	default:
		return nil, fmt.Errorf("unknown node action %q: use cordon, uncordon or drain", action)
	}
	if err := r.changeLocked(e, node, next, api.EventKind_EVENT_KIND_CORDON, msg); err != nil {
		return nil, err
	}
	r.log.Info("node cordon", "node", node, "action", action, "reason", reason)
	return next, nil
}

// changeLocked persists an operator's or another system's change to a
// node's status, makes it current and raises the event of kind that says
// what changed. A store that refuses it changes nothing.
func (r *Registry) changeLocked(e *entry, node string, next *api.NodeStatus, kind api.EventKind, msg string) error {
	if err := r.cfg.Store.PutNode(next); err != nil {
		return fmt.Errorf("persist node %s: %w", node, err)
	}
	e.written++
	r.setLocked(e, next, false)
	r.raiseLocked(&api.Event{Node: node, TimeUnixNano: r.now().UnixNano(), Kind: kind,
		Severity: api.Severity_SEVERITY_INFO, Message: msg})
	return nil
}

// SetLabels sets topology labels of node (rack, switch, …) that another
// system is the source of (an executor's view of its nodes), over what
// the node registered with, persists them and raises an event saying
// from where. nodemon registering again brings its own back until the
// source sets them again.
func (r *Registry) SetLabels(node string, labels map[string]string, source string) (*api.NodeStatus, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	e, ok := r.nodes[node]
	if !ok {
		return nil, r.unknownLocked(node)
	}
	cur := e.rec
	var set []string
	for _, k := range slices.Sorted(maps.Keys(labels)) {
		if cur.GetRegistration().GetLabels()[k] != labels[k] {
			set = append(set, k+"="+labels[k])
		}
	}
	if len(set) == 0 {
		return cur, nil
	}
	next := copyStatus(cur)
	// copyStatus shares the registration: this one is changed.
	next.Registration = proto.Clone(cmpOrRegistration(cur.GetRegistration(), node)).(*api.NodeRegistration)
	merged := maps.Clone(next.Registration.GetLabels())
	if merged == nil {
		merged = map[string]string{}
	}
	maps.Copy(merged, labels)
	next.Registration.Labels = merged
	msg := fmt.Sprintf("labels %s, from %s", strings.Join(set, " "), source)
	if err := r.changeLocked(e, node, next, api.EventKind_EVENT_KIND_AUDIT, msg); err != nil {
		return nil, err
	}
	r.log.Info("node labels", "node", node, "set", set, "from", source)
	return next, nil
}

func cmpOrRegistration(reg *api.NodeRegistration, node string) *api.NodeRegistration {
	if reg == nil {
		return &api.NodeRegistration{Name: node}
	}
	return reg
}

func (r *Registry) unknownLocked(node string) error {
	return fmt.Errorf("unknown node %q: `gpuctl nodes` lists the %d known ones", node, len(r.nodes))
}

// Nodes returns every node's status, sorted by name. The statuses are
// shared: callers must not modify them.
func (r *Registry) Nodes() []*api.NodeStatus {
	r.mu.RLock()
	defer r.mu.RUnlock()
	out := make([]*api.NodeStatus, 0, len(r.nodes))
	for _, e := range r.nodes {
		out = append(out, e.rec)
	}
	sort.Slice(out, func(i, j int) bool {
		return out[i].GetRegistration().GetName() < out[j].GetRegistration().GetName()
	})
	return out
}

// Node returns one node's status (shared, read-only), or an error naming
// what to do.
func (r *Registry) Node(name string) (*api.NodeStatus, error) {
	r.mu.RLock()
	defer r.mu.RUnlock()
	e, ok := r.nodes[name]
	if !ok {
		return nil, r.unknownLocked(name)
	}
	return e.rec, nil
}

// Known reports whether name is a known node.
func (r *Registry) Known(name string) bool {
	r.mu.RLock()
	defer r.mu.RUnlock()
	_, ok := r.nodes[name]
	return ok
}

// Connected reports whether node has a live session now.
func (r *Registry) Connected(name string) bool {
	r.mu.RLock()
	defer r.mu.RUnlock()
	e, ok := r.nodes[name]
	return ok && e.session != nil
}

// Conn returns the connection of node's live session, or nil.
func (r *Registry) Conn(name string) *transport.Conn {
	r.mu.RLock()
	defer r.mu.RUnlock()
	if e, ok := r.nodes[name]; ok && e.session != nil {
		return e.session.conn
	}
	return nil
}

// Forget drops a removed node (its store record is already gone): it is no
// longer listed, and its collectives go with it. A node still connected is
// declared down first.
func (r *Registry) Forget(name string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	e, ok := r.nodes[name]
	if !ok {
		return
	}
	r.markDownLocked(name, e, "removed from the cluster", false)
	delete(r.nodes, name)
	for k := range r.collectives {
		if k.node == name {
			delete(r.collectives, k)
			delete(r.enqueued, k)
		}
	}
	if r.cfg.Publish != nil {
		r.cfg.Publish.DeleteNode(name)
	}
}

// Admit refuses a join under the name of a node that is connected now:
// two hosts must not share an identity. A known node that is down may
// rejoin (a reinstalled host keeps its name and its cordon).
func (r *Registry) Admit(name string) error {
	if r.Connected(name) {
		return fmt.Errorf("node name %q is in use by a connected node: pick another --name, or stop that nodemon first", name)
	}
	return nil
}

// copyStatus returns a new status with n's fields; the GPU slice is
// copied, the GPUs themselves shared (they are replaced, not modified).
func copyStatus(n *api.NodeStatus) *api.NodeStatus {
	return &api.NodeStatus{
		Registration:         n.GetRegistration(),
		State:                n.GetState(),
		LastSeenUnixNano:     n.GetLastSeenUnixNano(),
		Gpus:                 append([]*api.GPUStatus(nil), n.GetGpus()...),
		CordonReason:         n.GetCordonReason(),
		RemoteAddr:           n.GetRemoteAddr(),
		Connected:            n.GetConnected(),
		LostCollectives:      n.GetLostCollectives(),
		LostNetEvents:        n.GetLostNetEvents(),
		DroppedBatches:       n.GetDroppedBatches(),
		Cordoned:             n.GetCordoned(),
		Draining:             n.GetDraining(),
		DownReason:           n.GetDownReason(),
		Stale:                n.GetStale(),
		StateSinceUnixNano:   n.GetStateSinceUnixNano(),
		SuspectUntilUnixNano: n.GetSuspectUntilUnixNano(),
		SuspectReason:        n.GetSuspectReason(),
		LostUnixNano:         n.GetLostUnixNano(),
	}
}

// fenced records, as one event per job, the ranks of superseded attempts
// a reconnecting node killed before it was ready.
func (r *Registry) fenced(name string, killed map[string][]string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, job := range slices.Sorted(maps.Keys(killed)) {
		// In a stable order: the node lists its ranks as it finds them.
		ranks := slices.Sorted(slices.Values(killed[job]))
		r.log.Warn("fenced superseded ranks", "node", name, "job", job, "ranks", ranks)
		r.raiseLocked(&api.Event{Node: name, Job: job, TimeUnixNano: r.now().UnixNano(), Kind: api.EventKind_EVENT_KIND_RECOVERY,
			Severity: api.Severity_SEVERITY_WARNING,
			Message:  fmt.Sprintf("fenced on %s before it was ready: killed %s of superseded attempts", name, strings.Join(ranks, ", "))})
	}
}
