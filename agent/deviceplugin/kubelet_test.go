package deviceplugin_test

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/gpuctl/gpuctl/agent/deviceplugin"
	"github.com/gpuctl/gpuctl/api"
	"github.com/gpuctl/gpuctl/client"
	"github.com/gpuctl/gpuctl/controlplane"
	"github.com/gpuctl/gpuctl/internal/kubetest"
	"github.com/gpuctl/gpuctl/internal/servertest"
	"github.com/gpuctl/gpuctl/internal/testbin"
)

// TestKubeletDevicePlugin runs nodemon (a real process, simulated DGX
// H100) with --device-plugin-dir against a real kubelet: the Node offers
// its 8 GPUs as nvidia.com/gpu, a pod asking for 2 runs with two of the
// node's GPU UUIDs in NVIDIA_VISIBLE_DEVICES, a GPU gpuctl injects XID 79
// into leaves the allocatable count, and after the kubelet restarts
// nodemon is registered with it again (a second fault reaches it). The
// other node's kubelet, started first, offers no GPUs.
func TestKubeletDevicePlugin(t *testing.T) {
	kubetest.Require(t, true)
	dir := t.TempDir()
	const gpuNode, otherNode = "kn-gpu", "kn-cpu"
	c := kubetest.Start(t, kubetest.Options{Nodes: []string{gpuNode, otherNode}, DevicePluginNode: gpuNode})
	cs := c.Client()

	srvDir := filepath.Join(dir, "server")
	s := servertest.Start(t, controlplane.Config{DataDir: srvDir})
	token, err := s.CreateJoinToken(time.Hour, 1, "device plugin test")
	if err != nil {
		t.Fatal(err)
	}
	tokenFile := filepath.Join(dir, "token")
	if err := os.WriteFile(tokenFile, []byte(token), 0o600); err != nil {
		t.Fatal(err)
	}
	nodemonLog := filepath.Join(dir, "nodemon.log")
	t.Cleanup(func() {
		if t.Failed() {
			log, _ := os.ReadFile(nodemonLog)
			t.Logf("nodemon's log:\n%s", log)
		}
	})
	startNodemon(t, "--server", s.Addr().String(), "--token-file", tokenFile, "--name", gpuNode,
		"--data-dir", filepath.Join(dir, "nodemon"), "--sim", "dgx-h100", "--ebpf", "off", "--cgroup-root", "off",
		"--peer-listen", "off", "--log-file", nodemonLog, "--device-plugin-dir", kubetest.DevicePluginDir)

	gpu := corev1.ResourceName(deviceplugin.ResourceName)
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	c.WaitAllocatable(gpuNode, gpu, 8, 90*time.Second)
	if n := allocatable(ctx, t, cs, otherNode); n != 0 {
		t.Errorf("node %s offers %d GPUs; only %s's kubelet has the device plugin", otherNode, n, gpuNode)
	}

	var uuids []string
	for _, n := range s.Nodes() {
		if n.GetRegistration().GetName() == gpuNode {
			for _, g := range n.GetRegistration().GetGpus() {
				uuids = append(uuids, g.GetUuid())
			}
		}
	}
	if len(uuids) != 8 {
		t.Fatalf("gpuctl lists %d GPUs on %s, want 8", len(uuids), gpuNode)
	}

	// A pod asking for two GPUs, bound to the node, sees two of them.
	marker := fmt.Sprintf("dp-%d", time.Now().UnixNano())
	pod := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: "two-gpus", Namespace: "default"},
		Spec: corev1.PodSpec{
			NodeName:    gpuNode,
			HostNetwork: true,
			Containers: []corev1.Container{{
				Name: "c", Image: kubetest.PauseImage, ImagePullPolicy: corev1.PullNever,
				Env: []corev1.EnvVar{{Name: "GPUCTL_TEST_POD", Value: marker}},
				Resources: corev1.ResourceRequirements{Limits: corev1.ResourceList{
					deviceplugin.ResourceName: resource.MustParse("2"),
				}},
			}},
		},
	}
	if _, err := cs.CoreV1().Pods("default").Create(ctx, pod, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	waitRunning(ctx, t, cs, "two-gpus", gpuNode)
	env := processEnv(ctx, t, "GPUCTL_TEST_POD="+marker)
	visible := strings.Split(env[deviceplugin.VisibleDevicesEnv], ",")
	if len(visible) != 2 || visible[0] == visible[1] || !slices.Contains(uuids, visible[0]) || !slices.Contains(uuids, visible[1]) {
		t.Fatalf("the pod's %s=%q, want two of %s's GPUs %v", deviceplugin.VisibleDevicesEnv, env[deviceplugin.VisibleDevicesEnv], gpuNode, uuids)
	}
	if env[deviceplugin.CUDAVisibleDevicesEnv] != env[deviceplugin.VisibleDevicesEnv] {
		t.Errorf("the pod's %s=%q, want %q", deviceplugin.CUDAVisibleDevicesEnv, env[deviceplugin.CUDAVisibleDevicesEnv], env[deviceplugin.VisibleDevicesEnv])
	}

	admin, err := client.Dial(ctx, controlplane.AdminConfigPath(srvDir))
	if err != nil {
		t.Fatal(err)
	}
	defer admin.Close()
	if err := admin.InjectFault(ctx, gpuNode, &api.InjectFault{GpuIndex: 7, Kind: api.FaultKind_FAULT_KIND_XID79}); err != nil {
		t.Fatal(err)
	}
	c.WaitAllocatable(gpuNode, gpu, 7, 90*time.Second)

	// The restarted kubelet wipes the plugin's socket: nodemon serves and
	// registers again, and the next fault reaches the new kubelet.
	c.RestartKubelet(gpuNode)
	waitLog(ctx, t, nodemonLog, "registered with the kubelet", 2)
	if err := admin.InjectFault(ctx, gpuNode, &api.InjectFault{GpuIndex: 6, Kind: api.FaultKind_FAULT_KIND_XID79}); err != nil {
		t.Fatal(err)
	}
	c.WaitAllocatable(gpuNode, gpu, 6, 90*time.Second)
}

// startNodemon runs nodemon with args until the test ends.
func startNodemon(t *testing.T, args ...string) {
	t.Helper()
	cmd := exec.Command(testbin.Nodemon(t), args...)
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	t.Cleanup(func() {
		cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-done:
		case <-time.After(15 * time.Second):
			syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
			<-done
		}
		if t.Failed() && out.Len() > 0 {
			t.Logf("nodemon's output:\n%s", out.String())
		}
	})
}

// allocatable is the node's allocatable nvidia.com/gpu.
func allocatable(ctx context.Context, t *testing.T, cs kubernetes.Interface, node string) int64 {
	t.Helper()
	n, err := cs.CoreV1().Nodes().Get(ctx, node, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	q := n.Status.Allocatable[corev1.ResourceName(deviceplugin.ResourceName)]
	return q.Value()
}

// waitRunning waits for the pod to run on node.
func waitRunning(ctx context.Context, t *testing.T, cs kubernetes.Interface, name, node string) {
	t.Helper()
	deadline := time.Now().Add(90 * time.Second)
	var p *corev1.Pod
	var err error
	for time.Now().Before(deadline) {
		p, err = cs.CoreV1().Pods("default").Get(ctx, name, metav1.GetOptions{})
		if err == nil && p.Status.Phase == corev1.PodRunning {
			return
		}
		time.Sleep(250 * time.Millisecond)
	}
	t.Fatalf("pod %s not running on %s after 90 s: %v %+v", name, node, err, p.Status)
}

// processEnv finds the process whose environment holds marker and returns
// its environment: the pod's container is a process of this host.
func processEnv(ctx context.Context, t *testing.T, marker string) map[string]string {
	t.Helper()
	for ctx.Err() == nil {
		dirs, _ := filepath.Glob("/proc/[0-9]*/environ")
		for _, d := range dirs {
			data, err := os.ReadFile(d)
			if err != nil || !bytes.Contains(data, []byte(marker)) {
				continue
			}
			env := map[string]string{}
			for _, kv := range strings.Split(string(data), "\x00") {
				if k, v, ok := strings.Cut(kv, "="); ok {
					env[k] = v
				}
			}
			if env["GPUCTL_TEST_POD"] == strings.TrimPrefix(marker, "GPUCTL_TEST_POD=") {
				return env
			}
		}
		time.Sleep(250 * time.Millisecond)
	}
	t.Fatalf("no process with %s", marker)
	return nil
}

// waitLog waits for text to appear n times in the log at path.
func waitLog(ctx context.Context, t *testing.T, path, text string, n int) {
	t.Helper()
	deadline := time.Now().Add(60 * time.Second)
	for time.Now().Before(deadline) {
		data, _ := os.ReadFile(path)
		if bytes.Count(data, []byte(text)) >= n {
			return
		}
		time.Sleep(250 * time.Millisecond)
	}
	data, _ := os.ReadFile(path)
	t.Fatalf("%q not %d times in %s after 60 s:\n%s", text, n, path, data)
}
