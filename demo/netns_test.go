package demo

import (
	"context"
	"fmt"
	"math/rand/v2"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/gpuctl/gpuctl/api"
	"github.com/gpuctl/gpuctl/client"
	"github.com/gpuctl/gpuctl/internal/needs"
	"github.com/gpuctl/gpuctl/internal/testbin"
)

// netnsNode is a network namespace for one node with two links to the
// host: one to the server's subnet, one to its peers' subnet, so the test
// can cut the node from the server but not from its peers.
type netnsNode struct {
	ns                 string
	toServer, toPeers  string // host-side link names
	serverIP, nodeSrv  string // host and node addresses on the server link
	peersIP, nodePeers string // host and node addresses on the peer link
}

func ipCmd(t *testing.T, args ...string) {
	t.Helper()
	if out, err := exec.Command("ip", args...).CombinedOutput(); err != nil {
		t.Fatalf("ip %s: %v: %s", strings.Join(args, " "), err, out)
	}
}

// newNetnsNode makes the namespace and its two veth links, removed when
// the test ends.
func newNetnsNode(t *testing.T) *netnsNode {
	t.Helper()
	needs.RootUser(t, "make a network namespace")
	if _, err := exec.LookPath("ip"); err != nil {
		needs.Root.Skip(t, "no ip(8) to make a network namespace: install iproute2")
	}
	tag := strconv.Itoa(os.Getpid()%100000) + strconv.Itoa(rand.IntN(10))
	b := 16 + rand.IntN(200)
	n := &netnsNode{ns: "gpuctl-" + tag, toServer: "gva" + tag, toPeers: "gvb" + tag,
		serverIP: fmt.Sprintf("10.%d.1.1", b), nodeSrv: fmt.Sprintf("10.%d.1.2", b),
		peersIP: fmt.Sprintf("10.%d.2.1", b), nodePeers: fmt.Sprintf("10.%d.2.2", b)}
	ipCmd(t, "netns", "add", n.ns)
	t.Cleanup(func() {
		exec.Command("ip", "netns", "del", n.ns).Run()
		exec.Command("ip", "link", "del", n.toServer).Run()
		exec.Command("ip", "link", "del", n.toPeers).Run()
	})
	ipCmd(t, "-n", n.ns, "link", "set", "lo", "up")
	for _, l := range []struct{ host, hostIP, nodeIP string }{{n.toServer, n.serverIP, n.nodeSrv}, {n.toPeers, n.peersIP, n.nodePeers}} {
		inner := l.host + "n"
		ipCmd(t, "link", "add", l.host, "type", "veth", "peer", "name", inner)
		ipCmd(t, "link", "set", inner, "netns", n.ns)
		ipCmd(t, "addr", "add", l.hostIP+"/24", "dev", l.host)
		ipCmd(t, "link", "set", l.host, "up")
		ipCmd(t, "-n", n.ns, "addr", "add", l.nodeIP+"/24", "dev", inner)
		ipCmd(t, "-n", n.ns, "link", "set", inner, "up")
	}
	return n
}

// TestNodeCutFromServerNotPeers runs a job on two nodes, one of them in
// its own network namespace, with a third node spare, and cuts that node's
// link to the server while its link to the other nodes stays up. The
// server cannot tell a dead node from a cut one: it recovers the job on
// the other two. The cut node's ranks are not stopped by a lease running
// out (its witnesses would keep vouching for an attempt no one
// superseded); they stop because the witnesses, told by the server that
// attempt 1 is superseded, say so on the node's next round of vouches.
// At no moment do ranks of attempts 1 and 2 live at once, and attempt 2
// starts only once the cut node can no longer renew its lease.
func TestNodeCutFromServerNotPeers(t *testing.T) {
	if testing.Short() {
		t.Skip("starts real server, nodemon and ringtrain processes")
	}
	n := newNetnsNode(t)
	const lease = 5 * time.Second
	nodemon, ringtrain := binaries(t)
	c := &procCluster{t: t, dir: t.TempDir(), gpuctl: testbin.Gpuctl(t), nodemon: nodemon, ringtain: ringtrain,
		nodes: map[string]*proc{}, nodeStarts: map[string]int{}}
	udp, err := net.ListenPacket("udp", n.serverIP+":0")
	if err != nil {
		t.Fatal(err)
	}
	c.addr = udp.LocalAddr().String()
	udp.Close()
	c.serveArgs = []string{"serve", "--data-dir", filepath.Join(c.dir, "server"), "--listen", c.addr, "--lease", lease.String(), "--server-name", n.serverIP}
	c.startServer()
	cl := c.dial(20 * time.Second)
	defer func() { cl.Close() }()
	ctx := context.Background()
	token, _, err := cl.CreateJoinToken(ctx, client.TokenOptions{TTL: time.Hour, Uses: 3})
	if err != nil {
		t.Fatal(err)
	}
	start := func(name, peerListen string, wrap ...string) {
		args := append(wrap, c.nodemon, "--server", c.addr, "--token", token, "--name", name,
			"--data-dir", filepath.Join(c.dir, "nodes", name), "--sim", "dgx-h100", "--ebpf", "off",
			"--trace-scope", "node", "--allow-root-ranks", "--peer-listen", peerListen)
		c.nodes[name] = startProcess(t, filepath.Join(c.dir, name+".log"), args[0], args[1:]...)
	}
	victim, other, spare := "node-cut", "node-a", "node-b"
	start(victim, n.nodePeers+":0", "ip", "netns", "exec", n.ns)
	start(other, n.peersIP+":0")
	start(spare, n.peersIP+":0")
	c.waitNodes(cl, 30*time.Second, 3)
	if _, err := cl.Cordon(ctx, spare, "cordon", "kept spare by the test"); err != nil {
		t.Fatal(err)
	}
	r, err := cl.SubmitJob(ctx, &api.SubmitJobRequest{SpecYaml: c.ringSpec("cut", 2) + "restart_policy: replace-node\n", Source: "netns test"})
	if err != nil {
		t.Fatal(err)
	}
	id := r.GetJob().GetId()
	first := waitFor(t, cl, id, 30*time.Second, "attempt 1 running", func(j *api.Job) error { return runningWith(j, 1, 2) })
	if _, err := cl.Cordon(ctx, spare, "uncordon", ""); err != nil {
		t.Fatal(err)
	}
	if w := first.GetWitnesses(); len(w) != 3 || !slices.Contains(nodeSet(first), victim) {
		t.Fatalf("attempt 1 on %v with witnesses %v, want %s and %s, and all three as witnesses", nodeSet(first), w, victim, other)
	}

	ipCmd(t, "link", "set", n.toServer, "down")
	cut := time.Now()
	var victimGone, secondAt time.Duration
	for time.Since(cut) < 40*time.Second && secondAt == 0 {
		procs := jobProcs(t, id)
		has := func(attempt string, onVictim bool) bool {
			return slices.ContainsFunc(procs, func(p attemptProc) bool { return p.attempt == attempt && (!onVictim || p.node == victim) })
		}
		if has("1", false) && has("2", false) {
			t.Fatalf("%.2fs after the cut, attempts 1 and 2 run at once: %v\n%s", time.Since(cut).Seconds(), procs, c.logs())
		}
		if victimGone == 0 && !has("1", true) {
			victimGone = time.Since(cut)
		}
		if has("2", false) {
			secondAt = time.Since(cut)
		}
		time.Sleep(20 * time.Millisecond)
	}
	if secondAt == 0 {
		js, _ := cl.Jobs(ctx, id)
		t.Fatalf("attempt 2 not running 40 s after the cut: %v\n%s", js, c.logs())
	}
	if victimGone == 0 || victimGone > secondAt {
		t.Fatalf("attempt 2 started %.2fs after the cut, attempt 1 on %s gone after %.2fs", secondAt.Seconds(), victim, victimGone.Seconds())
	}
	log, _ := os.ReadFile(filepath.Join(c.dir, victim+".log"))
	if !strings.Contains(string(log), "a witness says this attempt is superseded") {
		t.Errorf("%s's ranks were not stopped on a witness's word:\n%s", victim, log)
	}
	now := waitFor(t, cl, id, 20*time.Second, "attempt 2 running", func(j *api.Job) error { return runningWith(j, 2, 2) })
	if slices.Contains(nodeSet(now), victim) {
		t.Errorf("attempt 2 on %v, with the cut node", nodeSet(now))
	}

	ipCmd(t, "link", "set", n.toServer, "up")
	poll(t, 30*time.Second, victim+" back", func() error {
		nodes, err := cl.Nodes(ctx)
		if err != nil {
			return err
		}
		for _, nd := range nodes {
			if nd.GetRegistration().GetName() == victim && nd.GetConnected() {
				return nil
			}
		}
		return fmt.Errorf("%s not connected", victim)
	})
	if left := slices.DeleteFunc(jobProcs(t, id), func(p attemptProc) bool { return p.attempt != "1" }); len(left) > 0 {
		t.Errorf("attempt 1 still runs after the node returned: %v", left)
	}
	t.Logf("cut %s from the server, not from its peers (lease %s): its attempt 1 ranks stopped %.2fs after the cut on a witness's word; attempt 2 on %v %.2fs after the cut",
		victim, lease, victimGone.Seconds(), nodeSet(now), secondAt.Seconds())
}
