package main

import (
	"context"
	"os"
	"path/filepath"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/gpuctl/gpuctl/agent/deviceplugin"
	"github.com/gpuctl/gpuctl/controlplane"
	"github.com/gpuctl/gpuctl/internal/kubetest"
	"github.com/gpuctl/gpuctl/internal/servertest"
	"github.com/gpuctl/gpuctl/internal/testbin"
)

const nodemonImage = "localhost/gpuctl/nodemon:1"

// TestDaemonSetRunsOnKubelet applies the DaemonSet manifest to a real
// cluster, with a nodemon image built here and, as a simulated host
// needs, --sim and a data directory of the test's own: its pod (bound by
// the test, as the cluster runs no scheduler) becomes Ready, joins
// gpuctl with the Secret's token, and the kubelet offers the node's 8
// GPUs through the device plugin the pod serves.
func TestDaemonSetRunsOnKubelet(t *testing.T) {
	kubetest.Require(t, true)
	dir := t.TempDir()
	bin := testbin.Nodemon(t)
	files := kubetest.Libraries(t, bin)
	files["/usr/bin/nodemon"] = bin
	archive := kubetest.Image(t, dir, nodemonImage, files, []string{"/usr/bin/nodemon"})
	const node = "kn-gpu"
	c := kubetest.Start(t, kubetest.Options{Nodes: []string{node}, Images: []string{archive}, DevicePluginNode: node})
	cs := c.Client()
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()

	s := servertest.Start(t, controlplane.Config{DataDir: filepath.Join(dir, "server")})
	token, err := s.CreateJoinToken(time.Hour, 10, "daemonset test")
	if err != nil {
		t.Fatal(err)
	}
	ds := readDaemonSet(t)
	ns := ds.Namespace
	if _, err := cs.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	secret := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: "nodemon-join", Namespace: ns},
		StringData: map[string]string{"server": s.Addr().String(), "token": token}}
	if _, err := cs.CoreV1().Secrets(ns).Create(ctx, secret, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	n, err := cs.CoreV1().Nodes().Get(ctx, node, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	for k, v := range ds.Spec.Template.Spec.NodeSelector {
		n.Labels[k] = v
	}
	if _, err := cs.CoreV1().Nodes().Update(ctx, n, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}

	// What differs on this host: the image, simulated GPUs, no eBPF or
	// cgroups, a free metrics port, and the test's data directory in
	// place of the host's /var/lib/nodemon.
	pod := &ds.Spec.Template.Spec
	ctr := &pod.Containers[0]
	ctr.Image, ctr.ImagePullPolicy = nodemonImage, corev1.PullNever
	ctr.Args = append(ctr.Args, "--sim=dgx-h100", "--ebpf=off", "--cgroup-root=off", "--peer-listen=off", "--metrics-addr=127.0.0.1:0")
	data := filepath.Join(dir, "nodemon-data")
	for i, v := range pod.Volumes {
		if v.Name == "data" {
			pod.Volumes[i].HostPath.Path = data
		}
	}
	if _, err := cs.AppsV1().DaemonSets(ns).Create(ctx, ds, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}

	var p *corev1.Pod
	for p == nil {
		pods, err := cs.CoreV1().Pods(ns).List(ctx, metav1.ListOptions{LabelSelector: "app.kubernetes.io/name=nodemon"})
		if err != nil {
			t.Fatalf("the DaemonSet's pod: %v", err)
		}
		if len(pods.Items) > 0 {
			p = &pods.Items[0]
			break
		}
		time.Sleep(200 * time.Millisecond)
	}
	if err := cs.CoreV1().Pods(ns).Bind(ctx, &corev1.Binding{ObjectMeta: metav1.ObjectMeta{Name: p.Name, Namespace: ns},
		Target: corev1.ObjectReference{Kind: "Node", Name: node}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	for !podReady(p) {
		if ctx.Err() != nil {
			t.Fatalf("the DaemonSet's pod %s is not Ready: %+v\nthe kubelet's log is under the cluster's directory", p.Name, p.Status)
		}
		time.Sleep(250 * time.Millisecond)
		if p, err = cs.CoreV1().Pods(ns).Get(ctx, p.Name, metav1.GetOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	c.WaitAllocatable(node, deviceplugin.ResourceName, 8, 60*time.Second)
	if _, err := os.Stat(filepath.Join(data, "identity")); err != nil {
		t.Errorf("the pod's nodemon kept no identity in its hostPath data directory: %v", err)
	}
	joined := false
	for _, n := range s.Nodes() {
		joined = joined || n.GetRegistration().GetName() == node
	}
	if !joined {
		t.Errorf("gpuctl lists no node %s: the pod's nodemon did not join with the Secret's token", node)
	}
}

func podReady(p *corev1.Pod) bool {
	for _, c := range p.Status.Conditions {
		if c.Type == corev1.PodReady {
			return c.Status == corev1.ConditionTrue
		}
	}
	return false
}
