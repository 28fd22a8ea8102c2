// Package kubetest runs a real Kubernetes cluster on loopback for tests:
// etcd (in process), kube-apiserver and kube-controller-manager built from
// k8s.io/kubernetes (make kube), and real kubelets, each with a containerd
// of its own (own root, state and socket, so that one kubelet never reaps
// another's containers), running pods with host networking from images
// built here and imported without a registry.
package kubetest

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/gpuctl/gpuctl/internal/etcdtest"
	"github.com/gpuctl/gpuctl/internal/needs"
	"github.com/gpuctl/gpuctl/internal/testbin"
)

// Options shape a test cluster.
type Options struct {
	// Nodes are the kubelets' node names; none runs the control plane
	// alone.
	Nodes []string
	// Images are OCI archives (Image builds them) every node's containerd
	// imports before its kubelet starts.
	Images []string
	// DevicePluginNode, one of Nodes, is the node whose kubelet device
	// plugins register with. Every kubelet serves its Registration socket
	// in one fixed directory (DevicePluginDir) and deletes the sockets
	// there as it starts, so this node's kubelet starts last and its
	// socket is the one there; the other nodes offer no devices. Start
	// fails if /var/lib/kubelet is there already: it would be another
	// kubelet's, or a test's left behind.
	DevicePluginNode string
}

// Cluster is a running test cluster.
type Cluster struct {
	t   testing.TB
	dir string
	pki *pki
	// Server is the API server's URL; Admin a kubeconfig of a
	// system:masters user.
	Server   string
	Admin    string
	procs    []*process
	kubelets map[string]*kubelet
	// apiserver runs with apiserverArgs (StopAPIServer, StartAPIServer).
	apiserver     *process
	apiserverArgs []string
	restarts      int
	// ownsKubeletDir: /var/lib/kubelet did not exist before this cluster's
	// kubelets made it (their device plugin socket has a fixed path there).
	ownsKubeletDir bool
	// hostLock is held while the cluster's kubelets run (kubeletLock).
	hostLock *os.File
}

// kubelet is one node: its containerd and kubelet processes.
type kubelet struct {
	name       string
	containerd *process
	kubelet    *process
	socket     string
	// args are the kubelet's, to start it again.
	args []string
}

// BinDir is where make kube leaves the Kubernetes programs: $GPUCTL_KUBE_BIN
// or bin/kube in the repository.
func BinDir(t testing.TB) string {
	if d := os.Getenv("GPUCTL_KUBE_BIN"); d != "" {
		return d
	}
	return filepath.Join(testbin.Root(t), "bin", "kube")
}

// Require skips (or, with GPUCTL_REQUIRE_KUBE, fails) a test on a machine
// without the Kubernetes programs, or, when kubelets are wanted, without
// containerd, runc, the CNI plugins and buildah.
func Require(t testing.TB, kubelets bool) {
	t.Helper()
	needs.RootUser(t, "run kube-apiserver's etcd, containerd and kubelets")
	for _, p := range []string{"kube-apiserver", "kube-controller-manager", "kubelet"} {
		if _, err := os.Stat(filepath.Join(BinDir(t), p)); err != nil {
			needs.Kube.Skip(t, "%s is not built: make kube builds it into bin/kube (%v)", p, err)
		}
	}
	if !kubelets {
		return
	}
	for _, p := range []string{"containerd", "ctr", "runc", "buildah"} {
		if _, err := exec.LookPath(p); err != nil {
			needs.Kube.Skip(t, "%s is not installed (apt-get install containerd runc containernetworking-plugins buildah)", p)
		}
	}
	if _, err := os.Stat(filepath.Join(cniBinDir, "loopback")); err != nil {
		needs.Kube.Skip(t, "the CNI plugins are not installed (apt-get install containernetworking-plugins): %v", err)
	}
}

// Start runs a cluster until the test ends. It needs Require's programs.
func Start(t testing.TB, o Options) *Cluster {
	t.Helper()
	dir, err := os.MkdirTemp("", "kubetest-")
	if err != nil {
		t.Fatal(err)
	}
	c := &Cluster{t: t, dir: dir, kubelets: map[string]*kubelet{}}
	t.Cleanup(c.stop)
	if c.pki, err = newPKI(filepath.Join(dir, "pki")); err != nil {
		t.Fatal(err)
	}
	etcd := etcdtest.Start(t, 1)
	port, err := freePort()
	if err != nil {
		t.Fatal(err)
	}
	c.Server = fmt.Sprintf("https://127.0.0.1:%d", port)
	for _, step := range []func() error{
		func() error {
			return c.pki.issue("apiserver", "kube-apiserver", nil, []net.IP{net.IPv4(127, 0, 0, 1), net.IPv4(10, 96, 0, 1)},
				[]string{"localhost", "kubernetes", "kubernetes.default", "kubernetes.default.svc"})
		},
		func() error { return c.pki.issue("admin", "kubetest-admin", []string{"system:masters"}, nil, nil) },
		c.pki.serviceAccountKeys,
	} {
		if err := step(); err != nil {
			t.Fatalf("kubetest pki: %v", err)
		}
	}
	if c.Admin, err = c.pki.kubeconfig("admin", c.Server); err != nil {
		t.Fatal(err)
	}
	p := c.pki.path
	c.apiserverArgs = []string{
		"--etcd-servers=" + strings.Join(etcd.Endpoints(), ","),
		fmt.Sprintf("--secure-port=%d", port), "--bind-address=127.0.0.1", "--advertise-address=127.0.0.1",
		// The API server would publish 127.0.0.1 as the kubernetes
		// Service's endpoint, which Endpoints refuse: no pod here needs it.
		"--endpoint-reconciler-type=none",
		"--tls-cert-file=" + p("apiserver.crt"), "--tls-private-key-file=" + p("apiserver.key"),
		"--client-ca-file=" + p("ca.crt"),
		"--service-account-issuer=https://kubernetes.default.svc",
		"--service-account-key-file=" + p("sa.pub"), "--service-account-signing-key-file=" + p("sa.key"),
		"--service-cluster-ip-range=10.96.0.0/16",
		"--authorization-mode=Node,RBAC",
		// As kubeadm's clusters: agents such as nodemon's DaemonSet run
		// privileged.
		"--allow-privileged=true",
		"--kubelet-client-certificate=" + p("admin.crt"), "--kubelet-client-key=" + p("admin.key"),
		"--kubelet-certificate-authority=" + p("ca.crt"),
	}
	c.apiserver = c.start("kube-apiserver", "kube-apiserver", c.apiserverArgs...)
	c.waitReady(60 * time.Second)
	c.start("kube-controller-manager", "kube-controller-manager",
		"--kubeconfig="+c.Admin, "--leader-elect=false", "--secure-port=0",
		"--service-account-private-key-file="+p("sa.key"), "--root-ca-file="+p("ca.crt"),
		"--use-service-account-credentials=false",
		// No pod network here: nothing allocates pod CIDRs.
		"--controllers=*,-nodeipam",
		// A node that stops reporting is NotReady within seconds, not 40.
		"--node-monitor-grace-period=8s", "--node-monitor-period=1s",
	)
	if len(o.Nodes) > 0 {
		nodes, err := devicePluginLast(o.Nodes, o.DevicePluginNode)
		if err != nil {
			t.Fatalf("kubetest: %v", err)
		}
		if c.hostLock, err = kubeletLock(t, o.DevicePluginNode != ""); err != nil {
			t.Fatalf("kubetest: %v", err)
		}
		_, err = os.Stat(kubeletStateDir)
		c.ownsKubeletDir = os.IsNotExist(err)
		if o.DevicePluginNode != "" && !c.ownsKubeletDir {
			t.Fatalf("kubetest: %s exists, so a kubelet other than this cluster's may own the device plugin directory %s "+
				"(or a test left it behind): stop that kubelet, or remove the directory if nothing uses it", kubeletStateDir, DevicePluginDir)
		}
		images := append([]string{PauseArchive(t, dir)}, o.Images...)
		for _, n := range nodes {
			c.startNode(n, images)
		}
	}
	return c
}

// StopAPIServer stops the API server (the rest of the cluster runs on, as
// in an outage of the control plane); StartAPIServer brings it back on the
// same address and waits until it is ready.
func (c *Cluster) StopAPIServer() { c.apiserver.stop(10 * time.Second) }

// StartAPIServer starts the API server StopAPIServer stopped.
func (c *Cluster) StartAPIServer() {
	c.t.Helper()
	if !c.apiserver.exited() {
		c.t.Fatal("kubetest: the API server is running")
	}
	c.restarts++
	c.apiserver = c.start(fmt.Sprintf("kube-apiserver-%d", c.restarts+1), "kube-apiserver", c.apiserverArgs...)
	c.waitReady(60 * time.Second)
}

// kubeletLockPath is the host's lock on the kubelets' shared directory.
const kubeletLockPath = "/tmp/gpuctl-kubetest-kubelet.lock"

// kubeletLock waits until this host's kubelets may start: clusters whose
// kubelets share the device plugin directory as they always have run
// together (a shared lock), one whose kubelet device plugins register with
// runs alone (exclusive), so its socket there stays its own. Tests of
// several packages run at once, each with its clusters.
func kubeletLock(t testing.TB, exclusive bool) (*os.File, error) {
	t.Helper()
	f, err := os.OpenFile(kubeletLockPath, os.O_CREATE|os.O_RDWR, 0o600)
	if err != nil {
		return nil, fmt.Errorf("host lock: %w", err)
	}
	how := syscall.LOCK_SH
	if exclusive {
		how = syscall.LOCK_EX
	}
	if err := syscall.Flock(int(f.Fd()), how|syscall.LOCK_NB); err == nil {
		return f, nil
	}
	t.Logf("kubetest: waiting for another test's kubelets to end (%s)", kubeletLockPath)
	if err := syscall.Flock(int(f.Fd()), how); err != nil {
		f.Close()
		return nil, fmt.Errorf("host lock %s: %w", kubeletLockPath, err)
	}
	return f, nil
}

// devicePluginLast orders nodes so that dp, if any, starts last.
func devicePluginLast(nodes []string, dp string) ([]string, error) {
	if dp == "" {
		return nodes, nil
	}
	out := make([]string, 0, len(nodes))
	for _, n := range nodes {
		if n != dp {
			out = append(out, n)
		}
	}
	if len(out) == len(nodes) {
		return nil, fmt.Errorf("DevicePluginNode %q is not one of the nodes %v", dp, nodes)
	}
	return append(out, dp), nil
}

// Client returns a clientset as the cluster's administrator.
func (c *Cluster) Client() *kubernetes.Clientset {
	c.t.Helper()
	cfg, err := clientcmd.BuildConfigFromFlags("", c.Admin)
	if err != nil {
		c.t.Fatal(err)
	}
	cs, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		c.t.Fatal(err)
	}
	return cs
}

// waitReady waits for the API server's /readyz.
func (c *Cluster) waitReady(limit time.Duration) {
	c.t.Helper()
	cs := c.Client()
	deadline := time.Now().Add(limit)
	var last error
	for time.Now().Before(deadline) {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		body, err := cs.Discovery().RESTClient().Get().AbsPath("/readyz").DoRaw(ctx)
		cancel()
		if err == nil && string(body) == "ok" {
			return
		}
		last = err
		time.Sleep(200 * time.Millisecond)
	}
	c.t.Fatalf("kube-apiserver not ready within %v: %v; its log:\n%s", limit, last, c.logTail("kube-apiserver"))
}

func freePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}

// httpOK is true when url answers 200.
func httpOK(url string) bool {
	cl := http.Client{Timeout: time.Second}
	resp, err := cl.Get(url)
	if err != nil {
		return false
	}
	resp.Body.Close()
	return resp.StatusCode == http.StatusOK
}
