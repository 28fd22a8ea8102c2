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
	// Server is the UDP address of gpuctl serve.
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
	Log       *slog.Logger
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
}

// New builds an agent around already-opened probes.
func New(cfg Config, p *Probes) (*Agent, error) {
	if cfg.Server == "" {
		return nil, errors.New("nodemon: --server is required")
	}
	if cfg.DataDir == "" {
		return nil, errors.New("nodemon: --data-dir is required")
	}
	if cfg.Name == "" {
		h, err := os.Hostname()
		if err != nil {
			return nil, fmt.Errorf("nodemon: no --name and no host name: %w", err)
		}
		cfg.Name = h
	}
	if err := transport.ValidateName(cfg.Name); err != nil {
		return nil, fmt.Errorf("nodemon: --name: %w", err)
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
		cfg:       cfg,
		log:       cfg.Log.With("node", cfg.Name),
		probes:    p,
		telemetry: newTelemetryBuffer(cfg.TelemetryBuffer),
		events:    newEventQueue(100_000),
		beats:     newLeaseClock(),
	}
	a.metrics = newMetrics(cfg.Name, a.events.len, p.inventory)
	a.events.observe = a.metrics.event
	x, err := NewExecutor(ExecutorOptions{
		Node: cfg.Name, DataDir: cfg.DataDir, OnEvent: a.events.add, Log: a.log,
		LogMaxBytes: cfg.LogMaxBytes, LogKeep: cfg.LogKeep, CgroupRoot: cfg.CgroupRoot,
		AllowRootRanks: cfg.AllowRootRanks, Env: p.rankEnv(), SlurmNode: cfg.SlurmNode,
	})
	if err != nil {
		return nil, fmt.Errorf("nodemon: %w", err)
	}
	a.exec = x
	a.exec.BeforeLaunch = p.prepareLaunch
	a.exec.OnAdopt = p.attachPid
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
	var wg sync.WaitGroup
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
		return fmt.Errorf("nodemon: %w", err)
	}
	defer d.Close()
	// The pauses start over whenever the server answers a hello: a server
	// that crashed during a session was reachable, and the one restarted
	// after it waits only transport.NodeReconnectWithin for this node.
	backoff := transport.Backoff{Base: transport.NodeReconnectBase, Max: transport.NodeReconnectMax, Jitter: 0.2}
	for ctx.Err() == nil {
		err := a.session(ctx, d, id, reg, backoff.Reset)
		if ctx.Err() != nil {
			break
		}
		var refused *transport.RefusedError
		if errors.As(err, &refused) {
			return fmt.Errorf("nodemon: server refused this node: %w", err)
		}
		delay := backoff.Next()
		a.log.Warn("disconnected from server; retrying", "err", err, "in", delay.Round(time.Millisecond), "attempt", backoff.Attempt())
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
		return nil, fmt.Errorf("nodemon: load identity from %s: %w", dir, err)
	}
	if a.cfg.Token == "" {
		return nil, fmt.Errorf("nodemon: no identity in %s yet: pass --token (make one with `gpuctl token create`)", dir)
	}
	// A server busy with other joins (a rack joining at once, or a flood)
	// says so; that is worth waiting for, unlike a refusal.
	backoff := transport.Backoff{Base: joinRetryBase, Max: 30 * time.Second}
	for {
		jctx, cancel := context.WithTimeout(ctx, 30*time.Second)
		id, err = transport.Join(jctx, a.cfg.Server, a.cfg.Token, a.cfg.Name, dir)
		cancel()
		if err == nil {
			a.log.Info("joined cluster", "server", a.cfg.Server)
			return id, nil
		}
		if !transport.IsBusy(err) || ctx.Err() != nil {
			return nil, fmt.Errorf("nodemon: join %s: %w", a.cfg.Server, err)
		}
		delay := backoff.Next()
		a.log.Warn("server busy; retrying the join", "err", err, "in", delay.Round(time.Millisecond), "attempt", backoff.Attempt())
		select {
		case <-ctx.Done():
			return nil, fmt.Errorf("nodemon: join %s: %w", a.cfg.Server, ctx.Err())
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
		return nil, fmt.Errorf("nodemon: GPU inventory: %w", err)
	}
	host, _ := os.Hostname()
	return &api.NodeRegistration{
		Name: a.cfg.Name, Hostname: host, Gpus: gpus, Nics: listNICs(), Labels: a.cfg.Labels,
		SimProfile: a.probes.simProfile(), HeartbeatIntervalMs: uint32(a.cfg.Heartbeat / time.Millisecond),
		AgentVersion: Version, DriverVersion: driver, CudaVersion: cuda,
	}, nil
}

// sessionRegistration is base with the ranks running now, launched and
// adopted, so a (re)connect tells the server what runs here.
func (a *Agent) sessionRegistration(base *api.NodeRegistration) *api.NodeRegistration {
	reg := proto.Clone(base).(*api.NodeRegistration)
	reg.Running = a.exec.RankStatuses()
	return reg
}

// session runs one connection to the server until it fails; welcomed is
// called once the server has answered the hello.
func (a *Agent) session(ctx context.Context, d *transport.Dialer, id *transport.Identity, base *api.NodeRegistration, welcomed func()) error {
	dctx, cancel := context.WithTimeout(ctx, transport.NodeDialTimeout)
	conn, err := d.DialNode(dctx, a.cfg.Server, id)
	cancel()
	if err != nil {
		return err
	}
	defer conn.Close()
	sctx, stop := context.WithCancelCause(ctx)
	defer stop(nil)
	control, err := a.handshake(sctx, conn, a.sessionRegistration(base))
	if err != nil {
		return err
	}
	welcomed()
	a.log.Info("connected", "server", a.cfg.Server)
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
	run("heartbeat", func() error { return a.heartbeats(sctx, sendControl) })
	run("commands", func() error { return a.commands(sctx, control, sendControl) })
	run("telemetry", func() error { return a.sendTelemetry(sctx, conn) })
	run("events", func() error { return a.sendEvents(sctx, conn) })
	<-sctx.Done()
	conn.Close()
	wg.Wait()
	return context.Cause(sctx)
}

func (a *Agent) handshake(ctx context.Context, conn *transport.Conn, reg *api.NodeRegistration) (*transport.Stream, error) {
	control, err := conn.OpenStream(ctx, transport.StreamControl)
	if err != nil {
		return nil, err
	}
	control.SetDeadline(time.Now().Add(transport.NodeDialTimeout))
	// The server hears of this node no earlier than now: a lease it grants
	// in this session cannot end before now plus the lease.
	hello := time.Now()
	if err := control.Send(&api.AgentMessage{Body: &api.AgentMessage_Hello{Hello: &api.Hello{
		Version: api.CurrentVersion(), Role: "node", Software: "nodemon " + Version}}}); err != nil {
		return nil, fmt.Errorf("send hello: %w", err)
	}
	var m api.ServerMessage
	if err := control.Recv(&m); err != nil {
		return nil, fmt.Errorf("read welcome: %w", err)
	}
	w := m.GetWelcome()
	if w == nil {
		return nil, errors.New("server answered hello without a welcome")
	}
	if w.GetError() != "" {
		return nil, &transport.RefusedError{Reason: w.GetError()}
	}
	a.events.welcome(w.GetLastEventSeq())
	a.beats.reset()
	a.exec.BeginLease(time.Duration(w.GetLeaseMs())*time.Millisecond, hello)
	if err := control.Send(&api.AgentMessage{Body: &api.AgentMessage_Register{Register: reg}}); err != nil {
		return nil, fmt.Errorf("send registration: %w", err)
	}
	control.SetDeadline(time.Time{})
	return control, nil
}

func (a *Agent) heartbeats(ctx context.Context, send func(*api.AgentMessage) error) error {
	t := time.NewTicker(a.cfg.Heartbeat)
	defer t.Stop()
	var seq uint64
	for {
		seq++
		now := time.Now()
		a.beats.sentAt(seq, now)
		if err := send(&api.AgentMessage{Body: &api.AgentMessage_Heartbeat{Heartbeat: &api.Heartbeat{
			TimeUnixNano: now.UnixNano(), Seq: seq}}}); err != nil {
			return err
		}
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
		}
	}
}

// commands carries out the server's commands in order and acks each.
func (a *Agent) commands(ctx context.Context, control *transport.Stream, send func(*api.AgentMessage) error) error {
	for {
		var m api.ServerMessage
		if err := control.Recv(&m); err != nil {
			if ctx.Err() != nil {
				return nil
			}
			return err
		}
		if l := m.GetLease(); l != nil {
			if d, ok := a.beats.deadline(l.GetHeartbeatSeq(), time.Duration(l.GetLeaseMs())*time.Millisecond); ok {
				a.exec.RenewLeases(d)
			}
			continue
		}
		c := m.GetCommand()
		if c == nil {
			continue
		}
		ack := &api.CommandAck{Id: c.GetId()}
		if err := a.execute(c, ack); err != nil {
			ack.Error = err.Error()
			var je *JobError
			ack.JobError = errors.As(err, &je)
			a.log.Warn("command failed", "id", c.GetId(), "err", err)
		}
		if err := send(&api.AgentMessage{Body: &api.AgentMessage_CommandAck{CommandAck: ack}}); err != nil {
			return err
		}
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
			killed, err := a.exec.Fence(b.Signal)
			ack.Killed = killed
			return err
		}
		return a.exec.Signal(b.Signal)
	case *api.Command_InjectFault:
		return a.probes.Inject(b.InjectFault)
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
