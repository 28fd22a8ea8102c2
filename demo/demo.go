// Package demo runs gpuctl's embedded default on one machine: a control
// plane and N nodemon processes with simulated DGX hosts on loopback, and
// the reference ring trainer spread over two of them, so that real QUIC,
// real processes, real TCP collectives and real eBPF traces flow.
package demo

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/gpuctl/gpuctl/api"
	"github.com/gpuctl/gpuctl/client"
	"github.com/gpuctl/gpuctl/controlplane"
	"github.com/gpuctl/gpuctl/controlplane/jobs"
	"github.com/gpuctl/gpuctl/controlplane/metrics"
	"github.com/gpuctl/gpuctl/jobspec"
	"github.com/gpuctl/gpuctl/scheduler"
)

// Options configures a demo cluster.
type Options struct {
	// Nodes is the number of nodemon processes, default 4.
	Nodes int
	// DataDir holds the server's and nodes' state; required.
	DataDir string
	// Nodemon is the nodemon binary; Ringtrain the reference trainer.
	Nodemon, Ringtrain string
	// Sim is the simulated host profile, default dgx-h100.
	Sim string
	// JobNodes is how many nodes the demo job spans (0 = none, default 2 when
	// unset through DefaultOptions); RanksPerNode ranks run on each.
	JobNodes, RanksPerNode int
	// ComputeMS and Bytes shape each ringtrain step.
	ComputeMS int
	Bytes     string
	// CkptInterval is the job's checkpoint interval in steps.
	CkptInterval int
	// JobEnv is added to the demo job's environment (its job file's env),
	// over REFNCCL_ASYNC=1 (the reference library completing collectives
	// after it returns, as NCCL on a GPU does; "0" to complete them in the
	// call).
	JobEnv map[string]string
	// NCCLProfiler is passed to nodemon's --nccl-profiler; empty leaves
	// nodemon's default (the plugin beside it, if there).
	NCCLProfiler string
	// Heartbeat is the nodes' heartbeat interval.
	Heartbeat time.Duration
	// EBPF is passed to nodemon's --ebpf.
	EBPF string
	// NoRootRanks names nodes whose nodemon starts without
	// --allow-root-ranks (every other node allows root ranks).
	NoRootRanks []string
	// Lease is the server's lease (gpuctl serve --lease); zero takes the
	// server's default. DefaultOptions makes it 5 s: on one machine a
	// short lease costs nothing, and a lost node's job then waits 6 s, not
	// 21, before it runs elsewhere.
	Lease time.Duration
	// MetricsBasePort, when set, gives the server's Prometheus endpoint
	// 127.0.0.1:MetricsBasePort and node i's 127.0.0.1:MetricsBasePort+1+i.
	MetricsBasePort int
	// SlowRule bounds automatic action on fail-slow findings (zero:
	// scheduler.DefaultSlowRule).
	SlowRule scheduler.SlowRule
	Log      *slog.Logger
}

// DefaultOptions returns the options of `gpuctl demo`.
func DefaultOptions() Options {
	return Options{Nodes: 4, Sim: "dgx-h100", JobNodes: 2, RanksPerNode: 2, ComputeMS: 100, Bytes: "4M",
		CkptInterval: 50, Heartbeat: time.Second, EBPF: "auto", Lease: DemoLease}
}

// DemoLease is the lease of DefaultOptions.
const DemoLease = 5 * time.Second

// JobName is the name of the demo's training job.
const JobName = "demo-ringtrain"

// Cluster is a running demo.
type Cluster struct {
	opts   Options
	Server *controlplane.Server
	// Config is the admin client config gpuctl commands use.
	Config string
	// NodeNames are the nodes in start order.
	NodeNames []string
	// JobID is the demo job's id once submitted.
	JobID string
	// MetricsAddr is the server's Prometheus endpoint (host:port, path
	// /metrics), and NodeMetricsAddrs the nodes' by name; empty without
	// Options.MetricsBasePort.
	MetricsAddr      string
	NodeMetricsAddrs map[string]string

	cancel  context.CancelFunc
	served  chan error
	srvStop sync.Once
	mu      sync.Mutex
	nodemon map[string]*exec.Cmd

	spawnOnce sync.Once
	spawns    chan spawnReq
	spawnDone chan struct{}
	spawnStop sync.Once
}

// Options returns the options the cluster runs with, defaults filled in.
func (c *Cluster) Options() Options { return c.opts }

// NodeName is the name of the i-th demo node.
func NodeName(i int) string { return fmt.Sprintf("node-%02d", i) }

// Start brings the cluster up and returns once every node has registered
// and reported GPU samples and the demo job is launched.
func Start(ctx context.Context, opts Options) (*Cluster, error) {
	if opts.Nodes <= 0 {
		return nil, errors.New("demo: --nodes must be at least 1")
	}
	if opts.JobNodes > opts.Nodes {
		return nil, fmt.Errorf("demo: the job spans %d nodes but only %d are started", opts.JobNodes, opts.Nodes)
	}
	if opts.Log == nil {
		opts.Log = slog.New(slog.DiscardHandler)
	}
	for _, bin := range []string{opts.Nodemon, opts.Ringtrain} {
		if _, err := os.Stat(bin); err != nil {
			return nil, fmt.Errorf("demo: %w (run `make build` first)", err)
		}
	}
	srvLog, err := os.OpenFile(filepath.Join(opts.DataDir, "serve.log"), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return nil, fmt.Errorf("demo: %w", err)
	}
	srv, err := controlplane.New(controlplane.Config{
		DataDir: filepath.Join(opts.DataDir, "server"), Listen: "127.0.0.1:0",
		Log:             slog.New(slog.NewTextHandler(srvLog, nil)),
		ValidateCommand: []string{opts.Ringtrain, "--steps", "3", "--compute-ms", "0", "--bytes", "1M"},
		// One machine, one person: operators' jobs run as whoever runs
		// the demo (its nodemons allow that to be root).
		RunAs: jobspec.RunAsPolicy{NodemonUser: true},
		Lease: opts.Lease,
		Jobs:  jobs.Config{SlowRule: opts.SlowRule},
	})
	if err != nil {
		return nil, fmt.Errorf("demo: %w", err)
	}
	sctx, cancel := context.WithCancel(context.Background())
	if err := srv.Listen(sctx); err != nil {
		cancel()
		return nil, fmt.Errorf("demo: %w", err)
	}
	c := &Cluster{opts: opts, Server: srv, Config: controlplane.AdminConfigPath(filepath.Join(opts.DataDir, "server")),
		cancel: cancel, served: make(chan error, 1), nodemon: map[string]*exec.Cmd{}}
	go func() { c.served <- srv.Serve(sctx) }()
	ok := false
	defer func() {
		if !ok {
			c.Stop()
		}
	}()
	c.NodeMetricsAddrs = map[string]string{}
	if opts.MetricsBasePort > 0 {
		mx := metrics.New(srv, metrics.Options{})
		srv.SetObserver(mx)
		addr, err := mx.Serve(sctx, "127.0.0.1:"+strconv.Itoa(opts.MetricsBasePort), opts.Log)
		if err != nil {
			return nil, fmt.Errorf("demo: server %w (choose another --metrics-base-port)", err)
		}
		c.MetricsAddr = addr.String()
	}
	// One token for the demo's nodes; each takes one of its joins.
	token, err := srv.CreateJoinToken(time.Hour, opts.Nodes, "gpuctl demo")
	if err != nil {
		return nil, fmt.Errorf("demo: %w", err)
	}
	for i := 0; i < opts.Nodes; i++ {
		name := NodeName(i)
		c.NodeNames = append(c.NodeNames, name)
		if err := c.StartNode(name, token); err != nil {
			return nil, err
		}
	}
	if err := c.waitReady(ctx, 60*time.Second); err != nil {
		return nil, err
	}
	if opts.JobNodes > 0 {
		if err := c.launchJob(ctx); err != nil {
			return nil, err
		}
	}
	ok = true
	return c, nil
}

// StartNode starts (or restarts) the nodemon process of node name.
func (c *Cluster) StartNode(name, token string) error {
	dir := filepath.Join(c.opts.DataDir, "nodes", name)
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return fmt.Errorf("demo: %w", err)
	}
	idx, _ := strconv.Atoi(name[len("node-"):])
	args := []string{"--server", c.Server.Addr().String(), "--name", name, "--data-dir", dir, "--sim", c.opts.Sim,
		"--heartbeat", c.opts.Heartbeat.String(), "--ebpf", c.opts.EBPF, "--trace-scope", "node",
		"--label", "rack=rack-" + strconv.Itoa(idx/2), "--label", "switch=leaf-" + strconv.Itoa(idx/4),
		"--log-file", filepath.Join(dir, "nodemon.log")}
	if c.opts.NCCLProfiler != "" {
		args = append(args, "--nccl-profiler", c.opts.NCCLProfiler)
	}
	if !slices.Contains(c.opts.NoRootRanks, name) {
		// The demo's ranks run as whoever runs it, root included.
		args = append(args, "--allow-root-ranks")
	}
	if c.opts.MetricsBasePort > 0 {
		addr := "127.0.0.1:" + strconv.Itoa(c.opts.MetricsBasePort+1+idx)
		args = append(args, "--metrics-addr", addr)
		c.mu.Lock()
		c.NodeMetricsAddrs[name] = addr
		c.mu.Unlock()
	}
	cmd := exec.Command(c.opts.Nodemon, args...)
	if token != "" {
		// On stdin, not in argv, where ps would show it to every user.
		cmd.Args = append(cmd.Args, "--token", "-")
		cmd.Stdin = strings.NewReader(token + "\n")
	}
	// Its own group, so the terminal's ^C reaches the demo alone and the
	// demo stops the nodes in order; Pdeathsig, so a demo killed outright
	// leaves no node behind (each stops its ranks on SIGTERM).
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGTERM}
	if err := c.spawn(cmd); err != nil {
		return fmt.Errorf("demo: start nodemon %s: %w", name, err)
	}
	go cmd.Wait()
	c.mu.Lock()
	c.nodemon[name] = cmd
	c.mu.Unlock()
	c.opts.Log.Info("nodemon started", "node", name, "pid", cmd.Process.Pid)
	return nil
}

// spawn starts cmd from the cluster's spawner thread. The kernel sends
// Pdeathsig when the thread that started a process exits, not the
// process: a Go thread can exit while the demo runs, so every nodemon is
// started from one thread locked for the cluster's life.
func (c *Cluster) spawn(cmd *exec.Cmd) error {
	c.spawnOnce.Do(func() {
		c.spawns = make(chan spawnReq)
		c.spawnDone = make(chan struct{})
		go func() {
			runtime.LockOSThread() // never unlocked: the thread ends with the goroutine
			for {
				select {
				case r := <-c.spawns:
					r.err <- r.cmd.Start()
				case <-c.spawnDone:
					return
				}
			}
		}()
	})
	errc := make(chan error, 1)
	select {
	case c.spawns <- spawnReq{cmd: cmd, err: errc}:
	case <-c.spawnDone:
		return errors.New("the demo is stopping")
	}
	return <-errc
}

type spawnReq struct {
	cmd *exec.Cmd
	err chan error
}

// NodemonPID returns the pid of a node's nodemon process.
func (c *Cluster) NodemonPID(name string) int {
	c.mu.Lock()
	defer c.mu.Unlock()
	if cmd := c.nodemon[name]; cmd != nil {
		return cmd.Process.Pid
	}
	return 0
}

// waitReady polls until every node is ready with GPU samples.
func (c *Cluster) waitReady(ctx context.Context, limit time.Duration) error {
	deadline := time.Now().Add(limit)
	for {
		ready := 0
		for _, n := range c.Server.Nodes() {
			if n.GetState() == api.NodeState_NODE_STATE_READY && len(n.GetGpus()) > 0 && n.GetGpus()[0].GetLast() != nil {
				ready++
			}
		}
		if ready == c.opts.Nodes {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("demo: only %d of %d nodes reported within %s; see the nodemon.log files under %s",
				ready, c.opts.Nodes, limit, filepath.Join(c.opts.DataDir, "nodes"))
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(50 * time.Millisecond):
		}
	}
}

// launchJob submits ringtrain across JobNodes nodes to the job manager,
// like an operator's `gpuctl submit`, and waits until it runs.
func (c *Cluster) launchJob(ctx context.Context) error {
	cl, err := client.Dial(ctx, c.Config)
	if err != nil {
		return fmt.Errorf("demo: %w", err)
	}
	defer cl.Close()
	spec := fmt.Sprintf(`name: %s
nodes: %d
gpus_per_node: %d
command: [%q, --steps, "0", --compute-ms, "%d", --bytes, %q, --ckpt-interval, "%d"]
checkpoint:
  dir: %q
restart_policy: replace-node
`, JobName, c.opts.JobNodes, c.opts.RanksPerNode, c.opts.Ringtrain, c.opts.ComputeMS, c.opts.Bytes, c.opts.CkptInterval,
		filepath.Join(c.opts.DataDir, "checkpoints", JobName))
	// The reference library returns from a collective once it is
	// enqueued and completes it later, as NCCL does on a GPU, so the demo
	// exercises the timing a GPU gives (enqueue from the call, completion
	// from the profiler plugin).
	env := map[string]string{"REFNCCL_ASYNC": "1"}
	maps.Copy(env, c.opts.JobEnv)
	spec += "env:\n"
	for _, k := range slices.Sorted(maps.Keys(env)) {
		spec += fmt.Sprintf("  %s: %q\n", k, env[k])
	}
	resp, err := cl.SubmitJob(ctx, &api.SubmitJobRequest{SpecYaml: spec, Source: "demo job"})
	if err != nil {
		return fmt.Errorf("demo: submit %s: %w", JobName, err)
	}
	c.JobID = resp.GetJob().GetId()
	deadline := time.Now().Add(30 * time.Second)
	for {
		jobs, err := cl.Jobs(ctx, c.JobID)
		if err != nil {
			return fmt.Errorf("demo: %w", err)
		}
		if len(jobs) == 1 && jobs[0].GetState() == api.JobState_JOB_STATE_RUNNING {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("demo: job %s not running after 30s: %v", c.JobID, jobs)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(50 * time.Millisecond):
		}
	}
}

// Stop stops every nodemon (which stops its ranks), then the server.
func (c *Cluster) Stop() {
	c.mu.Lock()
	cmds := make([]*exec.Cmd, 0, len(c.nodemon))
	for _, cmd := range c.nodemon {
		cmds = append(cmds, cmd)
	}
	c.mu.Unlock()
	for _, cmd := range cmds {
		cmd.Process.Signal(syscall.SIGTERM)
	}
	deadline := time.Now().Add(15 * time.Second)
	for _, cmd := range cmds {
		for syscall.Kill(cmd.Process.Pid, 0) == nil && time.Now().Before(deadline) {
			time.Sleep(20 * time.Millisecond)
		}
		syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
	}
	c.spawnStop.Do(func() {
		c.spawnOnce.Do(func() { c.spawnDone = make(chan struct{}) })
		close(c.spawnDone)
	})
	c.StopServer()
}

// StopServer stops the control plane alone, as if its host went away: the
// nodemons run on, trying to reconnect.
func (c *Cluster) StopServer() {
	c.srvStop.Do(func() {
		c.cancel()
		select {
		case <-c.served:
		case <-time.After(10 * time.Second):
		}
	})
}
