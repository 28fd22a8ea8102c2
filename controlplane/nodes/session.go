package nodes

import (
	"context"
	"errors"
	"fmt"
	"io"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"google.golang.org/protobuf/proto"

	"github.com/gpuctl/gpuctl/api"
	"github.com/gpuctl/gpuctl/transport"
)

// handshakeTimeout bounds the wait for a node's hello and registration.
const handshakeTimeout = 10 * time.Second

// session is one connected nodemon.
type session struct {
	r    *Registry
	conn *transport.Conn
	name string

	writeMu sync.Mutex
	control *transport.Stream
	// features are those of the node's hello this server uses with it
	// (set by the handshake, read only after).
	features []string

	mu      sync.Mutex
	pending map[uint64]chan *api.CommandAck // command id → the node's answer; nil: the session ended
	closed  bool
	ended   string // why the session ended

	// heard is when the node was last heard from on this session (unix
	// nanoseconds of the registry's clock): the detector reads it without
	// the registry lock, so a heartbeat never waits for telemetry.
	heard atomic.Int64
	// live is whether this is the node's registered session and the node
	// is up; only its heartbeats renew the lease.
	live atomic.Bool
	// renewed is the highest heartbeat seq answered with a lease: a
	// heartbeat comes by datagram and again on the control stream, and
	// is answered once, by the first to arrive.
	renewed atomic.Uint64
	// sampled is the highest heartbeat seq whose lateness was noted, and
	// leastGap one more than the least gap from a heartbeat's send time to
	// its arrival (0: none yet).
	sampled  atomic.Uint64
	leastGap atomic.Int64
	// deniedSent is the revision of the deny-list the node heard on this
	// session (sendDeniedPeers; the control reader's alone).
	deniedSent uint64
}

// hear notes that the node was heard from at t.
func (ns *session) hear(t time.Time) {
	n := t.UnixNano()
	for {
		prev := ns.heard.Load()
		if prev >= n || ns.heard.CompareAndSwap(prev, n) {
			return
		}
	}
}

// heardAt is when the node was last heard from; zero if never.
func (ns *session) heardAt() time.Time {
	if n := ns.heard.Load(); n != 0 {
		return time.Unix(0, n)
	}
	return time.Time{}
}

// heartbeat notes hb and returns the lease renewal that answers it, or
// nil: no lease, not the live session, or its seq already answered.
func (ns *session) heartbeat(hb *api.Heartbeat) *api.ServerMessage {
	ns.heardLate(hb.GetSeq(), hb.GetTimeUnixNano(), ns.r.now())
	if !ns.r.beat(ns) || ns.r.cfg.Lease <= 0 || !ns.uses(api.FeatureLease) {
		return nil
	}
	if seq := hb.GetSeq(); seq != 0 {
		for {
			prev := ns.renewed.Load()
			if seq <= prev {
				return nil
			}
			if ns.renewed.CompareAndSwap(prev, seq) {
				break
			}
		}
	}
	// The node's ranks may run on: the lease counts from when it sent
	// this heartbeat, no later than the server heard it.
	return &api.ServerMessage{Body: &api.ServerMessage_Lease{Lease: &api.LeaseRenewal{
		HeartbeatSeq: hb.GetSeq(), LeaseMs: uint32(ns.r.cfg.Lease / time.Millisecond)}}}
}

// close ends the session with a reason the node will log.
func (ns *session) close(reason string) {
	if ns.conn != nil {
		ns.conn.CloseWithError(transport.CodeNoError, reason)
	}
}

// Serve runs a node's session until its connection ends.
func (r *Registry) Serve(ctx context.Context, conn *transport.Conn) {
	ns := &session{r: r, conn: conn, name: conn.Name(), pending: map[uint64]chan *api.CommandAck{}}
	log := r.log.With("node", ns.name, "remote", conn.RemoteAddr().String())
	if err := ns.handshake(ctx); err != nil {
		log.Warn("node handshake failed", "err", err)
		code := transport.CodeRefused
		if held := (*SessionHeldError)(nil); errors.As(err, &held) {
			code = transport.CodeBusy // the node retries
		}
		conn.CloseWithError(code, err.Error())
		return
	}
	log.Info("node connected")
	if f := r.Pace(); f > 1 && ns.uses(api.FeatureTelemetryPace) {
		go ns.sendPace(f)
	}
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		ns.acceptStreams(ctx, log)
	}()
	if conn.Datagrams() {
		wg.Add(1)
		go func() {
			defer wg.Done()
			ns.readDatagrams(log)
		}()
	}
	err := ns.readControl()
	reason := "connection closed"
	if err != nil && !errors.Is(err, io.EOF) {
		reason = err.Error()
	}
	conn.CloseWithError(transport.CodeNoError, "session ended")
	wg.Wait()
	ns.failPending(reason)
	if ctx.Err() != nil {
		// The server is stopping, not the node failing: a restarted server
		// starts every node down until it reconnects anyway.
		return
	}
	r.disconnected(ns.name, ns, reason)
	log.Info("node disconnected", "reason", reason)
}

// handshake reads the control stream's hello and registration.
func (ns *session) handshake(ctx context.Context) error {
	hctx, cancel := context.WithTimeout(ctx, handshakeTimeout)
	defer cancel()
	st, err := ns.conn.AcceptStream(hctx)
	if err != nil {
		return fmt.Errorf("accept control stream: %w", err)
	}
	if st.Kind() != transport.StreamControl {
		return fmt.Errorf("first stream is %s, want control", st.Kind())
	}
	ns.control = st
	st.SetReadDeadline(time.Now().Add(handshakeTimeout))
	var hello api.AgentMessage
	if err := st.Recv(&hello); err != nil {
		return fmt.Errorf("read hello: %w", err)
	}
	h := hello.GetHello()
	if h == nil {
		return errors.New("first message is not a hello")
	}
	need := ns.r.neededFeatures()
	if err := api.CheckVersion(h.GetVersion()); err != nil {
		st.Send(&api.ServerMessage{Body: &api.ServerMessage_Welcome{Welcome: &api.Welcome{Version: api.CurrentVersion(), Error: err.Error(), Features: need}}})
		return err
	}
	have := api.PeerFeatures(h)
	if missing := api.MissingFeatures(have, need); len(missing) > 0 {
		err := &api.FeatureError{Version: h.GetVersion(), Missing: missing}
		st.Send(&api.ServerMessage{Body: &api.ServerMessage_Welcome{Welcome: &api.Welcome{Version: api.CurrentVersion(), Error: err.Error(), Features: need}}})
		return err
	}
	used := ns.r.usedFeatures()
	ns.features = slices.DeleteFunc(have, func(f string) bool { return !slices.Contains(used, f) })
	last, err := ns.r.cfg.Store.LastNodeEventSeq(ns.name)
	if err != nil {
		return err
	}
	var lease time.Duration
	if ns.uses(api.FeatureLease) {
		lease = ns.r.cfg.Lease
	}
	if err := ns.send(&api.ServerMessage{Body: &api.ServerMessage_Welcome{Welcome: &api.Welcome{
		Version: api.CurrentVersion(), ServerName: ns.r.cfg.ServerName, LastEventSeq: last,
		LeaseMs: uint32(lease / time.Millisecond), Features: ns.features}}}); err != nil {
		return err
	}
	var reg api.AgentMessage
	if err := st.Recv(&reg); err != nil {
		return fmt.Errorf("read registration: %w", err)
	}
	r := reg.GetRegister()
	if r == nil {
		return errors.New("second message is not a registration")
	}
	if r.GetName() != ns.name {
		return fmt.Errorf("node registers as %q but its certificate names %q: run nodemon with --name %s or rejoin with a new token", r.GetName(), ns.name, ns.name)
	}
	if hb := time.Duration(r.GetHeartbeatIntervalMs()) * time.Millisecond; ns.r.cfg.Lease > 0 && 2*hb >= ns.r.cfg.Lease {
		ns.r.log.Warn("node's heartbeat is too slow for the lease: a lost heartbeat or two stops its ranks",
			"node", ns.name, "heartbeat", hb, "lease", ns.r.cfg.Lease)
	}
	if r.GetPeerAddr() != "" && !ns.uses(api.FeaturePeerLease) {
		// Its peer listener is of no use to this server: it is no witness.
		r.PeerAddr = ""
	}
	if r, err = ns.fence(r); err != nil {
		return err
	}
	st.SetReadDeadline(time.Time{})
	return ns.r.register(r, ns.conn.RemoteAddr().String(), ns)
}

// fence kills, before the node counts as ready, every rank it reports of
// an attempt that is no longer current, and waits until the node says
// they are gone. It returns the registration without them. A node that
// cannot fence them is not let in: its ranks' leases are not renewed
// meanwhile, so their shims stop them anyway.
func (ns *session) fence(reg *api.NodeRegistration) (*api.NodeRegistration, error) {
	if ns.r.cfg.Superseded == nil || len(reg.GetRunning()) == 0 {
		return reg, nil
	}
	stale := ns.r.cfg.Superseded(ns.name, reg.GetRunning())
	if len(stale) == 0 {
		return reg, nil
	}
	type key struct {
		job     string
		attempt uint32
	}
	cmds := map[uint64]key{}
	var order []key
	for _, rk := range stale {
		k := key{rk.GetJob(), rk.GetAttempt()}
		if !slices.Contains(order, k) {
			order = append(order, k)
		}
	}
	for _, k := range order {
		id := ns.r.cmdID.Add(1)
		cmds[id] = k
		c := &api.Command{Id: id, Body: &api.Command_Signal{Signal: &api.SignalRanks{Job: k.job, Attempt: k.attempt, Signal: "SIGKILL", Fence: true}}}
		if err := ns.may(c); err != nil {
			return nil, fmt.Errorf("fence superseded ranks: %w", err)
		}
		if err := ns.send(&api.ServerMessage{Body: &api.ServerMessage_Command{Command: c}}); err != nil {
			return nil, fmt.Errorf("fence superseded ranks: %w", err)
		}
	}
	// The node answers in order; heartbeats may come between the answers
	// and count for nothing until it is registered.
	killed := map[string][]string{}
	for len(cmds) > 0 {
		var m api.AgentMessage
		if err := ns.control.Recv(&m); err != nil {
			return nil, fmt.Errorf("fence superseded ranks: %w", err)
		}
		ack := m.GetCommandAck()
		if ack == nil {
			continue
		}
		k, ok := cmds[ack.GetId()]
		if !ok {
			continue
		}
		delete(cmds, ack.GetId())
		if ack.GetError() != "" {
			return nil, fmt.Errorf("fence job %s attempt %d (superseded): %s", k.job, k.attempt, ack.GetError())
		}
		for _, rk := range ack.GetKilled() {
			killed[rk.GetJob()] = append(killed[rk.GetJob()], fmt.Sprintf("attempt %d rank %d (pid %d)", rk.GetAttempt(), rk.GetRank(), rk.GetPid()))
		}
	}
	keep := proto.Clone(reg).(*api.NodeRegistration)
	keep.Running = slices.DeleteFunc(keep.Running, func(rk *api.RankStatus) bool {
		return slices.ContainsFunc(stale, func(s *api.RankStatus) bool {
			return s.GetJob() == rk.GetJob() && s.GetAttempt() == rk.GetAttempt()
		})
	})
	ns.r.fenced(ns.name, killed)
	return keep, nil
}

// neededFeatures are the features a node must have to be let in: without
// any of them it would misread commands this server sends every node.
func (r *Registry) neededFeatures() []string {
	need := []string{api.FeatureFence, api.FeatureRunAs, api.FeatureNodeRank}
	if r.cfg.Lease > 0 {
		need = append(need, api.FeatureLease)
	}
	return need
}

// usedFeatures are the features this server uses with a node that has
// them.
func (r *Registry) usedFeatures() []string {
	if r.cfg.Lease > 0 {
		return api.NodeFeatures()
	}
	// Without a lease there is nothing for witnesses to renew either.
	return slices.DeleteFunc(api.NodeFeatures(), func(f string) bool {
		return f == api.FeatureLease || f == api.FeaturePeerLease || f == api.FeatureDenyList
	})
}

// uses reports whether this session uses feature f with the node.
func (ns *session) uses(f string) bool { return slices.Contains(ns.features, f) }

// may says whether the node can honour c: the one check every command to
// a node passes before it is sent, so that a node of an older release is
// never sent a command it would misread.
func (ns *session) may(c *api.Command) error {
	if missing := api.MissingFeatures(ns.features, api.CommandNeeds(c)); len(missing) > 0 {
		return fmt.Errorf("node %s cannot honour this command: its nodemon lacks %s; upgrade nodemon there", ns.name, strings.Join(missing, ", "))
	}
	return nil
}

func (ns *session) send(m *api.ServerMessage) error {
	ns.writeMu.Lock()
	defer ns.writeMu.Unlock()
	ns.control.SetWriteDeadline(time.Now().Add(5 * time.Second))
	return ns.control.Send(m)
}

// readControl handles heartbeats and command acks until the stream ends.
func (ns *session) readControl() error {
	for {
		var m api.AgentMessage
		if err := ns.control.Recv(&m); err != nil {
			return err
		}
		switch b := m.Body.(type) {
		case *api.AgentMessage_Heartbeat:
			if renewal := ns.heartbeat(b.Heartbeat); renewal != nil {
				if err := ns.send(renewal); err != nil {
					return fmt.Errorf("renew lease: %w", err)
				}
			}
			if err := ns.sendDeniedPeers(); err != nil {
				return fmt.Errorf("send denied peers: %w", err)
			}
		case *api.AgentMessage_CommandAck:
			ns.mu.Lock()
			if ch, ok := ns.pending[b.CommandAck.GetId()]; ok {
				ch <- b.CommandAck
				delete(ns.pending, b.CommandAck.GetId())
			}
			ns.mu.Unlock()
		default:
			return fmt.Errorf("unexpected %T on control stream", m.Body)
		}
	}
}

// acceptStreams serves the node's telemetry and event streams.
func (ns *session) acceptStreams(ctx context.Context, log interface{ Warn(string, ...any) }) {
	for {
		st, err := ns.conn.AcceptStream(ctx)
		if err != nil {
			return
		}
		switch st.Kind() {
		case transport.StreamTelemetry:
			go ns.readTelemetry(st)
		case transport.StreamEvents:
			go ns.readEvents(st, log)
		default:
			log.Warn("node opened an unexpected stream", "kind", st.Kind().String())
			st.Cancel(0)
		}
	}
}

// readDatagrams answers the heartbeats a node sends as QUIC datagrams,
// with a lease renewal by datagram: neither waits behind a stream's lost
// packets. The same heartbeats come on the control stream too, later if
// packets were lost; each is answered once.
func (ns *session) readDatagrams(log interface{ Warn(string, ...any) }) {
	ctx := ns.conn.Context()
	for {
		var m api.AgentMessage
		if err := ns.conn.ReceiveDatagram(ctx, &m); err != nil {
			if bad := (*transport.BadDatagramError)(nil); errors.As(err, &bad) {
				log.Warn("node datagram", "err", err)
				continue
			}
			return // the connection closed
		}
		hb := m.GetHeartbeat()
		if hb == nil {
			continue
		}
		if renewal := ns.heartbeat(hb); renewal != nil {
			if err := ns.conn.SendDatagram(renewal); err != nil && ctx.Err() == nil {
				log.Warn("renew lease by datagram", "err", err)
			}
		}
	}
}

// readTelemetry hands each batch to the registry's ingest queue, which
// sheds what it cannot keep up with; the stream is read at the pace the
// node sends, so a busy server never holds up a node's telemetry (nodemon
// ends a session whose batch cannot be written for 5 s).
func (ns *session) readTelemetry(st *transport.Stream) {
	for {
		if ns.r.ingestFull() {
			// Shed unread: decoding what is dropped anyway would only
			// put the server further behind.
			if err := st.Skip(); err != nil {
				return
			}
			ns.r.beat(ns)
			ns.r.shedUnread()
			continue
		}
		var m api.AgentMessage
		if err := st.Recv(&m); err != nil {
			return
		}
		if t := m.GetTelemetry(); t != nil {
			ns.r.beat(ns)
			ns.r.offer(ns.name, ns, t)
		}
	}
}

// HeldEvents bounds the events one session holds, unacknowledged, while
// the store refuses them, and EventRetryEvery paces its tries to store
// them: the session stays up meanwhile (an etcd outage stops no node), so
// the node would not send them again before a reconnect. Past the bound
// the newest are not held; the node keeps them too and sends them again
// after its next reconnect.
const (
	HeldEvents      = 10_000
	EventRetryEvery = 500 * time.Millisecond
)

// readEvents persists each event before acknowledging it. Events the store
// refuses are held, in order, and stored with those that follow once it
// takes them: a rank's exit or an XID seen while the store is away reaches
// the job owner when it returns.
func (ns *session) readEvents(st *transport.Stream, log interface{ Warn(string, ...any) }) {
	in := make(chan *api.Event)
	stop := make(chan struct{})
	defer close(stop)
	go func() {
		defer close(in)
		for {
			var m api.AgentMessage
			if err := st.Recv(&m); err != nil {
				return
			}
			if e := m.GetEvent(); e != nil {
				select {
				case in <- e:
				case <-stop:
					return
				}
			}
		}
	}()
	var held []*api.Event
	var retry <-chan time.Time
	for {
		select {
		case e, ok := <-in:
			if !ok {
				return
			}
			if len(held) == HeldEvents {
				log.Warn("node event not held: the hold is full; the node sends it again after a reconnect", "seq", e.GetSeq())
				continue
			}
			held = append(held, e)
		case <-retry:
		}
		top, err := ns.r.nodeEvents(ns.name, ns, held)
		if err != nil {
			if retry == nil {
				log.Warn("persist node event; held until the store takes it", "seq", held[0].GetSeq(), "err", err)
			}
			retry = time.After(EventRetryEvery)
			continue
		}
		held, retry = nil, nil
		if err := st.Send(&api.ServerMessage{Body: &api.ServerMessage_EventAck{EventAck: &api.EventAck{Seq: top}}}); err != nil {
			return
		}
	}
}

// command sends c to the node and waits for its acknowledgement.
func (ns *session) command(ctx context.Context, c *api.Command) error {
	_, err := ns.commandAck(ctx, c)
	return err
}

// commandAck sends c to the node and returns its acknowledgement, which
// carries the data of commands that read (ReadLogs).
func (ns *session) commandAck(ctx context.Context, c *api.Command) (*api.CommandAck, error) {
	if err := ns.may(c); err != nil {
		return nil, err
	}
	ch := make(chan *api.CommandAck, 1)
	ns.mu.Lock()
	if ns.closed {
		ns.mu.Unlock()
		return nil, fmt.Errorf("node %s disconnected", ns.name)
	}
	ns.pending[c.GetId()] = ch
	ns.mu.Unlock()
	if err := ns.send(&api.ServerMessage{Body: &api.ServerMessage_Command{Command: c}}); err != nil {
		ns.mu.Lock()
		delete(ns.pending, c.GetId())
		ns.mu.Unlock()
		return nil, fmt.Errorf("send command to %s: %w", ns.name, err)
	}
	select {
	case ack := <-ch:
		if ack == nil {
			return nil, &SessionEndedError{Node: ns.name, Reason: ns.endReason()}
		}
		if msg := ack.GetError(); msg != "" {
			return nil, &CommandError{Node: ns.name, Msg: msg, JobFault: ack.GetJobError(), NodeRefused: ack.GetNodeRefused()}
		}
		return ack, nil
	case <-ctx.Done():
		ns.mu.Lock()
		delete(ns.pending, c.GetId())
		ns.mu.Unlock()
		return nil, fmt.Errorf("command to %s: %w", ns.name, ctx.Err())
	}
}

// failPending ends the commands still waiting for an answer: their session
// is over (SessionEndedError).
func (ns *session) failPending(reason string) {
	ns.mu.Lock()
	defer ns.mu.Unlock()
	ns.closed, ns.ended = true, reason
	for id, ch := range ns.pending {
		ch <- nil
		delete(ns.pending, id)
	}
}

func (ns *session) endReason() string {
	ns.mu.Lock()
	defer ns.mu.Unlock()
	return ns.ended
}

// SessionEndedError is a command whose node's session ended before the
// node answered: it may or may not have been carried out.
type SessionEndedError struct {
	Node, Reason string
}

func (e *SessionEndedError) Error() string {
	return fmt.Sprintf("node %s disconnected before answering: %s", e.Node, e.Reason)
}

// resendable reports whether c may be sent again to a node that may have
// carried it out already: a launch of an attempt that runs is a no-op
// there, a fence of an attempt that is gone kills nothing, a Supersede is
// recorded once, a read changes nothing.
func resendable(c *api.Command) bool {
	switch b := c.GetBody().(type) {
	case *api.Command_Launch, *api.Command_Supersede, *api.Command_ReadLogs:
		return true
	case *api.Command_Signal:
		return b.Signal.GetFence()
	}
	return false
}

// Command sends a command to a connected node and returns its ack, which
// carries what a reading command (ReadLogs) read.
func (r *Registry) Command(ctx context.Context, node string, c *api.Command) (*api.CommandAck, error) {
	r.mu.RLock()
	e, ok := r.nodes[node]
	var (
		sess *session
		why  string
	)
	if ok {
		sess, why = e.session, e.rec.GetDownReason()
	}
	r.mu.RUnlock()
	switch {
	case !ok:
		return nil, fmt.Errorf("unknown node %q: `gpuctl nodes` lists the known ones", node)
	case sess == nil:
		return nil, fmt.Errorf("node %q is not connected (%s)", node, why)
	}
	c.Id = r.cmdID.Add(1)
	ack, err := sess.commandAck(ctx, c)
	var ended *SessionEndedError
	if !errors.As(err, &ended) || !resendable(c) {
		return ack, err
	}
	// The session ended under the command, most often because nodemon
	// restarted and its new session superseded the old one: the node is
	// still there. Send it once more on the node's next session, if one
	// comes while the command may still be answered.
	next, werr := r.nextSession(ctx, node, sess)
	if werr != nil {
		return nil, fmt.Errorf("%w (%v)", err, werr)
	}
	r.log.Info("command sent again on the node's new session", "node", node, "reason", ended.Reason)
	c.Id = r.cmdID.Add(1)
	return next.commandAck(ctx, c)
}

// nextSession waits for node to have a live session other than old.
func (r *Registry) nextSession(ctx context.Context, node string, old *session) (*session, error) {
	t := time.NewTicker(50 * time.Millisecond)
	defer t.Stop()
	for {
		r.mu.RLock()
		var sess *session
		if e, ok := r.nodes[node]; ok && e.session != nil && e.session != old && e.session.live.Load() {
			sess = e.session
		}
		r.mu.RUnlock()
		if sess != nil {
			return sess, nil
		}
		select {
		case <-ctx.Done():
			return nil, fmt.Errorf("no new session from %s: %w", node, ctx.Err())
		case <-t.C:
		}
	}
}

// Detect runs the heartbeat failure detector every period until ctx ends:
// a node whose heartbeats stop is down within twice its heartbeat interval
// plus one period. A tick that comes late means the server itself was not
// running (stopped, frozen, starved): that time is not counted against the
// nodes (detect), or a paused server would declare everyone down.
func (r *Registry) Detect(ctx context.Context, every time.Duration) {
	t := time.NewTicker(every)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			r.detect(every)
		}
	}
}

// detect is one tick of the detector that runs every period. A tick much
// later than due means this process stood still (SIGSTOP, a frozen VM):
// no heartbeat could be heard meanwhile, so the nodes are credited the
// pause before they are judged. The clock is read here, not taken from
// the ticker: a tick buffered before the pause is stale when received.
func (r *Registry) detect(every time.Duration) []string {
	now := r.now()
	if last := r.lastCheck; !last.IsZero() {
		if gap := now.Sub(last); gap > every+pauseTolerance {
			r.creditPause(gap - every)
		}
	}
	r.lastCheck = now
	r.storeHeld()
	return r.CheckHeartbeats()
}

// pauseTolerance is how late a detector tick may be before the lateness
// counts as the server's own pause rather than a busy moment.
const pauseTolerance = 500 * time.Millisecond

// CommandError is a node's refusal of a command. JobFault says the
// refusal is the job's fault (its command, user or checkpoint dir), not
// the node's; NodeRefused that the node refused by a policy of its own
// (root ranks without --allow-root-ranks): the job may run elsewhere.
type CommandError struct {
	Node        string
	Msg         string
	JobFault    bool
	NodeRefused bool
}

func (e *CommandError) Error() string { return fmt.Sprintf("node %s: %s", e.Node, e.Msg) }
