// Package controlplane is gpuctl serve: it accepts nodemons and clients
// over QUIC, keeps the live state of the cluster, persists what must
// survive a restart, detects failed nodes, and answers the scripted views.
package controlplane

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"time"

	"github.com/gpuctl/gpuctl/api"
	"github.com/gpuctl/gpuctl/scheduler"
	"github.com/gpuctl/gpuctl/store"
	"github.com/gpuctl/gpuctl/transport"
)

// Config configures a Server. Zero fields take the defaults noted.
type Config struct {
	// DataDir holds the cluster CA, the store and admin.yaml.
	DataDir string
	// Listen is the UDP address, default ":7443".
	Listen string
	// ExtraNames are additional DNS names or IPs for the server certificate.
	ExtraNames []string
	// AdvertiseAddr is written into admin.yaml; default the bound address.
	AdvertiseAddr string
	// HistoryLen is the number of samples kept per GPU, default 600 (10 min at 1 s).
	HistoryLen int
	// ObserveHistory is the number of traced calls and flows kept for
	// `gpuctl observe --last`, default 100000.
	ObserveHistory int
	// DetectEvery is the failure detector's period, default 100 ms.
	DetectEvery time.Duration
	// StallEvery is the NCCL stall detector's period, default 250 ms.
	StallEvery time.Duration
	// Policy is the scheduling policy (scheduler.PolicyNames), default
	// DefaultPolicy.
	Policy string
	// ValidateCommand is the short all-reduce a recovering job's new nodes
	// run first, one rank per node (e.g. ringtrain --steps 3 --compute-ms 0
	// --bytes 1M); empty skips it.
	ValidateCommand []string
	// BackupEvery and BackupKeep pace the store's online backups into
	// <data-dir>/backups (defaults store.DefaultBackupEvery and
	// store.DefaultBackupKeep); one more is taken at a clean shutdown.
	BackupEvery time.Duration
	BackupKeep  int
	// Now is the clock, default time.Now.
	Now func() time.Time
	Log *slog.Logger
}

// Server is a running control plane.
type Server struct {
	cfg   Config
	log   *slog.Logger
	name  string
	auth  *transport.Authority
	store store.Store
	st    *state
	jobs  *jobManager
	ln    *transport.Listener
	cmdID atomic.Uint64
	// stallPass serialises stall detector passes with stall listings.
	stallPass sync.Mutex
	wg        sync.WaitGroup
	// stalls is the NCCL stall detector's state (stalls.go).
	stalls *stallDetector
	// onStall, when set, is called once for every stall when it is first
	// declared, on a goroutine of its own, with a copy of the stall.
	onStall func(*api.Stall)
}

// AdminConfigPath is the client configuration gpuctl serve writes for the
// cluster's first administrator.
func AdminConfigPath(dataDir string) string { return filepath.Join(dataDir, "admin.yaml") }

// StatePath is the store file in a data dir.
func StatePath(dataDir string) string { return filepath.Join(dataDir, "state.db") }

// New opens (creating on first start) the data dir's CA and store.
func New(cfg Config) (*Server, error) {
	if cfg.DataDir == "" {
		return nil, errors.New("serve: --data-dir is required")
	}
	if cfg.Listen == "" {
		cfg.Listen = ":7443"
	}
	if cfg.HistoryLen <= 0 {
		cfg.HistoryLen = 600
	}
	if cfg.ObserveHistory <= 0 {
		cfg.ObserveHistory = 100_000
	}
	if cfg.DetectEvery <= 0 {
		cfg.DetectEvery = 100 * time.Millisecond
	}
	if cfg.StallEvery <= 0 {
		cfg.StallEvery = 250 * time.Millisecond
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	if cfg.Log == nil {
		cfg.Log = slog.New(slog.DiscardHandler)
	}
	if cfg.Policy == "" {
		cfg.Policy = DefaultPolicy
	}
	policy, err := scheduler.PolicyByName(cfg.Policy)
	if err != nil {
		return nil, fmt.Errorf("serve: --policy: %w", err)
	}
	if err := os.MkdirAll(cfg.DataDir, 0o700); err != nil {
		return nil, fmt.Errorf("serve: create data dir: %w", err)
	}
	auth, err := transport.OpenAuthority(filepath.Join(cfg.DataDir, "pki"), transport.AuthorityOptions{ServerNames: cfg.ExtraNames, Logger: cfg.Log})
	if err != nil {
		return nil, fmt.Errorf("serve: %w", err)
	}
	st, err := store.OpenBolt(StatePath(cfg.DataDir))
	if err != nil {
		return nil, fmt.Errorf("serve: %w", err)
	}
	state, err := newState(cfg.Log, st, cfg.HistoryLen, cfg.ObserveHistory)
	if err != nil {
		st.Close()
		return nil, fmt.Errorf("serve: %w", err)
	}
	host, _ := os.Hostname()
	srv := &Server{cfg: cfg, log: cfg.Log, name: host, auth: auth, store: st, st: state, stalls: newStallDetector()}
	srv.wireIdentity()
	srv.jobs, err = newJobManager(jobConfig{Policy: policy, CheckpointRoot: filepath.Join(cfg.DataDir, "checkpoints"),
		ValidateCommand: cfg.ValidateCommand},
		cfg.Log.With("part", "jobs"), st, srv, state.listNodes, cfg.Now)
	if err != nil {
		st.Close()
		return nil, fmt.Errorf("serve: %w", err)
	}
	srv.jobs.ranks = state.jobRanks
	srv.onStall = srv.jobs.stalled
	if c, ok := any(srv).(cordoner); ok {
		srv.jobs.cordon = c.Cordon
	}
	state.onEvent = srv.jobs.onEvent
	return srv, nil
}

// Listen binds the UDP port and writes admin.yaml if it is missing. Call
// it before Serve; Addr is valid after it.
func (s *Server) Listen(ctx context.Context) error {
	ln, err := transport.Listen(ctx, s.cfg.Listen, s.auth, s.listenConfig())
	if err != nil {
		return fmt.Errorf("serve: %w", err)
	}
	s.ln = ln
	return s.writeAdminConfig()
}

// admit refuses a join under the name of a node that is connected now: two
// hosts must not share an identity. A known node that is down may rejoin
// (a reinstalled host keeps its name and its cordon).
func (s *Server) admit(_ context.Context, info transport.JoinInfo) error {
	if _, err := s.st.session(info.Node); err == nil {
		return fmt.Errorf("node name %q is in use by a connected node: pick another --name, or stop that nodemon first", info.Node)
	}
	return nil
}

func (s *Server) writeAdminConfig() error {
	path := AdminConfigPath(s.cfg.DataDir)
	if _, err := os.Stat(path); err == nil {
		return nil
	}
	addr := s.cfg.AdvertiseAddr
	if addr == "" {
		addr = s.Addr().String()
		if host, port, err := net.SplitHostPort(addr); err == nil && (host == "::" || host == "0.0.0.0" || host == "") {
			addr = net.JoinHostPort("127.0.0.1", port)
		}
	}
	id, err := s.auth.IssueClient("admin", transport.RoleAdmin)
	if err != nil {
		return fmt.Errorf("serve: issue admin certificate: %w", err)
	}
	s.recordUser(id, "gpuctl serve (first start)")
	if err := transport.WriteClientConfig(path, addr, id); err != nil {
		return fmt.Errorf("serve: write %s: %w", path, err)
	}
	s.log.Info("wrote admin client config", "path", path)
	return nil
}

// Addr is the bound UDP address.
func (s *Server) Addr() net.Addr { return s.ln.Addr() }

// Authority is the cluster's certificate authority.
func (s *Server) Authority() *transport.Authority { return s.auth }

// Serve accepts connections until ctx ends, then closes the store.
func (s *Server) Serve(ctx context.Context) error {
	if s.ln == nil {
		if err := s.Listen(ctx); err != nil {
			return err
		}
	}
	s.wg.Add(1)
	go func() {
		defer s.wg.Done()
		s.detect(ctx)
	}()
	s.wg.Add(1)
	go func() {
		defer s.wg.Done()
		s.jobs.run(ctx)
	}()
	s.wg.Add(1)
	go func() {
		defer s.wg.Done()
		s.watchStalls(ctx)
	}()
	if b, ok := s.store.(*store.Bolt); ok {
		s.wg.Add(1)
		go func() {
			defer s.wg.Done()
			b.RunBackups(ctx, s.cfg.BackupEvery, s.cfg.BackupKeep, s.log.With("part", "backup"))
		}()
	}
	for {
		conn, err := s.ln.Accept(ctx)
		if err != nil {
			s.ln.Close()
			s.wg.Wait()
			if cerr := s.store.Close(); cerr != nil {
				s.log.Error("close store", "err", cerr)
			}
			if ctx.Err() != nil {
				return nil
			}
			return fmt.Errorf("serve: %w", err)
		}
		s.wg.Add(1)
		go func() {
			defer s.wg.Done()
			switch {
			case conn.Role() == transport.RoleNode:
				s.serveNode(ctx, conn)
			default:
				s.serveClient(ctx, conn)
			}
		}()
	}
}

// detect runs the failure detector: a node whose heartbeats stop is down
// within twice its heartbeat interval plus one detector period.
func (s *Server) detect(ctx context.Context) {
	t := time.NewTicker(s.cfg.DetectEvery)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			s.st.checkHeartbeats(s.now())
		}
	}
}

func (s *Server) now() time.Time { return s.cfg.Now() }

// Command sends a command to a connected node and waits for its ack.
func (s *Server) Command(ctx context.Context, node string, c *api.Command) error {
	sess, err := s.st.session(node)
	if err != nil {
		return err
	}
	c.Id = s.cmdID.Add(1)
	return sess.command(ctx, c)
}

// CommandAck sends a command to a connected node and returns its ack,
// which carries what a reading command (ReadLogs) read.
func (s *Server) CommandAck(ctx context.Context, node string, c *api.Command) (*api.CommandAck, error) {
	sess, err := s.st.session(node)
	if err != nil {
		return nil, err
	}
	c.Id = s.cmdID.Add(1)
	return sess.commandAck(ctx, c)
}

// Nodes returns the live state of every known node.
func (s *Server) Nodes() []*api.NodeStatus { return s.st.listNodes() }

// Collectives returns the per-rank NCCL aggregates of job ("" = all).
func (s *Server) Collectives(job string) []*api.CollectiveStat { return s.st.listCollectives(job, "") }

// Jobs returns every job, oldest first.
func (s *Server) Jobs() []*api.Job { return s.jobs.list("") }
