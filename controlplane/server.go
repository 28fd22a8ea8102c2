// Package controlplane is gpuctl serve: it accepts nodemons and clients
// over QUIC and wires the parts that do the work (see docs/ARCHITECTURE.md):
// the node registry (controlplane/nodes), the job owner (controlplane/jobs),
// the stall detector (controlplane/stalls), the watch hub
// (controlplane/watch) and the observe broker (controlplane/observe). It
// also answers client requests through one fail-closed authorization table
// and records every change a client asks for as an audit event.
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
	"github.com/gpuctl/gpuctl/controlplane/jobs"
	"github.com/gpuctl/gpuctl/controlplane/kube"
	"github.com/gpuctl/gpuctl/controlplane/nodes"
	"github.com/gpuctl/gpuctl/controlplane/observe"
	"github.com/gpuctl/gpuctl/controlplane/slurm"
	"github.com/gpuctl/gpuctl/controlplane/stalls"
	"github.com/gpuctl/gpuctl/controlplane/watch"
	"github.com/gpuctl/gpuctl/jobspec"
	"github.com/gpuctl/gpuctl/scheduler"
	"github.com/gpuctl/gpuctl/scheduler/carbon"
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
	// History sizes each GPU's sample history (nodes.HistoryConfig).
	History nodes.HistoryConfig
	// ObserveHistory is the number of traced calls and flows kept for
	// `gpuctl observe --last`, default 100000.
	ObserveHistory int
	// DetectEvery is the failure detector's period, default 100 ms.
	DetectEvery time.Duration
	// Lease is how long a node's ranks run on without word from the
	// server (renewed with every heartbeat answered): a node cut off for
	// longer stops them, and a lost node's job is relaunched only once they
	// are confirmed gone or the lease has passed. Default DefaultLease;
	// negative: no lease (ranks never fence themselves).
	Lease time.Duration
	// Suspect is what a recovery's loss of a node does to it (zero
	// fields: nodes.DefaultSuspectPolicy).
	Suspect nodes.SuspectPolicy
	// StallEvery is the NCCL stall detector's period, default 250 ms.
	StallEvery time.Duration
	// WatchEvery is the least time between two batches to one watcher,
	// so fast-changing nodes coalesce; default 100 ms.
	WatchEvery time.Duration
	// Policy is the scheduling policy (scheduler.PolicyNames), default
	// scheduler.DefaultPolicy.
	Policy string
	// PolicyWeights are the "learned" policy's (scheduler.Scored).
	PolicyWeights *scheduler.ScoreWeights
	// CarbonIntensity is a carbon-intensity file (curves by node label,
	// docs/scheduling.md); empty: none.
	CarbonIntensity string
	// CarbonAware holds deferrable jobs for cleaner hours or sites
	// (scheduler.WithCarbon); it needs CarbonIntensity.
	CarbonAware bool
	// Hetero, when set (scheduler.Objectives), allocates GPU models to
	// jobs allowing several by their throughput on each
	// (scheduler.WithHetero).
	Hetero string
	// ValidateCommand is the short all-reduce a recovering job's new nodes
	// run first, one rank per node (e.g. ringtrain --steps 3 --compute-ms 0
	// --bytes 1M); empty skips it.
	ValidateCommand []string
	// Executor runs the jobs' ranks: "nodemon" (default), "slurm"
	// (through Slurm's sbatch, scancel and squeue, configured by Slurm) or
	// "kubernetes" (pods gpuctl binds, configured by Kube).
	Executor string
	Slurm    slurm.Config
	Kube     kube.Options
	// Jobs tunes the job owner beyond the fields above (tests).
	Jobs jobs.Config
	// RunAs decides the accounts submitters may have ranks run as.
	RunAs jobspec.RunAsPolicy
	// Commit is the build's VCS revision, reported by gpuctl version.
	Commit string
	// BackupEvery and BackupKeep pace the store's online backups into
	// <data-dir>/backups (defaults store.DefaultBackupEvery and
	// store.DefaultBackupKeep); one more is taken at a clean shutdown.
	BackupEvery time.Duration
	BackupKeep  int
	// Store, when set, is the store to use instead of <data-dir>/state.db
	// (it must also be a store.IdentityStore): the shared etcd store of a
	// highly available control plane, already fenced by this server's
	// leadership. No backups are taken of it (etcd has its own).
	Store store.Store
	// Authority, when set, is the cluster authority to use instead of
	// <data-dir>/pki (one whose CA the servers share).
	Authority *transport.Authority
	// Status, when set, answers gpuctl status (which server leads, the
	// store's health); without it the server reports itself alone.
	Status func(ctx context.Context) *api.StatusResponse
	// ReadOnly, when set, says when the control plane may change nothing
	// (a highly available server whose store is away): changes are
	// refused at once with its reason, reads come from memory.
	ReadOnly *ReadOnly
	// Now is the clock, default time.Now.
	Now func() time.Time
	Log *slog.Logger
}

// DefaultLease is the nodes' lease when Config.Lease is zero.
const DefaultLease = 20 * time.Second

// Server is a running control plane.
type Server struct {
	cfg Config
	log *slog.Logger
	// sshKeys lists the SSH console's keys, when it runs (SetSSHKeys).
	sshKeys atomic.Pointer[SSHKeyLister]
	name    string
	auth    *transport.Authority
	store   store.Store
	hub     *watch.Hub
	obs     *observe.Broker
	nodes   *nodes.Registry
	jobs    *jobs.Manager
	stall   *stalls.Detector
	slow    *stalls.FailSlow
	// slurm reads Slurm's view in (--executor slurm); nil otherwise.
	slurm *slurm.Poller
	// kube runs the attempts on Kubernetes and reads its view in
	// (--executor kubernetes); nil otherwise.
	kube *kube.Executor
	ln   *transport.Listener
	// listening is ln for the node detector, which runs before Listen.
	listening atomic.Pointer[transport.Listener]
	wg        sync.WaitGroup

	// clients are the client connections open now, so that a revoked
	// identity can be cut off.
	clientsMu sync.Mutex
	clients   map[*transport.Conn]struct{}

	// reads answers from the last read while the store is away.
	reads lastRead
}

// AdminConfigPath is the client configuration gpuctl serve writes for the
// cluster's first administrator.
func AdminConfigPath(dataDir string) string { return filepath.Join(dataDir, "admin.yaml") }

// PKIDir is where a data dir keeps the cluster CA and this server's
// certificate.
func PKIDir(dataDir string) string { return filepath.Join(dataDir, "pki") }

// AuthorityOptions are the authority's options for cfg.
func AuthorityOptions(cfg Config) transport.AuthorityOptions {
	return transport.AuthorityOptions{ServerNames: cfg.ExtraNames, Logger: cfg.Log}
}

// StatePath is the store file in a data dir.
func StatePath(dataDir string) string { return filepath.Join(dataDir, "state.db") }

// New opens (creating on first start) the data dir's CA and store and
// loads the cluster's nodes and jobs.
func New(cfg Config) (*Server, error) {
	if cfg.DataDir == "" {
		return nil, errors.New("serve: --data-dir is required")
	}
	if cfg.Listen == "" {
		cfg.Listen = ":7443"
	}
	if cfg.ObserveHistory <= 0 {
		cfg.ObserveHistory = 100_000
	}
	switch {
	case cfg.Lease == 0:
		cfg.Lease = DefaultLease
	case cfg.Lease < 0:
		cfg.Lease = 0
	case cfg.Lease < time.Second:
		return nil, fmt.Errorf("serve: --lease %s is too short: a node must be able to miss a heartbeat without fencing its ranks (use 1s or more)", cfg.Lease)
	}
	if cfg.DetectEvery <= 0 {
		cfg.DetectEvery = 100 * time.Millisecond
	}
	if cfg.StallEvery <= 0 {
		cfg.StallEvery = 250 * time.Millisecond
	}
	if cfg.WatchEvery <= 0 {
		cfg.WatchEvery = 100 * time.Millisecond
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	if cfg.Log == nil {
		cfg.Log = slog.New(slog.DiscardHandler)
	}
	if cfg.Policy == "" {
		cfg.Policy = scheduler.DefaultPolicy
	}
	policy, err := scheduler.PolicyWithWeights(cfg.Policy, cfg.PolicyWeights)
	if err != nil {
		return nil, fmt.Errorf("serve: --policy: %w", err)
	}
	if policy, cfg.Jobs.Intensity, err = carbonPolicy(cfg, policy); err != nil {
		return nil, fmt.Errorf("serve: %w", err)
	}
	if policy, err = heteroPolicy(cfg, policy); err != nil {
		return nil, fmt.Errorf("serve: %w", err)
	}
	if err := os.MkdirAll(cfg.DataDir, 0o700); err != nil {
		return nil, fmt.Errorf("serve: create data dir: %w", err)
	}
	auth := cfg.Authority
	if auth == nil {
		if auth, err = transport.OpenAuthority(PKIDir(cfg.DataDir), AuthorityOptions(cfg)); err != nil {
			return nil, fmt.Errorf("serve: %w", err)
		}
	}
	st := cfg.Store
	if st == nil {
		if st, err = store.OpenBolt(StatePath(cfg.DataDir)); err != nil {
			return nil, fmt.Errorf("serve: %w", err)
		}
	}
	s, err := newServer(cfg, auth, st, policy)
	if err != nil {
		st.Close()
		return nil, fmt.Errorf("serve: %w", err)
	}
	return s, nil
}

// carbonPolicy loads the carbon-intensity file (for jobs' emissions) and,
// with CarbonAware, wraps the policy with carbon-aware deferral.
func carbonPolicy(cfg Config, p scheduler.Policy) (scheduler.Policy, *carbon.Intensities, error) {
	if cfg.CarbonIntensity == "" {
		if cfg.CarbonAware {
			return nil, nil, errors.New("--carbon-aware needs --carbon-intensity FILE: the curves it schedules by")
		}
		return p, nil, nil
	}
	f, err := os.Open(cfg.CarbonIntensity)
	if err != nil {
		return nil, nil, fmt.Errorf("--carbon-intensity: %w", err)
	}
	defer f.Close()
	in, err := carbon.Parse(f, cfg.CarbonIntensity)
	if err != nil {
		return nil, nil, fmt.Errorf("--carbon-intensity: %w", err)
	}
	if cfg.CarbonAware {
		p = scheduler.WithCarbon(p, in)
	}
	return p, in, nil
}

// heteroPolicy wraps the policy with type allocation when Hetero names an
// objective.
func heteroPolicy(cfg Config, p scheduler.Policy) (scheduler.Policy, error) {
	if cfg.Hetero == "" {
		return p, nil
	}
	o, err := scheduler.ParseObjective(cfg.Hetero)
	if err != nil {
		return nil, fmt.Errorf("--hetero: %w", err)
	}
	return scheduler.WithHetero(p, o), nil
}

// newServer wires the parts over an open store.
func newServer(cfg Config, auth *transport.Authority, st store.Store, policy scheduler.Policy) (*Server, error) {
	host, _ := os.Hostname()
	s := &Server{cfg: cfg, log: cfg.Log, name: host, auth: auth, store: st, hub: watch.New(watch.Options{}),
		obs: observe.NewBroker(cfg.ObserveHistory), clients: map[*transport.Conn]struct{}{}}
	s.wireIdentity()
	if recent, err := st.Events(store.EventFilter{Limit: 1000}); err == nil {
		s.hub.LoadEvents(recent)
	} else {
		return nil, fmt.Errorf("load events: %w", err)
	}
	// The job owner is the node registry's sink and the registry is the
	// job owner's view of nodes; the sink only queues, so the registry is
	// built first with the owner's front door, which the owner then drains.
	front := jobs.NewFront()
	// The fail-slow pass reads placements and GPUs once the owner and the
	// registry exist; the registry hands it calls from the start.
	s.slow = stalls.NewFailSlow(func(id string) *api.Job {
		if v := front.View(); v != nil {
			j, _ := v.Find(id)
			return j
		}
		return nil
	}, func(name string) (*api.NodeStatus, error) { return s.nodes.Node(name) }, cfg.Log.With("part", "failslow"))
	reg, err := nodes.New(nodes.Config{Store: st, Publish: s.hub, Observe: s.obs, Sink: front, ServerName: host, ReceiveLag: s.receiveLag,
		History: cfg.History, Now: cfg.Now, Log: cfg.Log.With("part", "nodes"), Lease: cfg.Lease, Superseded: front.Superseded,
		Suspect: cfg.Suspect, Calls: s.slow.Calls})
	if err != nil {
		return nil, err
	}
	s.nodes = reg
	jc := cfg.Jobs
	jc.Front = front
	jc.Store, jc.Nodes, jc.Publish, jc.Policy, jc.Now, jc.RunAs = st, reg, s.hub, policy, cfg.Now, cfg.RunAs
	jc.Lease = cfg.Lease
	jc.ReadOnly = cfg.ReadOnly.Err
	jc.Log = cfg.Log.With("part", "jobs")
	if jc.CheckpointRoot == "" {
		jc.CheckpointRoot = filepath.Join(cfg.DataDir, "checkpoints")
	}
	if jc.ValidateCommand == nil {
		jc.ValidateCommand = cfg.ValidateCommand
	}
	sx, err := slurmExecutor(cfg, auth)
	if err != nil {
		return nil, err
	}
	if sx != nil {
		jc.Executor = sx
	}
	if s.kube, err = kubeExecutor(cfg, auth, reg, front); err != nil {
		return nil, err
	}
	if s.kube != nil {
		jc.Executor = s.kube
	}
	mgr, err := jobs.New(jc)
	if err != nil {
		return nil, err
	}
	s.jobs = mgr
	s.slurm = slurmPoller(cfg, sx, reg, mgr)
	for _, n := range reg.Nodes() {
		s.hub.PublishNode(n)
	}
	for _, j := range mgr.View().Jobs {
		s.hub.PublishJob(j)
	}
	s.stall = stalls.New(mgr, reg, s.hub, cfg.Now, cfg.Log.With("part", "stalls")).WithFailSlow(s.slow)
	return s, nil
}

// Listen binds the UDP port and writes admin.yaml if it is missing. Call
// it before Serve; Addr is valid after it.
func (s *Server) Listen(ctx context.Context) error {
	ln, err := transport.Listen(ctx, s.cfg.Listen, s.auth, s.listenConfig())
	if err != nil {
		return fmt.Errorf("serve: %w", err)
	}
	s.ln = ln
	s.listening.Store(ln)
	return s.writeAdminConfig()
}

// receiveLag is how far behind the listener's receive path is (0 before
// it listens).
func (s *Server) receiveLag() time.Duration {
	if ln := s.listening.Load(); ln != nil {
		return ln.ReceiveLag()
	}
	return 0
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

// Hub is the server's watch hub.
func (s *Server) Hub() *watch.Hub { return s.hub }

// run starts the loops that make the server work without listening: the
// job owner, the failure and stall detectors.
func (s *Server) run(ctx context.Context) {
	stop := s.cfg.ReadOnly.Notify(s.announceReadOnly)
	context.AfterFunc(ctx, stop)
	s.refreshDeniedPeers()
	s.wg.Add(3)
	go func() {
		defer s.wg.Done()
		s.nodes.Detect(ctx, s.cfg.DetectEvery)
	}()
	go func() {
		defer s.wg.Done()
		s.jobs.Run(ctx)
	}()
	go func() {
		defer s.wg.Done()
		s.stall.Run(ctx, s.cfg.StallEvery)
	}()
	if s.slurm != nil {
		s.wg.Add(1)
		go func() {
			defer s.wg.Done()
			s.slurm.Run(ctx)
		}()
	}
	if s.kube != nil {
		s.wg.Add(1)
		go func() {
			defer s.wg.Done()
			if err := s.kube.Run(ctx); err != nil {
				s.log.Error("Kubernetes executor stopped", "err", err)
			}
		}()
	}
	if b, ok := s.store.(*store.Bolt); ok {
		// Inside the wait group, so the backup at shutdown is written
		// before the store closes.
		s.wg.Add(1)
		go func() {
			defer s.wg.Done()
			b.RunBackups(ctx, s.cfg.BackupEvery, s.cfg.BackupKeep, s.log.With("part", "backup"))
		}()
	}
}

func (s *Server) now() time.Time { return s.cfg.Now() }

// Serve accepts connections until ctx ends, then closes the store.
func (s *Server) Serve(ctx context.Context) error {
	if s.ln == nil {
		if err := s.Listen(ctx); err != nil {
			return err
		}
	}
	s.run(ctx)
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
			if conn.Role() == transport.RoleNode {
				s.nodes.Serve(ctx, conn)
				return
			}
			s.serveClient(ctx, conn)
		}()
	}
}

// Nodes returns the live state of every known node (shared, read-only).
func (s *Server) Nodes() []*api.NodeStatus { return s.nodes.Nodes() }

// Collectives returns the per-rank NCCL aggregates of job ("" = all).
func (s *Server) Collectives(job string) []*api.CollectiveStat { return s.nodes.Collectives(job, "") }

// Jobs returns every job, oldest first (shared, read-only).
func (s *Server) Jobs() []*api.Job { return s.jobs.View().Jobs }

// Stalls returns the NCCL stalls declared now, of one job (id or name) or
// of every job when job is "".
func (s *Server) Stalls(job string) ([]*api.Stall, error) {
	if job == "" {
		return s.stall.List(""), nil
	}
	j, err := s.jobs.Lookup(job)
	if err != nil {
		return nil, err
	}
	return s.stall.List(j.GetId()), nil
}

// Cordon stops new placements on node, saying why; what runs there keeps
// running.
func (s *Server) Cordon(node, reason string) error {
	_, err := s.nodes.SetCordon(node, nodes.ActionCordon, reason)
	return err
}

// SetCordon cordons or uncordons node (nodes.ActionCordon or
// ActionUncordon), as an executor that follows another system's node
// states does.
func (s *Server) SetCordon(node, action, reason string) (*api.NodeStatus, error) {
	return s.nodes.SetCordon(node, action, reason)
}

// ExternalJobs lists jobs an executor found that gpuctl did not submit
// (their GPUs count busy), replacing the last list.
func (s *Server) ExternalJobs(jobs []*api.Job) { s.jobs.ExternalJobs(jobs) }

// Command sends a command to a connected node and waits for its ack.
func (s *Server) Command(ctx context.Context, node string, c *api.Command) error {
	_, err := s.nodes.Command(ctx, node, c)
	return err
}

// DisconnectClients closes the open client connections of name ("" =
// every client) with why, and returns how many it closed.
func (s *Server) DisconnectClients(name, why string) int {
	s.clientsMu.Lock()
	defer s.clientsMu.Unlock()
	n := 0
	for c := range s.clients {
		if name == "" || c.Name() == name {
			c.CloseWithError(transport.CodeNoError, why)
			n++
		}
	}
	return n
}

// ReadOnly is why the control plane refuses changes now, nil while it
// does not.
func (s *Server) ReadOnly() error { return s.cfg.ReadOnly.Err() }

// announceReadOnly tells watchers (the console's banner) that the control
// plane became read-only, or writable again; the latter is also stored,
// the store being back.
func (s *Server) announceReadOnly(err error) {
	e := &api.Event{TimeUnixNano: s.now().UnixNano(), Kind: api.EventKind_EVENT_KIND_READ_ONLY,
		Severity: api.Severity_SEVERITY_WARNING, Attrs: map[string]string{"read_only": "true"}}
	if err != nil {
		e.Message = err.Error()
		s.hub.PublishEvent(e)
		return
	}
	e.Severity, e.Attrs["read_only"] = api.Severity_SEVERITY_INFO, "false"
	e.Message = "the control plane is writable again: the store answers"
	s.hub.PublishEvent(e)
	go func() {
		if err := s.store.AppendEvent(e); err != nil {
			s.log.Warn("record the end of read-only", "err", err)
		}
	}()
}

// SetObserver has o hear the job owner's pass and recovery timings.
func (s *Server) SetObserver(o jobs.Observer) { s.jobs.SetObserver(o) }
