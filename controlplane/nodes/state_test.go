package nodes

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/quic-go/quic-go"

	"github.com/gpuctl/gpuctl/api"
	"github.com/gpuctl/gpuctl/store"
	"github.com/gpuctl/gpuctl/transport"
)

type clock struct {
	mu sync.Mutex
	t  time.Time
}

func (c *clock) now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.t
}

func (c *clock) set(t time.Time) {
	c.mu.Lock()
	c.t = t
	c.mu.Unlock()
}

// recSink records what the registry tells the job owner, in order.
type recSink struct {
	mu  sync.Mutex
	log []string
}

func (s *recSink) add(line string) {
	s.mu.Lock()
	s.log = append(s.log, line)
	s.mu.Unlock()
}

func (s *recSink) NodeUp(name string, _ *api.NodeRegistration, joined bool) {
	s.add(fmt.Sprintf("up %s joined=%v", name, joined))
}
func (s *recSink) NodeDown(name, reason string) { s.add("down " + name + ": " + reason) }
func (s *recSink) NodeEvents(name string, events []*api.Event) {
	s.add(fmt.Sprintf("events %s %d", name, len(events)))
}

func (s *recSink) lines() []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return slices.Clone(s.log)
}

func newStore(t testing.TB) *store.Bolt {
	t.Helper()
	st, err := store.OpenBolt(filepath.Join(t.TempDir(), "state.db"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	return st
}

func newRegistry(t testing.TB, st store.Store, c *clock, sink Sink) *Registry {
	t.Helper()
	cfg := Config{Store: st, Now: c.now, History: HistoryConfig{Recent: 16}}
	if sink != nil {
		cfg.Sink = sink
	}
	r, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return r
}

func reg(name string, gpus int, hbMs uint32) *api.NodeRegistration {
	r := &api.NodeRegistration{Name: name, HeartbeatIntervalMs: hbMs}
	for i := 0; i < gpus; i++ {
		r.Gpus = append(r.Gpus, &api.GPUInfo{Index: uint32(i), Uuid: fmt.Sprintf("GPU-%s-%d", name, i), Model: "H100"})
	}
	return r
}

// registerIdle registers a node through a session without a connection:
// for tests that never close it (no node goes down).
func registerIdle(t testing.TB, r *Registry, rg *api.NodeRegistration) *session {
	t.Helper()
	sess := &session{r: r, name: rg.GetName()}
	if err := r.register(rg, "127.0.0.1:1", sess); err != nil {
		t.Fatal(err)
	}
	return sess
}

func statusOf(t *testing.T, r *Registry, name string) *api.NodeStatus {
	t.Helper()
	n, err := r.Node(name)
	if err != nil {
		t.Fatal(err)
	}
	return n
}

// loopback serves a registry's node sessions over real QUIC on
// 127.0.0.1, for tests of what happens to a node's connection.
type loopback struct {
	t    *testing.T
	r    *Registry
	auth *transport.Authority
	ln   *transport.Listener
	ids  map[string]*transport.Identity
}

func newLoopback(t *testing.T, r *Registry) *loopback {
	t.Helper()
	auth, err := transport.OpenAuthority(t.TempDir(), transport.AuthorityOptions{})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	ln, err := transport.Listen(ctx, "127.0.0.1:0", auth, transport.ListenConfig{})
	if err != nil {
		cancel()
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			conn, err := ln.Accept(ctx)
			if err != nil {
				return
			}
			wg.Add(1)
			go func() {
				defer wg.Done()
				r.Serve(ctx, conn)
			}()
		}
	}()
	t.Cleanup(func() {
		cancel()
		ln.Close()
		wg.Wait()
	})
	return &loopback{t: t, r: r, auth: auth, ln: ln, ids: map[string]*transport.Identity{}}
}

// nodeConn is the node's side of a session: a nodemon speaking the
// protocol by hand.
type nodeConn struct {
	conn    *transport.Conn
	control *transport.Stream
	welcome *api.Welcome
	// refusal is the server's refusal of the hello, if it refused.
	refusal string
}

// connect joins (the first time) and registers node rg, and returns once
// the registry has it connected.
func (l *loopback) connect(rg *api.NodeRegistration) *nodeConn {
	l.t.Helper()
	name := rg.GetName()
	l.r.mu.RLock()
	var prev *session
	if e := l.r.nodes[name]; e != nil {
		prev = e.session
	}
	l.r.mu.RUnlock()
	nc := l.dial(rg)
	waitFor(l.t, name+" connected", func() bool {
		l.r.mu.RLock()
		defer l.r.mu.RUnlock()
		e := l.r.nodes[name]
		return e != nil && e.session != nil && e.session != prev && !e.down()
	})
	return nc
}

// dial joins (the first time), says hello and sends rg, and returns
// without waiting for the registry.
func (l *loopback) dial(rg *api.NodeRegistration) *nodeConn {
	l.t.Helper()
	nc := l.hello(rg.GetName(), &api.Hello{Version: api.CurrentVersion()})
	if nc.refusal != "" {
		l.t.Fatalf("welcome: %q", nc.refusal)
	}
	if err := nc.control.Send(&api.AgentMessage{Body: &api.AgentMessage_Register{Register: rg}}); err != nil {
		l.t.Fatal(err)
	}
	return nc
}

// hello joins node name (the first time), says h and returns the
// session with the server's welcome, or its refusal: in the welcome, or in
// the connection's close when that overtook it.
func (l *loopback) hello(name string, h *api.Hello) *nodeConn {
	l.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	id := l.ids[name]
	if id == nil {
		tok, _, err := l.auth.CreateToken(time.Minute)
		if err != nil {
			l.t.Fatal(err)
		}
		if id, err = transport.Join(ctx, l.ln.Addr().String(), tok, name, l.t.TempDir()); err != nil {
			l.t.Fatal(err)
		}
		l.ids[name] = id
	}
	conn, err := transport.DialNode(ctx, l.ln.Addr().String(), id)
	if err != nil {
		l.t.Fatal(err)
	}
	l.t.Cleanup(func() { conn.Close() })
	st, err := conn.OpenStream(ctx, transport.StreamControl)
	if err != nil {
		l.t.Fatal(err)
	}
	if err := st.Send(&api.AgentMessage{Body: &api.AgentMessage_Hello{Hello: h}}); err != nil {
		l.t.Fatal(err)
	}
	var m api.ServerMessage
	st.SetReadDeadline(time.Now().Add(10 * time.Second))
	nc := &nodeConn{conn: conn, control: st}
	if err := st.Recv(&m); err != nil {
		var refused *transport.RefusedError
		if !errors.As(err, &refused) {
			l.t.Fatalf("welcome: %v", err)
		}
		nc.refusal = refused.Reason
		return nc
	}
	if m.GetWelcome() == nil {
		l.t.Fatalf("first answer %v, want a welcome", &m)
	}
	st.SetReadDeadline(time.Time{})
	nc.welcome, nc.refusal = m.GetWelcome(), m.GetWelcome().GetError()
	return nc
}

// heartbeat sends a heartbeat and waits until the registry has noted it
// at the clock's time.
func (l *loopback) heartbeat(nc *nodeConn, name string, c *clock) {
	l.t.Helper()
	if err := nc.control.Send(&api.AgentMessage{Body: &api.AgentMessage_Heartbeat{Heartbeat: &api.Heartbeat{}}}); err != nil {
		l.t.Fatal(err)
	}
	want := c.now()
	waitFor(l.t, "heartbeat of "+name+" applied", func() bool {
		l.r.mu.RLock()
		defer l.r.mu.RUnlock()
		return l.r.nodes[name].lastContact().Equal(want)
	})
}

// closedReason waits for the node's connection to close and returns the
// message the server closed it with.
func (nc *nodeConn) closedReason(t *testing.T) string {
	t.Helper()
	select {
	case <-nc.conn.Context().Done():
	case <-time.After(10 * time.Second):
		t.Fatal("the node's connection is still open")
	}
	var app *quic.ApplicationError
	if err := nc.conn.Err(); errors.As(err, &app) && app.Remote {
		return app.ErrorMessage
	} else {
		t.Fatalf("connection ended with %v, want the server to close it", err)
	}
	return ""
}

func waitFor(t *testing.T, what string, ok func() bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !ok() {
		if time.Now().After(deadline) {
			t.Fatalf("%s: not within 10s", what)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

func TestHeartbeatDetector(t *testing.T) {
	t0 := time.Unix(1000, 0)
	c := &clock{t: t0}
	sink := &recSink{}
	r := newRegistry(t, newStore(t), c, sink)
	l := newLoopback(t, r)
	a := l.connect(reg("a", 2, 1000))
	b := l.connect(reg("b", 2, 250))
	steps := []struct {
		at       time.Duration
		beatA    bool
		backA    bool
		wantDown []string
		wantA    api.NodeState
	}{
		{at: 600 * time.Millisecond, wantDown: []string{"b"}, wantA: api.NodeState_NODE_STATE_READY},
		{at: 1900 * time.Millisecond, beatA: true, wantA: api.NodeState_NODE_STATE_READY},
		{at: 3800 * time.Millisecond, wantA: api.NodeState_NODE_STATE_READY},
		{at: 3950 * time.Millisecond, wantDown: []string{"a"}, wantA: api.NodeState_NODE_STATE_DOWN},
		// A down node's session is closed: it is ready again only once
		// its nodemon reconnects and registers.
		{at: 4000 * time.Millisecond, backA: true, wantA: api.NodeState_NODE_STATE_READY},
	}
	for _, st := range steps {
		c.set(t0.Add(st.at))
		if st.beatA {
			l.heartbeat(a, "a", c)
		}
		if st.backA {
			if reason := a.closedReason(t); !strings.Contains(reason, "declared down: no heartbeat for 2.05s") {
				t.Fatalf("a's session closed with %q", reason)
			}
			a = l.connect(reg("a", 2, 1000))
		}
		down := r.CheckHeartbeats()
		if !slices.Equal(down, st.wantDown) {
			t.Fatalf("at %s: down %v, want %v", st.at, down, st.wantDown)
		}
		if got := statusOf(t, r, "a").GetState(); got != st.wantA {
			t.Fatalf("at %s: a is %s, want %s", st.at, got.Short(), st.wantA.Short())
		}
	}
	if reason := b.closedReason(t); !strings.Contains(reason, "declared down: no heartbeat for 600ms") {
		t.Errorf("b's session closed with %q", reason)
	}
	want := []string{"up a joined=true", "up b joined=true", "down b: no heartbeat for 600ms", "down a: no heartbeat for 2.05s", "up a joined=false"}
	if got := sink.lines(); !slices.Equal(got, want) {
		t.Errorf("the sink heard\n%q\nwant\n%q", got, want)
	}
}

func TestRestartKeepsCordonAndMarksNodesDown(t *testing.T) {
	st := newStore(t)
	c := &clock{t: time.Unix(1000, 0)}
	r := newRegistry(t, st, c, nil)
	registerIdle(t, r, reg("a", 1, 1000))
	registerIdle(t, r, reg("c", 1, 1000))
	// c was stored cordoned by a server from before liveness and cordon
	// were apart: its state was "cordoned".
	n, _ := st.Node("c")
	n.State, n.CordonReason = api.NodeState_NODE_STATE_CORDONED, "XID 79"
	if err := st.PutNode(n); err != nil {
		t.Fatal(err)
	}
	// A new control plane over the same store: nobody is connected yet.
	c.set(time.Unix(2000, 0))
	r2 := newRegistry(t, st, c, nil)
	for _, name := range []string{"a", "c"} {
		got := statusOf(t, r2, name)
		if got.GetState() != api.NodeState_NODE_STATE_DOWN || got.GetConnected() || !got.GetStale() ||
			got.GetDownReason() != "not reconnected since the server started" || got.GetStateSinceUnixNano() != c.now().UnixNano() {
			t.Fatalf("%s after restart: %s connected %v stale %v (%q), want down until it reconnects", name, got.GetState().Short(),
				got.GetConnected(), got.GetStale(), got.GetDownReason())
		}
	}
	if got := statusOf(t, r2, "c"); !got.GetCordoned() || got.GetDraining() || got.GetCordonReason() != "XID 79" {
		t.Fatalf("c after restart: cordoned %v draining %v %q, want its cordon kept", got.GetCordoned(), got.GetDraining(), got.GetCordonReason())
	}
	sess := registerIdle(t, r2, reg("c", 1, 1000))
	got := statusOf(t, r2, "c")
	if got.GetState() != api.NodeState_NODE_STATE_READY || !got.GetConnected() || !got.GetStale() {
		t.Fatalf("c after reconnect: %s connected %v stale %v, want ready, its old figures stale", got.GetState().Short(), got.GetConnected(), got.GetStale())
	}
	r2.ingest("c", sess, &api.Telemetry{Gpus: []*api.GPUSample{{Index: 0}}})
	if statusOf(t, r2, "c").GetStale() {
		t.Fatal("c still stale after its first GPU samples")
	}
	if !got.GetCordoned() || got.GetCordonReason() != "XID 79" {
		t.Fatalf("c after reconnect: cordoned %v %q, want its cordon kept", got.GetCordoned(), got.GetCordonReason())
	}
	if stored, _ := st.Node("c"); stored.GetState() != api.NodeState_NODE_STATE_READY || !stored.GetCordoned() || stored.GetCordonReason() != "XID 79" {
		t.Errorf("c stored as %s cordoned %v %q", stored.GetState().Short(), stored.GetCordoned(), stored.GetCordonReason())
	}
}

func TestGPUFaultEventsMarkGPUUnhealthy(t *testing.T) {
	st := newStore(t)
	sink := &recSink{}
	r := newRegistry(t, st, &clock{t: time.Unix(1, 0)}, sink)
	sess := registerIdle(t, r, reg("a", 4, 1000))
	events := []*api.Event{
		{Seq: 1, Kind: api.EventKind_EVENT_KIND_XID, GpuIndex: 0, Xid: 13, XidClass: api.XIDClass_XID_CLASS_RESTART_APP},
		{Seq: 2, Kind: api.EventKind_EVENT_KIND_XID, GpuIndex: 1, Xid: 79, XidClass: api.XIDClass_XID_CLASS_REBOOT_NODE},
		{Seq: 3, Kind: api.EventKind_EVENT_KIND_ECC, GpuIndex: 2, Severity: api.Severity_SEVERITY_CRITICAL},
		{Seq: 4, Kind: api.EventKind_EVENT_KIND_THROTTLE, GpuIndex: 3, Severity: api.Severity_SEVERITY_WARNING},
	}
	top, err := r.nodeEvents("a", sess, events)
	if err != nil || top != 4 {
		t.Fatalf("nodeEvents = %d, %v", top, err)
	}
	want := []bool{true, false, false, true}
	for i, g := range statusOf(t, r, "a").GetGpus() {
		if g.GetHealthy() != want[i] {
			t.Errorf("GPU %d healthy=%v (%s), want %v", i, g.GetHealthy(), g.GetUnhealthyReason(), want[i])
		}
	}
	// Health is persisted, and a resend after a reconnect changes nothing.
	stored, _ := st.Node("a")
	for i, g := range stored.GetGpus() {
		if g.GetHealthy() != want[i] {
			t.Errorf("stored GPU %d healthy=%v, want %v", i, g.GetHealthy(), want[i])
		}
	}
	if top, err := r.nodeEvents("a", sess, events); err != nil || top != 4 {
		t.Fatalf("resend: nodeEvents = %d, %v", top, err)
	}
	if got := sink.lines(); !slices.Equal(got, []string{"up a joined=true", "events a 4"}) {
		t.Errorf("the sink heard %q, want each event once", got)
	}
}

func TestIngestAggregatesCollectives(t *testing.T) {
	r := newRegistry(t, newStore(t), &clock{t: time.Unix(2, 0)}, nil)
	sess := registerIdle(t, r, reg("a", 1, 1000))
	call := func(seq uint64, op api.NCCLOp, comm uint64) *api.CollectiveRecord {
		return &api.CollectiveRecord{Pid: 7, Job: "j", Rank: 1, Op: op, Comm: comm, Seq: seq, Bytes: 100, DurationNs: 1e6, StartUnixNano: int64(seq)}
	}
	r.ingest("a", sess, &api.Telemetry{Collectives: []*api.CollectiveRecord{
		call(1, api.NCCLOp_NCCL_OP_ALL_REDUCE, 1), call(2, api.NCCLOp_NCCL_OP_ALL_REDUCE, 1),
		call(1, api.NCCLOp_NCCL_OP_ALL_REDUCE, 2), {Pid: 7, Op: api.NCCLOp_NCCL_OP_ALL_REDUCE, Comm: 1, Seq: 3, InProgress: true},
	}})
	r.ingest("ghost", &session{}, &api.Telemetry{Collectives: []*api.CollectiveRecord{call(9, api.NCCLOp_NCCL_OP_SEND, 1)}})
	// A batch from a session that is not the node's current one is stale.
	r.ingest("a", &session{}, &api.Telemetry{Collectives: []*api.CollectiveRecord{call(3, api.NCCLOp_NCCL_OP_ALL_REDUCE, 1)}})
	cs := r.Collectives("j", "")
	if len(cs) != 2 {
		t.Fatalf("%d aggregates, want 2 (one per communicator): %v", len(cs), cs)
	}
	if c := cs[0]; c.Calls != 2 || c.Seq != 2 || c.Bytes != 200 || c.InCallSeconds != 0.002 {
		t.Fatalf("comm 1 aggregate = %v", c)
	}
	if got := r.Collectives("other", ""); len(got) != 0 {
		t.Fatalf("job filter leaked %v", got)
	}
	if got := r.Collectives("", "ghost"); len(got) != 0 || r.Known("ghost") {
		t.Fatalf("an unknown node's batch was applied: %v", got)
	}
}

// TestDownClosesSession: a node the detector declares down has its
// session closed (a nodemon that is only slow reconnects), is shown
// disconnected with stale figures, keeps its cordon, and nothing more from
// the old session is applied.
func TestDownClosesSession(t *testing.T) {
	t0 := time.Unix(1000, 0)
	c := &clock{t: t0}
	st := newStore(t)
	r := newRegistry(t, st, c, nil)
	l := newLoopback(t, r)
	nc := l.connect(reg("a", 1, 1000))
	r.mu.RLock()
	old := r.nodes["a"].session
	r.mu.RUnlock()
	if _, err := r.SetCordon("a", ActionCordon, "flaky NIC"); err != nil {
		t.Fatal(err)
	}
	c.set(t0.Add(2500 * time.Millisecond))
	if down := r.CheckHeartbeats(); !slices.Equal(down, []string{"a"}) {
		t.Fatalf("down %v, want a", down)
	}
	if reason := nc.closedReason(t); reason != "declared down: no heartbeat for 2.5s" {
		t.Errorf("the node's connection closed with %q", reason)
	}
	for _, n := range []*api.NodeStatus{statusOf(t, r, "a"), func() *api.NodeStatus { n, _ := st.Node("a"); return n }()} {
		if n.GetState() != api.NodeState_NODE_STATE_DOWN || n.GetConnected() || !n.GetStale() || n.GetDownReason() != "no heartbeat for 2.5s" ||
			n.GetStateSinceUnixNano() != c.now().UnixNano() {
			t.Errorf("down node: %s connected %v stale %v reason %q since %d", n.GetState().Short(), n.GetConnected(), n.GetStale(),
				n.GetDownReason(), n.GetStateSinceUnixNano())
		}
		if !n.GetCordoned() || n.GetCordonReason() != "flaky NIC" {
			t.Errorf("down node lost its cordon: %v %q", n.GetCordoned(), n.GetCordonReason())
		}
	}
	if r.Connected("a") {
		t.Error("a down node still counts as connected")
	}
	if _, err := r.Command(context.Background(), "a", &api.Command{}); err == nil || !strings.Contains(err.Error(), "is not connected (no heartbeat for 2.5s)") {
		t.Errorf("command to a down node: %v", err)
	}
	// The old session's late reports are dropped.
	r.ingest("a", old, &api.Telemetry{Ranks: []*api.RankStatus{{Job: "j", Pid: 1}}})
	r.beat(old)
	if n := statusOf(t, r, "a"); n.GetState() != api.NodeState_NODE_STATE_DOWN || n.GetLastSeenUnixNano() == c.now().UnixNano() {
		t.Errorf("a late batch of the closed session revived the node: %s", n.GetState().Short())
	}
	if nrs := r.Ranks(""); len(nrs) != 0 {
		t.Errorf("ranks of a down node listed: %v", nrs)
	}
	// Its nodemon reconnects: ready, connected, still cordoned, its old
	// figures stale until it samples again.
	l.connect(reg("a", 1, 1000))
	if n := statusOf(t, r, "a"); n.GetState() != api.NodeState_NODE_STATE_READY || !n.GetConnected() || !n.GetStale() ||
		n.GetDownReason() != "" || !n.GetCordoned() || n.GetCordonReason() != "flaky NIC" {
		t.Errorf("after reconnecting: %v", n)
	}
}

// BenchmarkIngest measures the server's cost to decode and apply one
// node's telemetry batch (8 GPU samples and 20 traced calls) arriving from
// many nodes, on one core.
func BenchmarkIngest(b *testing.B) {
	const nodes = 1000
	r := newRegistry(b, newStore(b), &clock{t: time.Unix(1, 0)}, nil)
	names := make([]string, nodes)
	sessions := make([]*session, nodes)
	for i := range names {
		names[i] = fmt.Sprintf("n%04d", i)
		sessions[i] = registerIdle(b, r, reg(names[i], 8, 1000))
	}
	t := &api.Telemetry{}
	for g := 0; g < 8; g++ {
		t.Gpus = append(t.Gpus, &api.GPUSample{Index: uint32(g), Uuid: "GPU-x", UtilGpuPercent: 90, MemUsedBytes: 1 << 34,
			PowerMw: 650000, EnergyMj: 1 << 40, TempC: 70, SmClockMhz: 1980, ThrottleNames: []string{"sw_power_cap"},
			Ecc: &api.ECCCounts{}, Processes: []*api.GPUProcess{{Pid: 100, UsedMemBytes: 1 << 34, Name: "python"}}})
	}
	for c := 0; c < 20; c++ {
		t.Collectives = append(t.Collectives, &api.CollectiveRecord{Pid: 100, Op: api.NCCLOp_NCCL_OP_ALL_REDUCE, Comm: 1, Seq: uint64(c), Bytes: 1 << 20, DurationNs: 1e6})
	}
	var frame bytes.Buffer
	if err := api.WriteFrame(&frame, &api.AgentMessage{Body: &api.AgentMessage_Telemetry{Telemetry: t}}); err != nil {
		b.Fatal(err)
	}
	raw := frame.Bytes()
	// decode alone is the baseline: the cost any server pays to read the
	// batch off the wire; apply adds what gpuctl serve does with it.
	for _, apply := range []bool{false, true} {
		name := "decode"
		if apply {
			name = "decode+apply"
		}
		b.Run(name, func(b *testing.B) {
			start := time.Now()
			for i := 0; i < b.N; i++ {
				var m api.AgentMessage
				if err := api.NewFrameReader(bytes.NewReader(raw)).Read(&m); err != nil {
					b.Fatal(err)
				}
				if apply {
					r.ingest(names[i%nodes], sessions[i%nodes], m.GetTelemetry())
				}
			}
			el := time.Since(start).Seconds()
			b.ReportMetric(float64(b.N*8)/el, "gpu_samples/s")
			b.ReportMetric(float64(b.N)/el, "nodes_at_1Hz/core")
		})
	}
}

// TestClosedConnectionIsDownOnlyIfItStaysAway: a node whose connection
// closes is disconnected at once but still up; it reconnects within twice
// its heartbeat and was never down (a server that stood still past QUIC's
// idle timeout finds every connection closed as it resumes). One that
// stays away is down then, saying its connection closed.
func TestClosedConnectionIsDownOnlyIfItStaysAway(t *testing.T) {
	t0 := time.Unix(1000, 0)
	c := &clock{t: t0}
	sink := &recSink{}
	r := newRegistry(t, newStore(t), c, sink)
	l := newLoopback(t, r)
	nc := l.connect(reg("a", 1, 1000))
	nc.conn.Close()
	waitFor(t, "a disconnected", func() bool { return !r.Connected("a") })
	if n := statusOf(t, r, "a"); n.GetState() != api.NodeState_NODE_STATE_READY || n.GetConnected() {
		t.Fatalf("right after its connection closed: %s connected %v", n.GetState().Short(), n.GetConnected())
	}
	c.set(t0.Add(1500 * time.Millisecond))
	if down := r.CheckHeartbeats(); len(down) != 0 {
		t.Fatalf("down %v 1.5 s after the close, within twice its heartbeat", down)
	}
	back := l.connect(reg("a", 1, 1000))
	c.set(t0.Add(2500 * time.Millisecond))
	if down := r.CheckHeartbeats(); len(down) != 0 {
		t.Fatalf("down %v though it came back", down)
	}
	if got := sink.lines(); slices.ContainsFunc(got, func(s string) bool { return strings.HasPrefix(s, "down") }) {
		t.Errorf("the job owner heard %q, want no down", got)
	}

	nc = l.connect(reg("b", 1, 1000))
	nc.conn.Close()
	waitFor(t, "b disconnected", func() bool { return !r.Connected("b") })
	c.set(t0.Add(5 * time.Second))
	l.heartbeat(back, "a", c)
	if down := r.CheckHeartbeats(); !slices.Equal(down, []string{"b"}) {
		t.Fatalf("down %v, want b, away 2.5 s", down)
	}
	if n := statusOf(t, r, "b"); !strings.HasPrefix(n.GetDownReason(), "connection closed (") || !strings.Contains(n.GetDownReason(), "and not back for") {
		t.Errorf("b down because %q", n.GetDownReason())
	}
}

// TestProgressFollowsCompletion: where the profiler plugin reports
// completions, a rank's progress is what completed, and a collective it
// returned from (the enqueue, on a GPU) but whose work has not completed
// is the one it is inside. Without completions the calls are the progress.
func TestProgressFollowsCompletion(t *testing.T) {
	r := newRegistry(t, newStore(t), &clock{t: time.Unix(2, 0)}, nil)
	sess := registerIdle(t, r, reg("a", 1, 1000))
	const comm = 0xc0
	call := func(seq uint64, completion bool) *api.CollectiveRecord {
		return &api.CollectiveRecord{Pid: 7, Job: "j", Rank: 1, Op: api.NCCLOp_NCCL_OP_ALL_REDUCE, Comm: comm, Seq: seq,
			Bytes: 64, DurationNs: 1e6, StartUnixNano: int64(seq) * 1e9, Completion: completion}
	}
	send := func(inFlight []*api.CollectiveRecord, recs ...*api.CollectiveRecord) {
		r.ingest("a", sess, &api.Telemetry{Gpus: []*api.GPUSample{{Index: 0}},
			Ranks: []*api.RankStatus{{Pid: 7, Job: "j", Rank: 1}}, InFlight: inFlight, Collectives: recs})
	}
	progress := func() CommProgress {
		t.Helper()
		rps := r.Progress(map[string]uint32{"j": 0})["j"]
		if len(rps) != 1 || len(rps[0].Comms) != 1 {
			t.Fatalf("progress = %+v, want one rank with one communicator", rps)
		}
		return rps[0].Comms[0]
	}
	in := func(cp CommProgress) uint64 { return cp.In.GetSeq() }

	send(nil, call(1, false), call(2, false))
	if cp := progress(); cp.Done != 2 || cp.In != nil {
		t.Fatalf("calls alone: done %d, in %d; want 2, none", cp.Done, in(cp))
	}
	// Completions arrive; calls 3 and 4 return before their work is done.
	send(nil, call(2, true), call(3, false), call(4, false), call(3, true))
	if cp := progress(); cp.Done != 3 || in(cp) != 4 || !cp.In.GetInProgress() || cp.In.GetBytes() != 64 {
		t.Fatalf("4 enqueued, 3 complete: done %d, in %v; want 3, inside 4", cp.Done, cp.In)
	}
	// The host thread inside call 5 is ahead of the GPU, still on 4.
	five := call(5, false)
	five.InProgress = true
	send([]*api.CollectiveRecord{five})
	if cp := progress(); in(cp) != 4 {
		t.Fatalf("inside call 5 with 4 not complete: in %d, want 4", in(cp))
	}
	// 4 and 5 complete while the thread is still returning from 5.
	send([]*api.CollectiveRecord{five}, call(4, true), call(5, true))
	if cp := progress(); cp.Done != 5 || cp.In != nil {
		t.Fatalf("5 complete: done %d, in %d; want 5, none", cp.Done, in(cp))
	}
	if c := r.Collectives("j", "")[0]; c.Calls != 4 || c.Completions != 4 || c.CompletedSeq != 5 || c.GpuSeconds != 0.004 {
		t.Errorf("aggregate = %v; want 4 calls (the in-flight one not yet counted), 4 completions to seq 5", c)
	}
}
