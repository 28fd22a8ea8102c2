// Package swarm is gpuctl's load generator: from one process it opens N
// real node sessions (QUIC with mutual TLS, node identities obtained by
// joining with one token, nodemon's protocol) against a real `gpuctl
// serve`, streams simulated 8-GPU samples and NCCL records from each at
// 1 Hz, and measures what it costs the server and how soon a sample is
// visible to a client.
package swarm

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/gpuctl/gpuctl/api"
	"github.com/gpuctl/gpuctl/client"
	"github.com/gpuctl/gpuctl/transport"
)

// Options configures a swarm run.
type Options struct {
	// Nodes is how many node sessions to open.
	Nodes int
	// GPUs per node (default 8) and NCCL call records per batch (default
	// 8).
	GPUs, Collectives int
	// Interval is the heartbeat period, default 1 s; BatchInterval the
	// telemetry period, default Interval (shorter saturates the server
	// with telemetry while heartbeats keep their pace).
	Interval, BatchInterval time.Duration
	// Quiet is how long command round trips are measured with heartbeats
	// alone, before telemetry starts (default 5 s); Warmup how long
	// telemetry runs before the measurement (default 5 s); Duration the
	// measurement window (default 20 s).
	Quiet, Warmup, Duration time.Duration
	// Gpuctl is the gpuctl binary whose `serve` is started, with its
	// state in Dir. Or Config (an admin client config) and ServerPID
	// name a server already running, which is left running.
	Gpuctl    string
	Config    string
	ServerPID int
	// Dir holds the server's state and the nodes' identities; required.
	Dir string
	// Store is what a started server keeps its state in: StoreBolt
	// (default) or StoreEtcd (an etcd member run by the swarm).
	Store string
	// Failover, after the measurement, kills the server (SIGKILL) and
	// starts another on the same state and address, and every node
	// reconnects at once; it needs a server the swarm started.
	Failover bool
	// Seed makes the nodes' phases and figures repeatable.
	Seed uint64
	Log  *slog.Logger
}

func (o *Options) defaults() error {
	if o.Nodes <= 0 {
		return fmt.Errorf("swarm: --nodes %d: give how many nodes to simulate", o.Nodes)
	}
	if o.Dir == "" {
		return errors.New("swarm: a work dir is required")
	}
	if (o.Config == "") != (o.ServerPID == 0) {
		return errors.New("swarm: --config and --server-pid go together (a running server), or neither (one is started)")
	}
	if o.Config == "" && o.Gpuctl == "" {
		return errors.New("swarm: no gpuctl binary to start the server with")
	}
	if o.Store == "" {
		o.Store = StoreBolt
	}
	if o.Config != "" && (o.Store != StoreBolt || o.Failover) {
		return errors.New("swarm: --store and --failover start the server: drop --config and --server-pid")
	}
	if o.GPUs <= 0 {
		o.GPUs = 8
	}
	if o.Collectives <= 0 {
		o.Collectives = 8
	}
	if o.Interval <= 0 {
		o.Interval = time.Second
	}
	if o.BatchInterval <= 0 {
		o.BatchInterval = o.Interval
	}
	if o.Quiet <= 0 {
		o.Quiet = 5 * time.Second
	}
	if o.Warmup <= 0 {
		o.Warmup = 5 * time.Second
	}
	if o.Duration <= 0 {
		o.Duration = 20 * time.Second
	}
	if o.Log == nil {
		o.Log = slog.New(slog.DiscardHandler)
	}
	return nil
}

// Report is what a run measured; the server's figures cover the
// measurement window only.
type Report struct {
	Nodes          int     `json:"nodes"`
	GPUsPerNode    int     `json:"gpus_per_node"`
	Registered     int     `json:"registered"`
	JoinSeconds    float64 `json:"join_seconds"`
	ConnectSeconds float64 `json:"connect_seconds"`
	WindowSeconds  float64 `json:"window_seconds"`
	// ServerCPUCores is the server's utime+stime over the window per
	// second of it; ServerRSSBytes its resident memory at the end,
	// ServerRSSStartBytes at the start, and ServerRSSIdleBytes before any
	// node joined (0 for a server it did
	// not start); per 1,000 nodes is the difference scaled.
	ServerCPUCores        float64 `json:"server_cpu_cores"`
	ServerCPUCoresPer1000 float64 `json:"server_cpu_cores_per_1000_nodes"`
	ServerRSSBytes        uint64  `json:"server_rss_bytes"`
	ServerRSSStartBytes   uint64  `json:"server_rss_start_bytes"`
	ServerRSSIdleBytes    uint64  `json:"server_rss_idle_bytes"`
	ServerRSSBytesPer1000 uint64  `json:"server_rss_bytes_per_1000_nodes"`
	GeneratorCPUCores     float64 `json:"generator_cpu_cores"`
	SamplesSentPerSec     float64 `json:"samples_sent_per_second"`
	SamplesVisiblePerSec  float64 `json:"samples_visible_per_second"`
	// Visibility is from a sample leaving its node to the watch
	// delivering it; the round trips are a command to a node and back
	// (quiet: heartbeats alone) and a plain API request.
	Visibility    Latency `json:"visibility"`
	CommandQuiet  Latency `json:"command_rtt_quiet"`
	CommandLoaded Latency `json:"command_rtt_loaded"`
	APILoaded     Latency `json:"api_rtt_loaded"`
	NodesDown     int     `json:"nodes_down"`
	// SelfSilent is how many nodes the generator itself left without a
	// heartbeat for more than twice the interval once telemetry flowed
	// (its CPU starved), and SelfSilentMaxSeconds the longest such gap:
	// a node down for that is the machine's, not the server's.
	SelfSilent int `json:"self_silent_nodes"`
	// PacedBatches is the batches the nodes did not send in the window at
	// the server's telemetry pace, and Pace the factor at its end.
	PacedBatches         int64   `json:"paced_batches"`
	Pace                 uint32  `json:"pace"`
	SelfSilentMaxSeconds float64 `json:"self_silent_max_seconds"`
	NodeErrors           int     `json:"node_errors"`
	WatchResyncs         int     `json:"watch_resyncs"`
	// UDPReceiveDrops is the machine's UDP datagrams dropped for a full
	// receive buffer during the window (the server's socket and the
	// swarm's); null where /proc/net/snmp cannot be read.
	UDPReceiveDrops *uint64 `json:"udp_receive_drops"`
	// Shed is the telemetry the server shed to keep up, since it
	// started (null from a server too old to say).
	Shed *Shed `json:"telemetry_shed"`
	// Store is what the started server kept its state in.
	Store string `json:"store"`
	// Failover is the server's replacement, when asked for.
	Failover       *Failover `json:"failover"`
	FirstNodeError *string   `json:"first_node_error"`
	ServerStarted  bool      `json:"server_started"`
	ServerPID      int       `json:"server_pid"`
}

// Shed counts what a server's ingest dropped: whole batches, and GPU
// samples and NCCL call records.
type Shed struct {
	Batches     uint64 `json:"batches"`
	GPUSamples  uint64 `json:"gpu_samples"`
	Collectives uint64 `json:"collectives"`
}

// Failover is a server killed and replaced on the same state while its
// nodes ran: how long until every node was registered with the new one
// (they all redial at once, as after a failover), and how many of them
// went down in the 5 s after.
type Failover struct {
	RestartSeconds   float64 `json:"restart_seconds"`
	ReconnectSeconds float64 `json:"reconnect_seconds"`
	Registered       int     `json:"registered"`
	NodesDownAfter   int     `json:"nodes_down_after"`
}

// Document is the -o json document of runs: {"runs": [...]}.
func Document(runs ...*Report) any {
	return struct {
		Runs []*Report `json:"runs"`
	}{runs}
}

// Latency summarizes a set of latencies.
type Latency struct {
	Count      int     `json:"count"`
	P50Seconds float64 `json:"p50_seconds"`
	P99Seconds float64 `json:"p99_seconds"`
	MaxSeconds float64 `json:"max_seconds"`
}

// summarize takes nearest-rank percentiles (the value at or above the
// fraction of the sorted set).
func summarize(d []time.Duration) Latency {
	if len(d) == 0 {
		return Latency{}
	}
	s := slices.Clone(d)
	slices.Sort(s)
	at := func(q float64) float64 { return s[min(len(s)-1, int(q*float64(len(s))))].Seconds() }
	return Latency{Count: len(s), P50Seconds: at(0.50), P99Seconds: at(0.99), MaxSeconds: s[len(s)-1].Seconds()}
}

// Run brings up the swarm, measures, and takes it down again.
func Run(ctx context.Context, o Options) (*Report, error) {
	if err := o.defaults(); err != nil {
		return nil, err
	}
	rep := &Report{Nodes: o.Nodes, GPUsPerNode: o.GPUs}
	srv := &server{pid: o.ServerPID, config: o.Config}
	defer func() { rep.ServerPID = srv.pid }()
	var back *backend
	if o.Config == "" {
		var err error
		if back, err = newBackend(ctx, o.Store, o.Dir); err != nil {
			return nil, err
		}
		defer back.close()
		if srv, err = startServer(ctx, o.Gpuctl, back); err != nil {
			return nil, err
		}
		defer func() { srv.stop() }() // the one running at the end
		rep.ServerStarted, rep.Store = true, o.Store
		if u, err := readUsage(srv.pid); err == nil {
			rep.ServerRSSIdleBytes = u.rssBytes
		}
	}
	cl, err := client.Dial(ctx, srv.config)
	if err != nil {
		return nil, fmt.Errorf("swarm: %w", err)
	}
	defer cl.Close()
	addr, err := serverAddr(srv.config)
	if err != nil {
		return nil, err
	}

	// Identities the real way: one token for every node, each joins.
	start := time.Now()
	token, _, err := cl.CreateJoinToken(ctx, client.TokenOptions{TTL: time.Hour, Uses: o.Nodes, Description: "gpuctl bench swarm"})
	if err != nil {
		return nil, fmt.Errorf("swarm: %w", err)
	}
	d, err := transport.NewDialer(o.Log)
	if err != nil {
		return nil, fmt.Errorf("swarm: %w", err)
	}
	defer d.Close()
	rng := rand.New(rand.NewPCG(o.Seed, 0x5157a3))
	var sent, paced atomic.Int64
	var telemetry atomic.Bool
	nodes := make([]*node, o.Nodes)
	run := fmt.Sprintf("%04x", rng.IntN(1<<16))
	for i := range nodes {
		nodes[i] = &node{name: fmt.Sprintf("swarm-%s-%05d", run, i), gpus: o.GPUs, colls: o.Collectives,
			rng: rand.New(rand.NewPCG(o.Seed, uint64(i))), sent: &sent, telemetry: &telemetry, paced: &paced}
	}
	if err := joinAll(ctx, d, addr, token, filepath.Join(o.Dir, "nodes"), nodes); err != nil {
		return nil, err
	}
	rep.JoinSeconds = time.Since(start).Seconds()

	// Watch the nodes as the console does: every change, and when each
	// node's latest sample became visible.
	wctx, stopWatch := context.WithCancel(ctx)
	defer stopWatch()
	w := newWatcher(nodes)
	watchDone := make(chan error, 1)
	go func() {
		watchDone <- cl.Watch(wctx, &api.WatchRequest{Kinds: []api.WatchKind{api.WatchKind_WATCH_KIND_NODES}}, client.WatchOptions{Log: o.Log}, w.apply)
	}()

	start = time.Now()
	nctx, stopNodes := context.WithCancel(ctx)
	var nodeWG sync.WaitGroup
	var errMu sync.Mutex
	nodeErrs := 0
	firstErr := ""
	halt := func() {
		stopNodes()
		for _, n := range nodes {
			n.close()
		}
		nodeWG.Wait()
	}
	defer func() { halt() }()
	// Each node beats from the moment it registers, or the server's
	// detector would take the first ones down while the last connect.
	launch := func(n *node) {
		ctx := nctx
		nodeWG.Add(1)
		go func() {
			defer nodeWG.Done()
			if err := n.run(ctx, o.Interval, o.BatchInterval); err != nil && ctx.Err() == nil {
				errMu.Lock()
				nodeErrs++
				if firstErr == "" {
					firstErr = n.name + ": " + err.Error()
				}
				errMu.Unlock()
			}
		}()
	}
	err = connectAll(nctx, d, addr, o.Interval, nodes, 16, launch)
	if err != nil {
		return nil, err
	}
	if err := w.waitReady(ctx, o.Nodes, 60*time.Second); err != nil {
		errMu.Lock()
		defer errMu.Unlock()
		if firstErr != "" {
			// A busy machine starves the heartbeats of the first nodes
			// while the last connect; these nodes do not reconnect.
			return nil, fmt.Errorf("swarm: %w; %d node sessions ended, the first: %s", err, nodeErrs, firstErr)
		}
		return nil, fmt.Errorf("swarm: %w", err)
	}
	rep.ConnectSeconds = time.Since(start).Seconds()
	rep.Registered = w.ready()

	// Commands with heartbeats alone, then with telemetry flowing.
	rep.CommandQuiet, _ = probe(ctx, cl, nodes, o.Quiet)
	telemetry.Store(true)
	if err := sleep(ctx, o.Warmup); err != nil {
		return nil, err
	}

	before, err := readUsage(srv.pid)
	if err != nil {
		return nil, fmt.Errorf("swarm: server: %w", err)
	}
	self0, _ := readUsage(os.Getpid())
	sent0, paced0 := sent.Load(), paced.Load()
	drops0, dropsErr := udpReceiveDrops()
	w.measure(true)
	rep.CommandLoaded, rep.APILoaded = probe(ctx, cl, nodes, o.Duration)
	w.measure(false)
	after, err := readUsage(srv.pid)
	if err != nil {
		return nil, fmt.Errorf("swarm: server: %w", err)
	}
	self1, _ := readUsage(os.Getpid())
	sent1, paced1 := sent.Load(), paced.Load()
	rep.PacedBatches = paced1 - paced0
	if drops1, err := udpReceiveDrops(); err == nil && dropsErr == nil {
		d := drops1 - min(drops1, drops0)
		rep.UDPReceiveDrops = &d
	}

	window := after.at.Sub(before.at).Seconds()
	k := float64(o.Nodes) / 1000
	rep.WindowSeconds = window
	rep.ServerCPUCores = cores(before, after)
	rep.ServerCPUCoresPer1000 = rep.ServerCPUCores / k
	rep.ServerRSSBytes, rep.ServerRSSStartBytes = after.rssBytes, before.rssBytes
	// Per 1,000 nodes is what the nodes added: the server's RSS less
	// what it held before any joined, when known.
	rep.ServerRSSBytesPer1000 = uint64(float64(after.rssBytes-min(after.rssBytes, rep.ServerRSSIdleBytes)) / k)
	rep.GeneratorCPUCores = cores(self0, self1)
	rep.SamplesSentPerSec = float64(sent1-sent0) / window
	lat, visible, down, resyncs := w.results()
	rep.Visibility = summarize(lat)
	rep.SamplesVisiblePerSec = float64(visible*o.GPUs) / window
	rep.NodesDown, rep.WatchResyncs = down, resyncs
	for _, n := range nodes {
		g := time.Duration(n.beatGap.Load())
		if g > 2*o.Interval {
			rep.SelfSilent++
		}
		rep.SelfSilentMaxSeconds = max(rep.SelfSilentMaxSeconds, g.Seconds())
	}
	if st, err := cl.Status(ctx); err == nil && st.GetTelemetryShed() != nil {
		sh := st.GetTelemetryShed()
		rep.Shed = &Shed{Batches: sh.GetBatches(), GPUSamples: sh.GetGpuSamples(), Collectives: sh.GetCollectives()}
		rep.Pace = max(sh.GetPace(), 1)
	}

	if o.Failover {
		// Nodes stop as a killed server's do not: at once. Each redials
		// and registers as soon as the new server listens.
		halt()
		srv.kill()
		start := time.Now()
		if srv, err = startServer(ctx, o.Gpuctl, back); err != nil {
			return nil, err
		}
		f := &Failover{RestartSeconds: time.Since(start).Seconds()}
		rep.Failover = f
		if err := w.waitNone(ctx, 60*time.Second); err != nil {
			return nil, fmt.Errorf("swarm: after the failover: %w", err)
		}
		var stop context.CancelFunc
		nctx, stop = context.WithCancel(ctx)
		defer stop()
		stopNodes = stop
		start = time.Now()
		if err := connectAll(nctx, d, addr, o.Interval, nodes, len(nodes), launch); err != nil {
			return nil, err
		}
		err := w.waitReady(ctx, o.Nodes, 120*time.Second)
		f.ReconnectSeconds, f.Registered = time.Since(start).Seconds(), w.ready()
		if err != nil {
			return nil, fmt.Errorf("swarm: after the failover: %w", err)
		}
		_, _, down0, _ := w.results()
		w.measure(true)
		if err := sleep(ctx, 5*time.Second); err != nil {
			return nil, err
		}
		w.measure(false)
		_, _, down1, _ := w.results()
		f.NodesDownAfter = down1 - down0
	}
	errMu.Lock()
	rep.NodeErrors = nodeErrs
	if firstErr != "" {
		rep.FirstNodeError = &firstErr
	}
	errMu.Unlock()
	stopWatch()
	<-watchDone
	return rep, nil
}

// serverAddr reads the server address from a client config.
func serverAddr(config string) (string, error) {
	cfg, _, err := transport.LoadClientConfig(config)
	if err != nil {
		return "", fmt.Errorf("swarm: %w", err)
	}
	return cfg.Server, nil
}

// joinAll trades the token for every node's identity, as many at once as
// the server lets one address join (it answers busy beyond that).
func joinAll(ctx context.Context, d *transport.Dialer, addr, token, dir string, nodes []*node) error {
	const parallel = 4
	return forEach(ctx, nodes, parallel, func(n *node) error {
		backoff := transport.Backoff{Base: 50 * time.Millisecond, Max: time.Second}
		for {
			id, err := d.Join(ctx, addr, token, n.name, filepath.Join(dir, n.name))
			if err == nil {
				n.id = id
				return nil
			}
			if !transport.IsBusy(err) {
				return fmt.Errorf("swarm: %w", err)
			}
			if err := backoff.Wait(ctx); err != nil {
				return err
			}
		}
	})
}

// connectAll dials and registers every node, parallel at a time, and
// starts each once it is registered. A node that fails tries again, as
// nodemon does (a storm of handshakes can outlast one dial's timeout),
// five times at most.
func connectAll(ctx context.Context, d *transport.Dialer, addr string, interval time.Duration, nodes []*node, parallel int, start func(*node)) error {
	return forEach(ctx, nodes, parallel, func(n *node) error {
		backoff := transport.Backoff{Base: 200 * time.Millisecond, Max: 2 * time.Second}
		for tries := 0; ; {
			err := n.connect(ctx, d, addr, interval)
			if err == nil {
				break
			}
			if tries++; tries == 5 {
				return fmt.Errorf("swarm: node %s: %w", n.name, err)
			}
			if err := backoff.Wait(ctx); err != nil {
				return err
			}
		}
		start(n)
		return nil
	})
}

// forEach runs f over nodes, parallel at a time; the first error stops it.
func forEach(ctx context.Context, nodes []*node, parallel int, f func(*node) error) error {
	ctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	work := make(chan *node)
	var wg sync.WaitGroup
	for range parallel {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for n := range work {
				if err := f(n); err != nil {
					cancel(err)
				}
			}
		}()
	}
	for _, n := range nodes {
		select {
		case work <- n:
			continue
		case <-ctx.Done():
		}
		break
	}
	close(work)
	wg.Wait()
	if err := context.Cause(ctx); err != nil && !errors.Is(err, context.Canceled) {
		return err
	}
	return ctx.Err()
}

// probe measures, for d, a command's round trip to a node and back (an
// injected-fault CLEAR: client → server → the node's control stream → its
// ack → client) and a plain API request's, five of each a second.
func probe(ctx context.Context, cl *client.Client, nodes []*node, d time.Duration) (command, request Latency) {
	var cmds, reqs []time.Duration
	t := time.NewTicker(200 * time.Millisecond)
	defer t.Stop()
	end := time.Now().Add(d)
	for i := 0; time.Now().Before(end); i++ {
		n := nodes[(i*7919)%len(nodes)]
		start := time.Now()
		if err := cl.InjectFault(ctx, n.name, &api.InjectFault{Kind: api.FaultKind_FAULT_KIND_CLEAR}); err == nil {
			cmds = append(cmds, time.Since(start))
		}
		start = time.Now()
		if _, err := cl.Version(ctx); err == nil {
			reqs = append(reqs, time.Since(start))
		}
		select {
		case <-ctx.Done():
			return summarize(cmds), summarize(reqs)
		case <-t.C:
		}
	}
	return summarize(cmds), summarize(reqs)
}

func sleep(ctx context.Context, d time.Duration) error {
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-time.After(d):
		return nil
	}
}
