package demo

import (
	"context"
	"crypto/x509"
	"encoding/pem"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/gpuctl/gpuctl/agent"
	"github.com/gpuctl/gpuctl/api"
	"github.com/gpuctl/gpuctl/client"
	"github.com/gpuctl/gpuctl/controlplane/jobs"
	"github.com/gpuctl/gpuctl/internal/testbin"
	"github.com/gpuctl/gpuctl/procfs"
	"github.com/gpuctl/gpuctl/transport"
)

// procCluster is a real `gpuctl serve` process and real nodemon processes
// on loopback, for tests that kill or pause the server and the nodes.
type procCluster struct {
	t                         *testing.T
	dir, addr                 string
	gpuctl, nodemon, ringtain string
	serveArgs                 []string
	server                    *proc
	serverStarts              int
	// serverStarted is when the running server process was started.
	serverStarted time.Time
	token         string
	nodes         map[string]*proc
	nodeStarts    map[string]int
	// ebpf is the nodemons' --ebpf, default off.
	ebpf string
}

// newProcCluster starts a server process (with serveArgs added) and n
// nodemons (simulated H100s, eBPF off) and waits until every node is ready.
func newProcCluster(t *testing.T, n int, serveArgs ...string) *procCluster {
	t.Helper()
	if testing.Short() {
		t.Skip("starts real server, nodemon and ringtrain processes")
	}
	nodemon, ringtrain := binaries(t)
	c := &procCluster{t: t, dir: t.TempDir(), gpuctl: testbin.Gpuctl(t), nodemon: nodemon, ringtain: ringtrain,
		nodes: map[string]*proc{}, nodeStarts: map[string]int{}}
	udp, err := net.ListenPacket("udp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	c.addr = udp.LocalAddr().String()
	udp.Close()
	c.serveArgs = append([]string{"serve", "--data-dir", filepath.Join(c.dir, "server"), "--listen", c.addr}, serveArgs...)
	c.startServer()
	cl := c.dial(20 * time.Second)
	defer cl.Close()
	token, _, err := cl.CreateJoinToken(context.Background(), client.TokenOptions{TTL: time.Hour, Uses: n})
	if err != nil {
		t.Fatal(err)
	}
	c.token = token
	for i := 0; i < n; i++ {
		c.startNode(NodeName(i))
	}
	c.waitNodes(cl, 30*time.Second, n)
	return c
}

// config is the admin client config the server wrote.
func (c *procCluster) config() string { return filepath.Join(c.dir, "server", "admin.yaml") }

// startServer starts a server process on the cluster's data dir and
// address.
func (c *procCluster) startServer() {
	c.t.Helper()
	c.serverStarts++
	c.serverStarted = time.Now()
	c.server = startProcess(c.t, filepath.Join(c.dir, fmt.Sprintf("serve-%d.log", c.serverStarts)), c.gpuctl, c.serveArgs...)
}

// killServer kills the server process with SIGKILL and waits until it is
// gone.
func (c *procCluster) killServer() {
	c.t.Helper()
	if err := c.server.Process.Signal(syscall.SIGKILL); err != nil {
		c.t.Fatal(err)
	}
	<-c.server.done
}

// dial connects a client, waiting up to limit for the server to answer.
func (c *procCluster) dial(limit time.Duration) *client.Client {
	c.t.Helper()
	var cl *client.Client
	poll(c.t, limit, "server answers", func() error {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		nc, err := client.Dial(ctx, c.config())
		if err != nil {
			return err
		}
		if _, err := nc.Nodes(ctx); err != nil {
			nc.Close()
			return err
		}
		cl = nc
		return nil
	})
	return cl
}

// startNode starts (or starts again) nodemon name on its own data dir.
func (c *procCluster) startNode(name string) {
	c.t.Helper()
	ebpf := c.ebpf
	if ebpf == "" {
		ebpf = "off"
	}
	c.nodeStarts[name]++
	c.nodes[name] = startProcess(c.t, filepath.Join(c.dir, fmt.Sprintf("%s-%d.log", name, c.nodeStarts[name])), c.nodemon,
		"--server", c.addr, "--token", c.token, "--name", name, "--data-dir", filepath.Join(c.dir, "nodes", name),
		"--sim", "dgx-h100", "--ebpf", ebpf, "--trace-scope", "node", "--allow-root-ranks")
}

// waitNodes waits until n nodes are ready and connected.
func (c *procCluster) waitNodes(cl *client.Client, limit time.Duration, n int) {
	c.t.Helper()
	poll(c.t, limit, fmt.Sprintf("%d nodes ready", n), func() error {
		nodes, err := cl.Nodes(context.Background())
		if err != nil {
			return err
		}
		ready := 0
		for _, nd := range nodes {
			if nd.GetState() == api.NodeState_NODE_STATE_READY && nd.GetConnected() {
				ready++
			}
		}
		if ready != n {
			return fmt.Errorf("%d ready", ready)
		}
		return nil
	})
}

// ringSpec is ringtrain on n nodes, one GPU each, training until stopped.
func (c *procCluster) ringSpec(name string, n int) string {
	return fmt.Sprintf("name: %s\nnodes: %d\ngpus_per_node: 1\ncommand: [%q, --steps, \"0\", --compute-ms, \"30\", --bytes, 64K]\n",
		name, n, c.ringtain)
}

// logs returns the tail of every server and node log, for a failure
// message.
func (c *procCluster) logs() string {
	paths, _ := filepath.Glob(filepath.Join(c.dir, "*.log"))
	var b strings.Builder
	for _, p := range paths {
		data, _ := os.ReadFile(p)
		lines := strings.Split(strings.TrimSpace(string(data)), "\n")
		fmt.Fprintf(&b, "== %s\n%s\n", filepath.Base(p), strings.Join(lines[max(0, len(lines)-15):], "\n"))
	}
	return b.String()
}

// clusterRanks lists the live rank processes of this cluster from /proc:
// every process whose environment (api.RankEnv) names a job, an attempt
// and this cluster's id. A zombie is not alive.
func (c *procCluster) clusterRanks() []liveRank {
	c.t.Helper()
	cluster := c.clusterID()
	entries, _ := os.ReadDir("/proc")
	var out []liveRank
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		env, err := readEnviron(uint32(pid))
		if err != nil || env["GPUCTL_CLUSTER"] != cluster || env["GPUCTL_JOB"] == "" || env["GPUCTL_ATTEMPT"] == "" {
			continue
		}
		if !running(pid) {
			continue
		}
		// The rank shim carries the rank's environment too.
		if argv, _ := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", pid)); strings.Contains(string(argv), "\x00"+agent.ShimCommand+"\x00") {
			continue
		}
		attempt, _ := strconv.Atoi(env["GPUCTL_ATTEMPT"])
		rank, _ := strconv.Atoi(env["RANK"])
		out = append(out, liveRank{pid: uint32(pid), job: env["GPUCTL_JOB"], node: env["GPUCTL_NODE"],
			attempt: uint32(attempt), rank: int32(rank)})
	}
	return out
}

// clusterID is the id nodemon gives this cluster's ranks (GPUCTL_CLUSTER).
func (c *procCluster) clusterID() string {
	c.t.Helper()
	pemData, err := os.ReadFile(filepath.Join(c.dir, "server", "pki", transport.CACertFile))
	if err != nil {
		c.t.Fatal(err)
	}
	block, _ := pem.Decode(pemData)
	if block == nil {
		c.t.Fatal("no PEM block in the CA certificate")
	}
	ca, err := x509.ParseCertificate(block.Bytes)
	if err != nil {
		c.t.Fatal(err)
	}
	return transport.ClusterID(ca)
}

// running says whether pid is a process that has not exited: a zombie
// is dead, only not yet reaped.
func running(pid int) bool {
	st, err := procfs.ReadStat("/proc", pid)
	return err == nil && !st.Exited()
}

// liveRank is a rank process found in /proc.
type liveRank struct {
	pid     uint32
	job     string
	node    string
	attempt uint32
	rank    int32
}

// checkSamePIDs fails unless job id is running attempt 1 with the pids of
// want, every one alive and started once.
func (c *procCluster) checkSamePIDs(cl *client.Client, want *api.Job) error {
	js, err := cl.Jobs(context.Background(), want.GetId())
	if err != nil {
		return err
	}
	if len(js) != 1 {
		return fmt.Errorf("%d jobs match %s", len(js), want.GetId())
	}
	j := js[0]
	if err := runningWith(j, want.GetAttempt(), len(rankPIDs(want))); err != nil {
		return err
	}
	if !equalPIDs(rankPIDs(j), rankPIDs(want)) {
		return fmt.Errorf("pids changed: %v → %v", rankPIDs(want), rankPIDs(j))
	}
	for rank, at := range rankPIDs(want) {
		if !alive(at.pid) {
			return fmt.Errorf("rank %d (pid %d) is gone", rank, at.pid)
		}
	}
	return nil
}

// TestServerCrashLoopKeepsJobs crash-loops a real `gpuctl serve`: killed
// with SIGKILL and started again as soon as the nodes are back, eight
// times within 30 s, while ringtrain runs on two real nodemons. No session
// lasts long, so a backoff that only resets after a long session grows
// with every crash. After each restart, and past the bound in which nodes
// must reconnect after the last one, the job is still attempt 1 with the
// same rank pids, every rank alive and started once.
func TestServerCrashLoopKeepsJobs(t *testing.T) {
	c := newProcCluster(t, 2)
	cl := c.dial(10 * time.Second)
	ctx := context.Background()
	r, err := cl.SubmitJob(ctx, &api.SubmitJobRequest{SpecYaml: c.ringSpec("crashloop", 2), Source: "crash loop test"})
	if err != nil {
		t.Fatal(err)
	}
	running := waitFor(t, cl, r.GetJob().GetId(), 20*time.Second, "running", func(j *api.Job) error { return runningWith(j, 1, 2) })
	cl.Close()

	const crashes = 8
	bound := 2*time.Second + jobs.DefaultReconnectGrace // 1 s heartbeats
	first := time.Now()
	var backs []string
	for i := 0; i < crashes; i++ {
		c.killServer()
		time.Sleep(200 * time.Millisecond)
		c.startServer()
		if i == crashes-1 {
			break
		}
		cl := c.dial(10 * time.Second)
		var back time.Duration
		for back == 0 {
			if err := c.checkSamePIDs(cl, running); err != nil {
				t.Fatalf("restart %d, %.1fs after it: %v\n%s", i+1, time.Since(c.serverStarted).Seconds(), err, c.logs())
			}
			if nodes, err := cl.Nodes(ctx); err == nil && connected(nodes) == 2 {
				back = time.Since(c.serverStarted)
			} else if time.Since(c.serverStarted) > bound+3*time.Second {
				t.Fatalf("restart %d: nodes not back after %s\n%s", i+1, bound+3*time.Second, c.logs())
			}
			time.Sleep(100 * time.Millisecond)
		}
		cl.Close()
		backs = append(backs, fmt.Sprintf("%.1fs", back.Seconds()))
	}
	last := c.serverStarted
	if took := last.Sub(first); took > 30*time.Second {
		t.Fatalf("%d restarts took %s, want them within 30 s (nodes back after %v)", crashes, took, backs)
	}
	cl = c.dial(20 * time.Second)
	defer cl.Close()
	// Nothing happens to the job until well past the bound.
	var back time.Duration
	for time.Since(last) < bound+3*time.Second {
		if err := c.checkSamePIDs(cl, running); err != nil {
			t.Fatalf("%.1fs after the last restart: %v\n%s", time.Since(last).Seconds(), err, c.logs())
		}
		if back == 0 {
			if nodes, err := cl.Nodes(ctx); err == nil && connected(nodes) == 2 {
				back = time.Since(last)
			}
		}
		time.Sleep(250 * time.Millisecond)
	}
	if back == 0 {
		t.Fatalf("nodes not back %s after the last restart\n%s", bound+3*time.Second, c.logs())
	}
	for rank, at := range rankPIDs(running) {
		b, err := os.ReadFile(filepath.Join(c.dir, "nodes", at.node, "logs", running.GetId(), fmt.Sprintf("rank-%d.log", rank)))
		if err != nil {
			t.Fatal(err)
		}
		if n := strings.Count(string(b), "resume step="); n != 1 {
			t.Errorf("rank %d started %d times", rank, n)
		}
	}
	t.Logf("%d kill -9 restarts in %.1fs, nodes back after %v and %.1fs; job attempt 1 with pids %v %.0fs after the last",
		crashes, last.Sub(first).Seconds(), backs, back.Seconds(), rankPIDs(running), time.Since(last).Seconds())
}

// connected counts the connected nodes.
func connected(nodes []*api.NodeStatus) int {
	n := 0
	for _, nd := range nodes {
		if nd.GetConnected() && nd.GetState() == api.NodeState_NODE_STATE_READY {
			n++
		}
	}
	return n
}

// TestServerPauseKeepsJobs stops a real `gpuctl serve` with SIGSTOP for
// 4 s (four heartbeats: a VM migration, a stuck disk, a debugger) and
// resumes it with SIGCONT while ringtrain runs on two real nodemons. The
// silence was the server's own, not the nodes': no node is declared down,
// and the job keeps running with the same rank pids.
func TestServerPauseKeepsJobs(t *testing.T) {
	c := newProcCluster(t, 2)
	cl := c.dial(10 * time.Second)
	defer cl.Close()
	ctx := context.Background()
	r, err := cl.SubmitJob(ctx, &api.SubmitJobRequest{SpecYaml: c.ringSpec("paused", 2), Source: "pause test"})
	if err != nil {
		t.Fatal(err)
	}
	running := waitFor(t, cl, r.GetJob().GetId(), 20*time.Second, "running", func(j *api.Job) error { return runningWith(j, 1, 2) })
	if err := syscall.Kill(c.server.Process.Pid, syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	time.Sleep(4 * time.Second)
	if err := syscall.Kill(c.server.Process.Pid, syscall.SIGCONT); err != nil {
		t.Fatal(err)
	}
	resumed := time.Now()
	for time.Since(resumed) < 8*time.Second {
		if err := c.checkSamePIDs(cl, running); err != nil {
			t.Fatalf("%.1fs after SIGCONT: %v\n%s", time.Since(resumed).Seconds(), err, c.logs())
		}
		time.Sleep(250 * time.Millisecond)
	}
	evs, err := cl.Events(ctx, &api.ListEventsRequest{})
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range evs {
		if e.GetKind() == api.EventKind_EVENT_KIND_NODE_DOWN {
			t.Errorf("node declared down across the server's own pause: %s: %s", e.GetNode(), e.GetMessage())
		}
	}
	t.Logf("server paused 4s: job attempt 1 with pids %v, no node down, %.0fs after SIGCONT", rankPIDs(running), time.Since(resumed).Seconds())
}

// TestNodemonRestartOutlivesItsOldSession kills a nodemon with SIGKILL and
// starts it again at once: the server still holds the old session (heard
// from within two heartbeats) and turns the new one away for now, and the
// new nodemon retries until the old session is replaced instead of
// exiting as though its identity were refused.
func TestNodemonRestartOutlivesItsOldSession(t *testing.T) {
	c := newProcCluster(t, 1)
	cl := c.dial(10 * time.Second)
	defer cl.Close()
	name := NodeName(0)
	nodes, err := cl.Nodes(context.Background())
	if err != nil || len(nodes) != 1 {
		t.Fatalf("nodes: %v %v", nodes, err)
	}
	oldAddr := nodes[0].GetRemoteAddr()
	old := c.nodes[name]
	if err := old.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	<-old.done
	c.startNode(name)
	p := c.nodes[name]
	start := time.Now()
	poll(t, 15*time.Second, "node back on the new nodemon", func() error {
		select {
		case <-p.done:
			t.Fatalf("the restarted nodemon exited: %v\n%s", p.ProcessState, c.logs())
		default:
		}
		nodes, err := cl.Nodes(context.Background())
		if err != nil {
			return err
		}
		if connected(nodes) != 1 || nodes[0].GetRemoteAddr() == oldAddr {
			return fmt.Errorf("not connected from the new nodemon: %s from %s", nodes[0].GetState().Short(), nodes[0].GetRemoteAddr())
		}
		return nil
	})
	t.Logf("restarted nodemon connected %.2fs after it started", time.Since(start).Seconds())
}
