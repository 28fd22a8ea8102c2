package demo

import (
	"context"
	"fmt"
	"net"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/gpuctl/gpuctl/api"
	"github.com/gpuctl/gpuctl/client"
	"github.com/gpuctl/gpuctl/internal/etcdtest"
	"github.com/gpuctl/gpuctl/internal/testbin"
	"github.com/gpuctl/gpuctl/transport"
)

// haCluster is a highly available control plane on loopback: three
// in-process etcd members, two `gpuctl serve --store etcd` processes, and
// nodemon processes given both servers' addresses.
type haCluster struct {
	*procCluster
	etcd    *etcdtest.Cluster
	addrs   [2]string
	servers [2]*proc
	starts  [2]int
	// serverArgs are added to every server's flags (later ones win).
	serverArgs []string
}

func freeUDP(t *testing.T) string {
	t.Helper()
	udp, err := net.ListenPacket("udp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer udp.Close()
	return udp.LocalAddr().String()
}

// serverName is server i's name in the control plane.
func serverName(i int) string { return fmt.Sprintf("head-%d", i+1) }

func newHACluster(t *testing.T, nodes int, serverArgs ...string) *haCluster {
	t.Helper()
	c := newHAServers(t, serverArgs...)
	c.joinNodes(nodes)
	return c
}

// newHAServers starts etcd and both servers, server 0 leading; no nodes.
func newHAServers(t *testing.T, serverArgs ...string) *haCluster {
	t.Helper()
	if testing.Short() {
		t.Skip("starts etcd, real servers, nodemons and ringtrain")
	}
	nodemon, ringtrain := binaries(t)
	// The clients remember the server that answered in the cache dir:
	// the test's own, not the user's.
	t.Setenv("XDG_CACHE_HOME", t.TempDir())
	c := &haCluster{procCluster: &procCluster{t: t, dir: t.TempDir(), gpuctl: testbin.Gpuctl(t), nodemon: nodemon,
		ringtain: ringtrain, nodes: map[string]*proc{}, nodeStarts: map[string]int{}}, serverArgs: serverArgs}
	c.etcd = etcdtest.Start(t, 3)
	c.addrs = [2]string{freeUDP(t), freeUDP(t)}
	c.addr = c.addrs[0] + "," + c.addrs[1]
	c.startServer(0)
	cl := c.dial(30 * time.Second)
	c.waitLeader(cl, serverName(0), 20*time.Second)
	c.startServer(1)
	c.waitRole(cl, serverName(1), "standby", 20*time.Second)
	cl.Close()
	return c
}

// joinNodes starts n nodemons and waits until they are ready.
func (c *haCluster) joinNodes(n int) {
	c.t.Helper()
	cl := c.dial(10 * time.Second)
	defer cl.Close()
	token, _, err := cl.CreateJoinToken(context.Background(), client.TokenOptions{TTL: time.Hour, Uses: n})
	if err != nil {
		c.t.Fatal(err)
	}
	c.token = token
	for i := 0; i < n; i++ {
		c.startNode(NodeName(i))
	}
	c.waitNodes(cl, 30*time.Second, n)
}

// startServer starts server i. Server 0's data dir is the one
// procCluster reads admin.yaml and the CA from.
func (c *haCluster) startServer(i int) {
	c.t.Helper()
	dir := filepath.Join(c.dir, "server")
	if i > 0 {
		dir = filepath.Join(c.dir, fmt.Sprintf("server-%d", i+1))
	}
	other := c.addrs[1-i]
	c.starts[i]++
	args := []string{"serve", "--store", "etcd", "--etcd-endpoints", strings.Join(c.etcd.Endpoints(), ","), "--name", serverName(i),
		"--data-dir", dir, "--listen", c.addrs[i], "--advertise", c.addrs[i] + "," + other,
		"--leader-ttl", "2s", "--lease", "10s", "--log-level", "debug"}
	c.servers[i] = startProcess(c.t, filepath.Join(c.dir, fmt.Sprintf("%s-%d.log", serverName(i), c.starts[i])), c.gpuctl,
		append(args, c.serverArgs...)...)
}

func (c *haCluster) killServer(i int) {
	c.t.Helper()
	if err := c.servers[i].Process.Signal(syscall.SIGKILL); err != nil {
		c.t.Fatal(err)
	}
	<-c.servers[i].done
}

// role is what the control plane says of server name ("" when unlisted).
func role(st *api.StatusResponse, name string) string {
	for _, s := range st.GetServers() {
		if s.GetName() == name {
			return s.GetRole()
		}
	}
	return ""
}

func (c *haCluster) waitLeader(cl *client.Client, name string, limit time.Duration) *api.StatusResponse {
	c.t.Helper()
	var st *api.StatusResponse
	poll(c.t, limit, name+" leads", func() error {
		ctx, cancel := context.WithTimeout(context.Background(), 4*time.Second)
		defer cancel()
		s, err := cl.Status(ctx)
		if err != nil {
			return err
		}
		if s.GetLeader().GetName() != name || s.GetSelf().GetName() != name || s.GetSelf().GetRole() != "leader" {
			return fmt.Errorf("leader %q, answered by %q (%s)", s.GetLeader().GetName(), s.GetSelf().GetName(), s.GetSelf().GetRole())
		}
		st = s
		return nil
	})
	return st
}

func (c *haCluster) waitRole(cl *client.Client, name, want string, limit time.Duration) {
	c.t.Helper()
	poll(c.t, limit, name+" is "+want, func() error {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer cancel()
		s, err := cl.Status(ctx)
		if err != nil {
			return err
		}
		if got := role(s, name); got != want {
			return fmt.Errorf("%s is %q", name, got)
		}
		return nil
	})
}

// TestHAFailover is the highly available control plane end to end: the
// leading server is killed with SIGKILL while ringtrain runs on four
// nodes; the standby leads within 5 s, the nodes move to it, the job keeps
// its pids and nothing acknowledged is lost; the old leader comes back as
// a standby; then the etcd member that leads raft is killed and the
// control plane rides it out.
func TestHAFailover(t *testing.T) {
	const n = 4
	c := newHACluster(t, n)
	cl := c.dial(10 * time.Second)
	defer cl.Close()
	ctx := context.Background()
	r, err := cl.SubmitJob(ctx, &api.SubmitJobRequest{SpecYaml: c.ringSpec("ha", n), Source: "ha test"})
	if err != nil {
		t.Fatal(err)
	}
	running := waitFor(t, cl, r.GetJob().GetId(), 30*time.Second, "running", func(j *api.Job) error { return runningWith(j, 1, n) })

	// Acknowledged just before the kill: a cordon and a join token.
	if _, err := cl.Cordon(ctx, NodeName(0), "cordon", "acknowledged before failover"); err != nil {
		t.Fatal(err)
	}
	_, tok, err := cl.CreateJoinToken(ctx, client.TokenOptions{TTL: time.Hour, Uses: 1, Description: "made before failover"})
	if err != nil {
		t.Fatal(err)
	}

	// A client of the standby alone sees the takeover as it happens; the
	// operator's client (both addresses) must first notice the old leader
	// is silent.
	standby := c.dialOnly(c.addrs[1])
	defer standby.Close()
	killed := time.Now()
	c.killServer(0)
	st := c.waitLeader(standby, serverName(1), 10*time.Second)
	if len(st.GetLeadership()) == 0 || !strings.Contains(st.GetLeadership()[0].GetMessage(), serverName(1)) {
		t.Fatalf("status does not show the failover as its newest leadership change: %v", st.GetLeadership())
	}
	leading := time.Unix(0, st.GetLeadership()[0].GetTimeUnixNano()).Sub(killed)
	var reconnected time.Duration
	poll(t, 30*time.Second, "nodes back at the new leader", func() error {
		nodes, err := standby.Nodes(ctx)
		if err != nil {
			return err
		}
		if k := connected(nodes); k != n {
			return fmt.Errorf("%d of %d connected", k, n)
		}
		reconnected = time.Since(killed)
		return nil
	})
	t.Logf("leader killed → %s leading %.2fs, all %d nodes reconnected %.2fs", serverName(1), leading.Seconds(), n, reconnected.Seconds())
	if leading > 5*time.Second {
		t.Errorf("the standby took %s to lead, want within 5s", leading)
	}
	operator := time.Now()
	c.waitLeader(cl, serverName(1), 15*time.Second)
	t.Logf("the operator's client (both addresses) reached the new leader %.2fs after the kill", operator.Sub(killed).Seconds()+time.Since(operator).Seconds())
	if err := c.checkSamePIDs(cl, running); err != nil {
		t.Fatalf("after the failover: %v\n%s", err, c.logs())
	}
	nd := nodeNamed(t, cl, NodeName(0))
	if !nd.GetCordoned() || nd.GetCordonReason() != "acknowledged before failover" {
		t.Errorf("the cordon acknowledged before the failover is lost: cordoned %v, reason %q", nd.GetCordoned(), nd.GetCordonReason())
	}
	toks, err := cl.ListTokens(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if !hasToken(toks, tok.GetId()) {
		t.Errorf("the join token made before the failover is lost")
	}

	// The old leader comes back as a standby.
	c.startServer(0)
	c.waitRole(cl, serverName(0), "standby", 20*time.Second)

	// The etcd member leading raft dies; the servers ride it out.
	before := len(c.waitLeader(cl, serverName(1), 5*time.Second).GetLeadership())
	member := c.etcd.Leader()
	c.etcd.Kill(member)
	etcdKilled := time.Now()
	poll(t, 15*time.Second, "a change is accepted after the etcd leader died", func() error {
		_, err := cl.Cordon(ctx, NodeName(0), "uncordon", "")
		return err
	})
	t.Logf("etcd raft leader (member %d) killed → a change accepted after %.2fs", member, time.Since(etcdKilled).Seconds())
	time.Sleep(3 * time.Second) // past the session TTL: nobody was deposed
	st = c.waitLeader(cl, serverName(1), 5*time.Second)
	if role(st, serverName(0)) != "standby" {
		t.Errorf("after the etcd failover %s is %q, want standby", serverName(0), role(st, serverName(0)))
	}
	if after := len(st.GetLeadership()); after != before {
		t.Errorf("the etcd failover changed the leadership (%d changes before, %d after): %v", before, after, st.GetLeadership())
	}
	if err := c.checkSamePIDs(cl, running); err != nil {
		t.Fatalf("after the etcd failover: %v\n%s", err, c.logs())
	}
}

// dialOnly is a client of the admin identity that talks to addr alone.
func (c *haCluster) dialOnly(addr string) *client.Client {
	c.t.Helper()
	_, id, err := transport.LoadClientConfig(c.config())
	if err != nil {
		c.t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	cl, err := client.DialIdentity(ctx, addr, id)
	if err != nil {
		c.t.Fatal(err)
	}
	return cl
}

func hasToken(toks []*api.JoinToken, id string) bool {
	for _, t := range toks {
		if t.GetId() == id {
			return true
		}
	}
	return false
}

func nodeNamed(t *testing.T, cl *client.Client, name string) *api.NodeStatus {
	t.Helper()
	nodes, err := cl.Nodes(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	for _, nd := range nodes {
		if nd.GetRegistration().GetName() == name {
			return nd
		}
	}
	t.Fatalf("no node %s", name)
	return nil
}

func freeTCP(t *testing.T) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().String()
}

// TestEmbeddedEtcdServer: `gpuctl serve --embedded-etcd` runs its own etcd
// member, leads on it, reports it in status, and after a SIGKILL starts
// again from the member's data dir with what it had stored.
func TestEmbeddedEtcdServer(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a real server with an etcd member")
	}
	dir := t.TempDir()
	addr, peer, clientURL := freeUDP(t), "http://"+freeTCP(t), "http://"+freeTCP(t)
	start := func(n int) *proc {
		return startProcess(t, filepath.Join(dir, fmt.Sprintf("serve-%d.log", n)), testbin.Gpuctl(t), "serve", "--embedded-etcd",
			"--name", "head-1", "--etcd-peer-url", peer, "--etcd-client-url", clientURL,
			"--data-dir", filepath.Join(dir, "server"), "--listen", addr)
	}
	c := &haCluster{procCluster: &procCluster{t: t, dir: dir}}
	srv := start(1)
	cl := c.dial(30 * time.Second)
	st := c.waitLeader(cl, "head-1", 20*time.Second)
	if st.GetStore() != "etcd" || len(st.GetStoreMembers()) != 1 || !st.GetStoreMembers()[0].GetLeader() || !st.GetStoreHealthy() {
		t.Fatalf("status of a server with its own member: store %q healthy %v members %v", st.GetStore(), st.GetStoreHealthy(), st.GetStoreMembers())
	}
	if got := st.GetStoreMembers()[0].GetEndpoint(); got != clientURL {
		t.Errorf("member endpoint %q, want %q", got, clientURL)
	}
	_, tok, err := cl.CreateJoinToken(context.Background(), client.TokenOptions{TTL: time.Hour, Description: "kept in the member"})
	if err != nil {
		t.Fatal(err)
	}
	cl.Close()
	srv.Process.Signal(syscall.SIGKILL)
	<-srv.done
	start(2)
	cl = c.dial(30 * time.Second)
	defer cl.Close()
	st = c.waitLeader(cl, "head-1", 20*time.Second)
	if n := len(st.GetLeadership()); n != 2 {
		t.Errorf("%d leadership changes recorded, want 2 (one per start): %v", n, st.GetLeadership())
	}
	toks, err := cl.ListTokens(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if !hasToken(toks, tok.GetId()) {
		t.Error("the join token made before the SIGKILL is gone")
	}
}
