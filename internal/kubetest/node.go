package kubetest

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// kubeletStateDir is where every kubelet keeps its device plugin socket,
// whatever its --root-dir.
const kubeletStateDir = "/var/lib/kubelet"

// DevicePluginDir is where kubelet serves its device plugin Registration
// socket (kubelet.sock) and device plugins theirs: fixed in kubelet, so
// only one kubelet per host can have device plugins (DevicePluginNode).
const DevicePluginDir = kubeletStateDir + "/device-plugins"

// cniBinDir is where Debian's containernetworking-plugins puts them.
const cniBinDir = "/usr/lib/cni"

// PauseImage is the sandbox image every node's containerd uses; Start
// imports it (built by Image) into each.
const PauseImage = "localhost/gpuctl/pause:1"

// containerdConfig is one node's containerd: its own root, state and
// socket, the CRI plugin with the local pause image, host networking's
// loopback-only CNI config (so the runtime reports its network ready),
// and the OOM score clamped to containerd's own, since this host's root
// may not lower it (no CAP_SYS_RESOURCE).
const containerdConfig = `version = 2
root = %[1]q
state = %[2]q
[grpc]
  address = %[3]q
[ttrpc]
  address = ""
[debug]
  address = ""
[metrics]
  address = ""
[plugins."io.containerd.grpc.v1.cri"]
  sandbox_image = %[4]q
  restrict_oom_score_adj = true
  disable_apparmor = true
  stream_server_address = "127.0.0.1"
  stream_server_port = "0"
  [plugins."io.containerd.grpc.v1.cri".containerd]
    snapshotter = "overlayfs"
    default_runtime_name = "runc"
    [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
  [plugins."io.containerd.grpc.v1.cri".cni]
    bin_dir = %[5]q
    conf_dir = %[6]q
`

// kubeletConfig is one node's kubelet: x509 clients only, its own ports,
// no QoS cgroups or node allocatable enforcement (several kubelets share
// this host's cgroups), cgroup v1 allowed, and no eviction or image GC
// (the host's disk is the tests', not the kubelet's to manage).
const kubeletConfig = `apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
authentication:
  anonymous: {enabled: false}
  webhook: {enabled: false}
  x509: {clientCAFile: %[1]q}
authorization: {mode: AlwaysAllow}
cgroupDriver: cgroupfs
cgroupsPerQOS: false
enforceNodeAllocatable: []
containerRuntimeEndpoint: unix://%[2]s
failSwapOn: false
failCgroupV1: false
address: 127.0.0.1
port: %[3]d
healthzBindAddress: 127.0.0.1
healthzPort: %[4]d
readOnlyPort: 0
resolvConf: ""
makeIPTablesUtilChains: false
localStorageCapacityIsolation: false
evictionHard: {}
imageGCHighThresholdPercent: 100
imageGCLowThresholdPercent: 99
podLogsDir: %[5]q
nodeStatusUpdateFrequency: 2s
nodeStatusReportFrequency: 2s
`

// startNode starts a node's containerd, imports images into it and starts
// its kubelet, then waits for the Node to be Ready.
func (c *Cluster) startNode(name string, images []string) {
	c.t.Helper()
	dir := filepath.Join(c.dir, "node-"+name)
	for _, d := range []string{"containerd/root", "containerd/state", "cni", "kubelet", "pods-logs"} {
		if err := os.MkdirAll(filepath.Join(dir, d), 0o755); err != nil {
			c.t.Fatal(err)
		}
	}
	k := &kubelet{name: name, socket: filepath.Join(dir, "containerd", "containerd.sock")}
	cni := `{"cniVersion": "0.4.0", "name": "loopback", "plugins": [{"type": "loopback"}]}`
	write := func(path, data string) {
		if err := os.WriteFile(path, []byte(data), 0o600); err != nil {
			c.t.Fatal(err)
		}
	}
	write(filepath.Join(dir, "cni", "10-loopback.conflist"), cni)
	ctdConf := filepath.Join(dir, "containerd", "config.toml")
	write(ctdConf, fmt.Sprintf(containerdConfig, filepath.Join(dir, "containerd/root"), filepath.Join(dir, "containerd/state"),
		k.socket, PauseImage, cniBinDir, filepath.Join(dir, "cni")))
	k.containerd = c.startPath("containerd-"+name, "containerd", "--config", ctdConf)
	c.kubelets[name] = k
	deadline := time.Now().Add(20 * time.Second)
	for k.ctr("version") != nil {
		if time.Now().After(deadline) || k.containerd.exited() {
			c.t.Fatalf("containerd of %s did not start; its log:\n%s", name, c.logTail("containerd-"+name))
		}
		time.Sleep(100 * time.Millisecond)
	}
	for _, img := range images {
		if err := k.ctr("-n", "k8s.io", "images", "import", img); err != nil {
			c.t.Fatalf("import %s into %s's containerd: %v", img, name, err)
		}
	}
	if err := c.pki.issue("node-"+name, "system:node:"+name, []string{"system:nodes"}, nil, nil); err != nil {
		c.t.Fatal(err)
	}
	kc, err := c.pki.kubeconfig("node-"+name, c.Server)
	if err != nil {
		c.t.Fatal(err)
	}
	port, err := freePort()
	if err != nil {
		c.t.Fatal(err)
	}
	healthz, err := freePort()
	if err != nil {
		c.t.Fatal(err)
	}
	conf := filepath.Join(dir, "kubelet.yaml")
	write(conf, fmt.Sprintf(kubeletConfig, c.pki.path("ca.crt"), k.socket, port, healthz, filepath.Join(dir, "pods-logs")))
	k.args = []string{"--config=" + conf, "--kubeconfig=" + kc, "--hostname-override=" + name,
		"--root-dir=" + filepath.Join(dir, "kubelet"), "--cert-dir=" + filepath.Join(dir, "kubelet", "pki"), "--node-ip=127.0.0.1"}
	k.kubelet = c.start("kubelet-"+name, "kubelet", k.args...)
	c.WaitNodeReady(name, true, 60*time.Second)
}

// ctr runs containerd's CLI against the node's containerd.
func (k *kubelet) ctr(args ...string) error {
	out, err := exec.Command("ctr", append([]string{"--address", k.socket}, args...)...).CombinedOutput()
	if err != nil {
		return fmt.Errorf("ctr %s: %v: %s", strings.Join(args, " "), err, out)
	}
	return nil
}

// removeContainers kills and deletes every task and container of the
// node's containerd, which a kubelet leaves running when it stops.
func (k *kubelet) removeContainers() {
	out, err := exec.Command("ctr", "--address", k.socket, "-n", "k8s.io", "containers", "ls", "-q").Output()
	if err != nil {
		return
	}
	for _, id := range strings.Fields(string(out)) {
		k.ctr("-n", "k8s.io", "tasks", "kill", "-s", "SIGKILL", id)
		for range 50 {
			if k.ctr("-n", "k8s.io", "tasks", "delete", id) == nil || !strings.Contains(k.tasks(), id) {
				break
			}
			time.Sleep(100 * time.Millisecond)
		}
		k.ctr("-n", "k8s.io", "containers", "delete", id)
	}
}

func (k *kubelet) tasks() string {
	out, _ := exec.Command("ctr", "--address", k.socket, "-n", "k8s.io", "tasks", "ls", "-q").Output()
	return string(out)
}

// StopKubelet stops a node's kubelet (its pods keep running, as on a
// node whose kubelet died): the Node goes NotReady.
func (c *Cluster) StopKubelet(name string) {
	c.t.Helper()
	k := c.node(name)
	k.kubelet.stop(10 * time.Second)
}

// node is the named node's kubelet.
func (c *Cluster) node(name string) *kubelet {
	c.t.Helper()
	k, ok := c.kubelets[name]
	if !ok {
		c.t.Fatalf("kubetest: no node %q", name)
	}
	return k
}

// RestartKubelet stops a node's kubelet and starts it again as it was
// (its pods keep running meanwhile), then waits for the Node to be Ready.
// Its log goes on in the same file.
func (c *Cluster) RestartKubelet(name string) {
	c.t.Helper()
	k := c.node(name)
	k.kubelet.stop(10 * time.Second)
	k.kubelet = c.start("kubelet-"+name, "kubelet", k.args...)
	c.WaitNodeReady(name, true, 60*time.Second)
}

// WaitNodeReady waits for node's Ready condition to be ready (or not).
func (c *Cluster) WaitNodeReady(name string, ready bool, limit time.Duration) {
	c.t.Helper()
	want := corev1.ConditionTrue
	if !ready {
		want = corev1.ConditionFalse
	}
	last := "not registered"
	if c.pollNode(name, limit, func(n *corev1.Node) bool {
		for _, cond := range n.Status.Conditions {
			if cond.Type == corev1.NodeReady {
				last = fmt.Sprintf("%s (%s: %s)", cond.Status, cond.Reason, cond.Message)
				// Unknown is how a node that stopped reporting reads.
				return cond.Status == want || (!ready && cond.Status == corev1.ConditionUnknown)
			}
		}
		return false
	}) {
		return
	}
	c.t.Fatalf("node %s: Ready is %s after %v, want ready=%v; its kubelet's log:\n%s", name, last, limit, ready, c.logTail("kubelet-"+name))
}

// WaitAllocatable waits for node's allocatable count of resource (an
// extended resource such as nvidia.com/gpu, offered by a device plugin)
// to be want.
func (c *Cluster) WaitAllocatable(name string, resource corev1.ResourceName, want int64, limit time.Duration) {
	c.t.Helper()
	var got int64
	if c.pollNode(name, limit, func(n *corev1.Node) bool {
		q := n.Status.Allocatable[resource]
		got = q.Value()
		return got == want
	}) {
		return
	}
	c.t.Fatalf("node %s: allocatable %s is %d after %v, want %d; its kubelet's log:\n%s", name, resource, got, limit, want, c.logTail("kubelet-"+name))
}

// pollNode reads the Node every 200 ms until ok says it is as wanted
// (true) or limit passes (false).
func (c *Cluster) pollNode(name string, limit time.Duration, ok func(*corev1.Node) bool) bool {
	c.t.Helper()
	cs := c.Client()
	deadline := time.Now().Add(limit)
	for time.Now().Before(deadline) {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		n, err := cs.CoreV1().Nodes().Get(ctx, name, metav1.GetOptions{})
		cancel()
		if err == nil && ok(n) {
			return true
		}
		time.Sleep(200 * time.Millisecond)
	}
	return false
}
