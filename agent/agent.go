// Package agent is nodemon: it samples the host's GPUs and traces its
// NCCL calls and network flows, streams all of it to gpuctl serve over
// QUIC, and carries out the server's commands on the host.
package agent

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/protobuf/proto"

	"github.com/gpuctl/gpuctl/api"
	"github.com/gpuctl/gpuctl/transport"
)

// Version is nodemon's software version reported at registration.
const Version = api.Release

// Config configures nodemon.
type Config struct {
	// Server is the UDP address of gpuctl serve (host:port), or of every
	// server of a highly available control plane, comma-separated:
	// nodemon finds the leader among them (transport.ParseServers).
	Server string
	// Token is the join token, needed only until the node has a certificate.
	Token string
	// Name is the node's name; default the host name.
	Name string
	// DataDir keeps the node identity and rank logs.
	DataDir string
	// Interval is the GPU sampling interval, default 1 s.
	Interval time.Duration
	// Heartbeat is the heartbeat interval, default 1 s.
	Heartbeat time.Duration
	// Labels are topology and placement labels (rack, switch, …).
	Labels map[string]string
	// TelemetryBuffer bounds the batches kept while disconnected, default 600.
	TelemetryBuffer int
	// LogMaxBytes and LogKeep set rank log rotation, default 64 MiB and 3
	// rotated files.
	LogMaxBytes int64
	LogKeep     int
	// CgroupRoot is the cgroup v2 mount for job cgroups, default
	// /sys/fs/cgroup; "off" turns them off.
	CgroupRoot string
	// AllowRootRanks lets ranks run as root (nodemon --allow-root-ranks).
	AllowRootRanks bool
	// SlurmNode, when set, is this node's name in Slurm: its Slurm tasks
	// are reported as this node's ranks (nodemon --slurm-node).
	SlurmNode string
	// KubeNode, when set, is this node's Kubernetes Node name: the ranks
	// of gpuctl's pods on it are reported as this node's (nodemon
	// --kube-node).
	KubeNode string
	// PeerListen is where other nodes ask this one to vouch for their
	// ranks (peer lease), default 0.0.0.0 on the port it used last time
	// (kept in <data-dir>/peer-port) or a free one; "off": none, and this
	// node is no witness.
	PeerListen string
	// PeerAdvertise is the address other nodes dial for it; default the
	// listener's host, or this host's address toward the server.
	PeerAdvertise string
	// OnEvent, when set, sees every event nodemon queues for the server,
	// as it is queued (the device plugin's GPU health).
	OnEvent func(*api.Event)
	Log     *slog.Logger
}

// Agent is a running nodemon.
type Agent struct {
	cfg    Config
	log    *slog.Logger
	probes *Probes
	exec   *Executor

	telemetry *telemetryBuffer
	events    *eventQueue
	metrics   *metrics
	// beats turns the server's lease renewals into deadlines.
	beats *leaseClock
	// servers is which server to dial next.
	servers *transport.Servers
	// silenceLimit is how long a session with a lease may go without a
	// word from the server before nodemon takes the server for dead.
	silenceLimit time.Duration
	// book is what this node, as a witness, knows of superseded attempts.
	book *witnessBook
}

// New builds an agent around already-opened probes.
func New(cfg Config, p *Probes) (*Agent, error) {
	if cfg.Server == "" {
		return nil, errors.New("--server is required")
	}
	addrs, err := transport.ParseServers(cfg.Server)
	if err != nil {
		return nil, fmt.Errorf("--server: %w", err)
	}
	if cfg.DataDir == "" {
		return nil, errors.New("--data-dir is required")
	}
	if cfg.Name == "" {
		h, err := os.Hostname()
		if err != nil {
			return nil, fmt.Errorf("no --name and no host name: %w", err)
		}
		cfg.Name = h
	}
	if err := transport.ValidateName(cfg.Name); err != nil {
		return nil, fmt.Errorf("--name: %w", err)
	}
	if cfg.Interval <= 0 {
		cfg.Interval = time.Second
	}
	if cfg.Heartbeat <= 0 {
		cfg.Heartbeat = time.Second
	}
	if cfg.TelemetryBuffer <= 0 {
		cfg.TelemetryBuffer = 600
	}
	if cfg.Log == nil {
		cfg.Log = slog.New(slog.DiscardHandler)
	}
	a := &Agent{
		cfg:          cfg,
		log:          cfg.Log.With("node", cfg.Name),
		probes:       p,
		telemetry:    newTelemetryBuffer(cfg.TelemetryBuffer),
		events:       newEventQueue(100_000),
		beats:        newLeaseClock(),
		servers:      transport.NewServers(addrs),
		silenceLimit: SilenceLimit(cfg.Heartbeat),
	}
	a.metrics = newMetrics(cfg.Name, a.events.len, p.inventory)
	a.events.observe = a.metrics.event
	if cfg.OnEvent != nil {
		a.events.observe = func(e *api.Event) {
			a.metrics.event(e)
			cfg.OnEvent(e)
		}
	}
	x, err := NewExecutor(ExecutorOptions{
		Node: cfg.Name, DataDir: cfg.DataDir, OnEvent: a.events.add, Log: a.log,
		LogMaxBytes: cfg.LogMaxBytes, LogKeep: cfg.LogKeep, CgroupRoot: cfg.CgroupRoot,
		AllowRootRanks: cfg.AllowRootRanks, Env: p.rankEnv(), SlurmNode: cfg.SlurmNode, KubeNode: cfg.KubeNode,
		BeforeLaunch: p.prepareLaunch, OnAdopt: p.attachPid,
	})
	if err != nil {
		return nil, err
	}
	a.exec = x
	if a.book, err = openWitnessBook(cfg.DataDir, a.log); err != nil {
		return nil, err
	}
	return a, nil
}

// Collector returns nodemon's Prometheus collector.
func (a *Agent) Collector() prometheus.Collector { return a.metrics }

// Run connects, streams and obeys until ctx ends; then it stops the ranks
// it launched.
func (a *Agent) Run(ctx context.Context) error {
	id, err := a.identity(ctx)
	if err != nil {
		return err
	}
	// Ranks launched from now on carry the cluster's name, and the probes
	// leave out another cluster's ranks on a shared host.
	cluster := transport.ClusterID(id.CA)
	a.exec.SetCluster(cluster)
	a.probes.SetCluster(cluster)
	reg, err := a.registration()
	if err != nil {
		return err
	}
	peers, err := a.listenPeers(id)
	if err != nil {
		return err
	}
	var wg sync.WaitGroup
	if peers != nil {
		defer peers.Close()
		reg.PeerAddr = a.cfg.PeerAdvertise
		if reg.PeerAddr == "" {
			reg.PeerAddr = peerAdvertise(peers.Addr(), a.servers.Next())
		}
		pd, err := transport.NewDialer(a.log)
		if err != nil {
			return err
		}
		defer pd.Close()
		v := &voucher{id: id, d: pd, exec: a.exec, book: a.book, log: a.log, every: a.cfg.Heartbeat,
			conns: map[string]*witnessConn{}, told: map[attemptKey]bool{}}
		a.log.Info("vouching for other nodes", "listen", peers.Addr().String(), "advertise", reg.PeerAddr)
		wg.Add(2)
		go func() {
			defer wg.Done()
			a.book.serve(ctx, peers)
		}()
		go func() {
			defer wg.Done()
			v.run(ctx)
		}()
	}
	wg.Add(1)
	go func() {
		defer wg.Done()
		a.probes.run(ctx, a.cfg.Interval, a.exec, func(t *api.Telemetry) {
			a.metrics.observe(t)
			a.telemetry.add(t)
		}, a.events)
	}()
	defer func() {
		a.exec.StopAll(10 * time.Second)
		a.exec.Close()
		wg.Wait()
	}()
	d, err := transport.NewDialer(a.log)
	if err != nil {
		return err
	}
	defer d.Close()
	// The pauses start over whenever the server answers a hello: a server
	// that crashed during a session was reachable, and the one restarted
	// after it waits only transport.NodeReconnectWithin for this node.
	// With several servers, a failed one is followed at once by the next:
	// the pause comes only once every server has failed in turn.
	backoff := transport.Backoff{Base: transport.NodeReconnectBase, Max: transport.NodeReconnectMax, Jitter: 0.2}
	for ctx.Err() == nil {
		// Every server of the round is dialled, staggered, not in turn: a
		// dead first server costs DialStagger, not a dial timeout.
		conn, addr, err := transport.DialRound(ctx, a.servers, func(ctx context.Context, addr string) (*transport.Conn, error) {
			dctx, cancel := context.WithTimeout(ctx, transport.NodeDialTimeout)
			defer cancel()
			return d.DialNode(dctx, addr, id)
		})
		if err == nil {
			err = a.session(ctx, conn, addr, reg, func() {
				a.servers.Succeeded(addr)
				backoff.Reset()
			})
		} else if addr == "" {
			addr = a.servers.Next()
		}
		if ctx.Err() != nil {
			break
		}
		var refused *transport.RefusedError
		if errors.As(err, &refused) {
			return fmt.Errorf("server %s refused this node: %w", addr, err)
		}
		var nl *transport.NotLeaderError
		if errors.As(err, &nl) && nl.Leader != "" && a.servers.Redirect(addr, nl.Leader) {
			// Not a failure: the leader is dialled at once.
			a.log.Info("server is a standby; dialing the leader", "server", addr, "leader", nl.Leader)
			continue
		}
		if conn != nil && !a.servers.Failed(addr) {
			a.log.Warn("lost server; trying the next", "server", addr, "err", err, "next", a.servers.Next())
			continue
		}
		delay := backoff.Next()
		a.log.Warn("disconnected from server; retrying", "server", addr, "err", err, "in", delay.Round(time.Millisecond), "attempt", backoff.Attempt(), "next", a.servers.Next())
		select {
		case <-ctx.Done():
		case <-time.After(delay):
		}
	}
	return nil
}

// identity loads the node certificate, joining with the token the first
// time.
func (a *Agent) identity(ctx context.Context) (*transport.Identity, error) {
	dir := filepath.Join(a.cfg.DataDir, "identity")
	id, err := transport.LoadNodeIdentity(dir)
	if err == nil {
		return id, nil
	}
	if !errors.Is(err, os.ErrNotExist) {
		return nil, fmt.Errorf("load identity from %s: %w", dir, err)
	}
	if a.cfg.Token == "" {
		return nil, fmt.Errorf("no identity in %s yet: pass --token (make one with `gpuctl token create`)", dir)
	}
	return a.join(ctx, dir)
}

// join trades the token for a node identity at the leader: a standby
// sends the join on to it. A server busy with other joins (a rack joining
// at once, or a flood), or a standby with no leader yet, is worth waiting
// for, unlike a refusal; one that cannot be reached gives way to the next
// server, and the join fails once every server failed in one round with
// none busy.
func (a *Agent) join(ctx context.Context, dir string) (*transport.Identity, error) {
	backoff := transport.Backoff{Base: joinRetryBase, Max: 30 * time.Second}
	var unreachable []error
	busy := false
	for {
		addr := a.servers.Next()
		jctx, cancel := context.WithTimeout(ctx, 30*time.Second)
		id, err := transport.Join(jctx, addr, a.cfg.Token, a.cfg.Name, dir)
		cancel()
		if err == nil {
			a.servers.Succeeded(addr)
			a.log.Info("joined cluster", "server", addr)
			return id, nil
		}
		if ctx.Err() != nil {
			return nil, fmt.Errorf("join %s: %w", addr, ctx.Err())
		}
		var nl *transport.NotLeaderError
		if errors.As(err, &nl) && nl.Leader != "" && a.servers.Redirect(addr, nl.Leader) {
			a.log.Info("server is a standby; joining at the leader", "server", addr, "leader", nl.Leader)
			continue
		}
		var refused *transport.RefusedError
		if errors.As(err, &refused) {
			return nil, err // transport.Join names the server
		}
		if transport.IsBusy(err) {
			busy = true
		} else {
			unreachable = append(unreachable, err)
		}
		if !a.servers.Failed(addr) {
			a.log.Warn("join failed; trying the next server", "server", addr, "err", err, "next", a.servers.Next())
			continue
		}
		switch {
		case busy:
		case len(unreachable) == 1:
			return nil, err
		default:
			return nil, fmt.Errorf("join: no server of %s could be reached: %w", a.servers, errors.Join(unreachable...))
		}
		busy, unreachable = false, nil
		delay := backoff.Next()
		a.log.Warn("server busy; retrying the join", "err", err, "in", delay.Round(time.Millisecond), "attempt", backoff.Attempt())
		select {
		case <-ctx.Done():
			return nil, fmt.Errorf("join %s: %w", addr, ctx.Err())
		case <-time.After(delay):
		}
	}
}

// joinRetryBase is the first pause after a busy server turned a join away.
const joinRetryBase = 500 * time.Millisecond

// registration describes the node; the ranks running change, so each
// session fills them in (sessionRegistration).
func (a *Agent) registration() (*api.NodeRegistration, error) {
	gpus, driver, cuda, err := a.probes.inventory()
	if err != nil {
		return nil, fmt.Errorf("GPU inventory: %w", err)
	}
	host, _ := os.Hostname()
	instance, err := instanceID(a.cfg.DataDir)
	if err != nil {
		return nil, fmt.Errorf("nodemon: %w", err)
	}
	return &api.NodeRegistration{
		Name: a.cfg.Name, Hostname: host, Gpus: gpus, Nics: listNICs(), Labels: a.cfg.Labels,
		SimProfile: a.probes.simProfile(), HeartbeatIntervalMs: uint32(a.cfg.Heartbeat / time.Millisecond),
		AgentVersion: Version, DriverVersion: driver, CudaVersion: cuda, InstanceId: instance,
	}, nil
}

// sessionRegistration is base with the ranks running now, launched and
// adopted, so a (re)connect tells the server what runs here.
func (a *Agent) sessionRegistration(base *api.NodeRegistration) *api.NodeRegistration {
	reg := proto.Clone(base).(*api.NodeRegistration)
	reg.Running = a.exec.RankStatuses()
	return reg
}

// session runs one connection to the server at addr until it fails;
// welcomed is called once the server has answered the hello.
func (a *Agent) session(ctx context.Context, conn *transport.Conn, addr string, base *api.NodeRegistration, welcomed func()) error {
	defer conn.Close()
	// Each server asks for its own pace (a new one sends it when it is
	// not 1): a pace an old session asked for ends with it.
	a.probes.SetPace(1)
	sctx, stop := context.WithCancelCause(ctx)
	defer stop(nil)
	control, lease, err := a.handshake(sctx, conn, a.sessionRegistration(base))
	if err != nil {
		var nl *transport.NotLeaderError
		if errors.As(err, &nl) {
			nl.Server = addr
		}
		return err
	}
	welcomed()
	a.log.Info("connected", "server", addr)
	heard := newHearing(time.Now())
	var writeMu sync.Mutex
	sendControl := func(m *api.AgentMessage) error {
		writeMu.Lock()
		defer writeMu.Unlock()
		control.SetWriteDeadline(time.Now().Add(5 * time.Second))
		return control.Send(m)
	}
	var wg sync.WaitGroup
	run := func(name string, f func() error) {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if err := f(); err != nil {
				stop(fmt.Errorf("%s: %w", name, err))
			}
		}()
	}
	run("heartbeat", func() error { return a.heartbeats(sctx, conn, sendControl) })
	run("commands", func() error { return a.commands(sctx, control, sendControl, heard) })
	if conn.Datagrams() {
		run("datagrams", func() error { return a.datagrams(sctx, conn, heard) })
	}
	if lease > 0 && len(a.servers.Addrs()) > 1 {
		// Only a server that grants a lease answers every heartbeat, so
		// only then is its silence a sign that it is gone. With one server
		// there is nowhere else to go: a server that only stood still
		// (SIGSTOP, a frozen host) keeps its session, which a reconnect
		// would end, so QUIC's idle timeout is the judge there.
		run("watchdog", func() error { return a.watchdog(sctx, heard) })
	}
	run("telemetry", func() error { return a.sendTelemetry(sctx, conn) })
	run("events", func() error { return a.sendEvents(sctx, conn) })
	<-sctx.Done()
	conn.Close()
	wg.Wait()
	return context.Cause(sctx)
}

// handshake says hello and registers; it returns the control stream and
// the lease granted. A standby's refusal is a *transport.NotLeaderError.
func (a *Agent) handshake(ctx context.Context, conn *transport.Conn, reg *api.NodeRegistration) (*transport.Stream, time.Duration, error) {
	control, err := conn.OpenStream(ctx, transport.StreamControl)
	if err != nil {
		return nil, 0, err
	}
	control.SetDeadline(time.Now().Add(transport.NodeDialTimeout))
	// The server hears of this node no earlier than now: a lease it grants
	// in this session cannot end before now plus the lease.
	hello := time.Now()
	if err := control.Send(&api.AgentMessage{Body: &api.AgentMessage_Hello{Hello: &api.Hello{
		Version: api.CurrentVersion(), Role: "node", Software: "nodemon " + Version, Features: api.NodeFeatures()}}}); err != nil {
		return nil, 0, fmt.Errorf("send hello: %w", err)
	}
	var m api.ServerMessage
	if err := control.Recv(&m); err != nil {
		return nil, 0, fmt.Errorf("read welcome: %w", err)
	}
	w := m.GetWelcome()
	if w == nil {
		return nil, 0, errors.New("server answered hello without a welcome")
	}
	if err := welcomeError(w); err != nil {
		return nil, 0, err
	}
	a.events.welcome(w.GetLastEventSeq())
	a.beats.reset()
	lease := time.Duration(w.GetLeaseMs()) * time.Millisecond
	a.exec.BeginLease(lease, hello)
	if err := control.Send(&api.AgentMessage{Body: &api.AgentMessage_Register{Register: reg}}); err != nil {
		return nil, 0, fmt.Errorf("send registration: %w", err)
	}
	control.SetDeadline(time.Time{})
	return control, lease, nil
}

// welcomeError reads a welcome's refusal. A standby names the leader, or
// none while no leader is elected: a *transport.NotLeaderError, to go on
// with. A refusal from a server of another protocol version, or one that
// needs a feature this nodemon lacks, is final (a *transport.RefusedError):
// no server of that release will take this node. (The version and the
// features are the only refusals a leader sends in a welcome.)
func welcomeError(w *api.Welcome) error {
	msg := w.GetError()
	switch {
	case msg == "":
		return nil
	case w.GetLeaderAddr() != "":
		return &transport.NotLeaderError{Leader: w.GetLeaderAddr(), Reason: msg}
	case api.CheckVersion(w.GetVersion()) != nil,
		len(api.MissingFeatures(api.NodeFeatures(), w.GetFeatures())) > 0:
		return &transport.RefusedError{Reason: msg}
	}
	return &transport.NotLeaderError{Reason: msg}
}

// heartbeats sends a heartbeat every interval: by datagram first, where
// the server takes them, which no lost telemetry packet holds up, then on
// the control stream, which is reliable but in order behind anything
// lost before it. The server answers whichever comes first.
func (a *Agent) heartbeats(ctx context.Context, conn *transport.Conn, send func(*api.AgentMessage) error) error {
	t := time.NewTicker(a.cfg.Heartbeat)
	defer t.Stop()
	datagrams := conn.Datagrams()
	var seq uint64
	for {
		seq++
		now := time.Now()
		a.beats.sentAt(seq, now)
		m := &api.AgentMessage{Body: &api.AgentMessage_Heartbeat{Heartbeat: &api.Heartbeat{
			TimeUnixNano: now.UnixNano(), Seq: seq}}}
		if datagrams {
			if err := conn.SendDatagram(m); err != nil && ctx.Err() == nil {
				a.log.Debug("heartbeat datagram", "err", err)
			}
		}
		if err := send(m); err != nil {
			return err
		}
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
		}
	}
}

// commands carries out the server's commands in order and acks each;
// every message from the server is heard.
func (a *Agent) commands(ctx context.Context, control *transport.Stream, send func(*api.AgentMessage) error, heard *hearing) error {
	for {
		var m api.ServerMessage
		if err := control.Recv(&m); err != nil {
			if ctx.Err() != nil {
				return nil
			}
			return err
		}
		heard.heard(time.Now())
		if l := m.GetLease(); l != nil {
			a.renew(l)
			continue
		}
		if p := m.GetPace(); p != nil {
			a.log.Info("telemetry pace", "factor", p.GetFactor())
			a.probes.SetPace(p.GetFactor())
			continue
		}
		if d := m.GetDeniedPeers(); d != nil {
			if err := a.book.deny(d.GetSerials()); err != nil {
				a.log.Error("keep the denied peers; they are refused until this nodemon restarts", "err", err)
			}
			continue
		}
		c := m.GetCommand()
		if c == nil {
			continue
		}
		ack := &api.CommandAck{Id: c.GetId()}
		heard.busy(true)
		err := a.execute(c, ack)
		heard.busy(false)
		if err != nil {
			ack.Error = err.Error()
			var je *JobError
			var nr *NodeRefusal
			ack.JobError = errors.As(err, &je)
			ack.NodeRefused = errors.As(err, &nr)
			a.log.Warn("command failed", "id", c.GetId(), "err", err)
		}
		if err := send(&api.AgentMessage{Body: &api.AgentMessage_CommandAck{CommandAck: ack}}); err != nil {
			return err
		}
	}
}

// datagrams hears the lease renewals the server sends by datagram, in
// answer to heartbeats that came by datagram.
func (a *Agent) datagrams(ctx context.Context, conn *transport.Conn, heard *hearing) error {
	for {
		var m api.ServerMessage
		if err := conn.ReceiveDatagram(ctx, &m); err != nil {
			if bad := (*transport.BadDatagramError)(nil); errors.As(err, &bad) {
				a.log.Warn("server datagram", "err", err)
				continue
			}
			return nil // the session is ending: the control stream says why
		}
		heard.heard(time.Now())
		if l := m.GetLease(); l != nil {
			a.renew(l)
		}
	}
}

// renew turns a lease renewal into the ranks' new deadline.
func (a *Agent) renew(l *api.LeaseRenewal) {
	if d, ok := a.beats.deadline(l.GetHeartbeatSeq(), time.Duration(l.GetLeaseMs())*time.Millisecond); ok {
		a.exec.RenewLeases(d)
	}
}

// execute carries out c; what it answers besides success goes into ack.
func (a *Agent) execute(c *api.Command, ack *api.CommandAck) error {
	switch b := c.Body.(type) {
	case *api.Command_ReadLogs:
		data, next, err := a.exec.ReadLogs(b.ReadLogs)
		ack.Data, ack.NextOffset = data, next
		return err
	case *api.Command_Launch:
		return a.exec.Launch(b.Launch)
	case *api.Command_Signal:
		if b.Signal.GetFence() {
			if b.Signal.GetAttempt() > 0 && len(b.Signal.GetRanks()) == 0 {
				// This node vouches for the attempt nowhere from now on.
				if _, err := a.book.supersede(b.Signal.GetJob(), b.Signal.GetAttempt()); err != nil {
					return err
				}
			}
			killed, err := a.exec.Fence(b.Signal)
			ack.Killed = killed
			return err
		}
		return a.exec.Signal(b.Signal)
	case *api.Command_InjectFault:
		return a.probes.Inject(b.InjectFault)
	case *api.Command_Supersede:
		ago, err := a.book.supersede(b.Supersede.GetJob(), b.Supersede.GetAttempt())
		ack.VouchedAgoMs = ago.Milliseconds()
		return err
	}
	return fmt.Errorf("unknown command %T: upgrade nodemon to the server's release", c.Body)
}

func (a *Agent) sendTelemetry(ctx context.Context, conn *transport.Conn) error {
	st, err := conn.OpenStream(ctx, transport.StreamTelemetry)
	if err != nil {
		return err
	}
	defer st.CloseWrite()
	for {
		batches := a.telemetry.take()
		for i, t := range batches {
			st.SetWriteDeadline(time.Now().Add(5 * time.Second))
			if err := st.Send(&api.AgentMessage{Body: &api.AgentMessage_Telemetry{Telemetry: t}}); err != nil {
				a.telemetry.putBack(batches[i:])
				return err
			}
		}
		select {
		case <-ctx.Done():
			return nil
		case <-a.telemetry.ready:
		}
	}
}

// sendEvents sends every queued event and reads the server's acks; what
// is not acked when the connection ends is sent again on the next one.
func (a *Agent) sendEvents(ctx context.Context, conn *transport.Conn) error {
	st, err := conn.OpenStream(ctx, transport.StreamEvents)
	if err != nil {
		return err
	}
	defer st.CloseWrite()
	acks := make(chan error, 1)
	go func() {
		for {
			var m api.ServerMessage
			if err := st.Recv(&m); err != nil {
				acks <- err
				return
			}
			if ack := m.GetEventAck(); ack != nil {
				a.events.ack(ack.GetSeq())
			}
		}
	}()
	var sent uint64
	for {
		for _, e := range a.events.since(sent) {
			st.SetWriteDeadline(time.Now().Add(5 * time.Second))
			if err := st.Send(&api.AgentMessage{Body: &api.AgentMessage_Event{Event: e}}); err != nil {
				return err
			}
			sent = e.GetSeq()
		}
		select {
		case <-ctx.Done():
			return nil
		case err := <-acks:
			if ctx.Err() != nil {
				return nil
			}
			return fmt.Errorf("event acks: %w", err)
		case <-a.events.ready:
		}
	}
}
