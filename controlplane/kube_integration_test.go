package controlplane_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/gpuctl/gpuctl/api"
	"github.com/gpuctl/gpuctl/controlplane"
	"github.com/gpuctl/gpuctl/controlplane/kube"
	"github.com/gpuctl/gpuctl/controlplane/nodes"
	"github.com/gpuctl/gpuctl/internal/kubetest"
	"github.com/gpuctl/gpuctl/internal/servertest"
	"github.com/gpuctl/gpuctl/internal/simnodes"
)

// TestKubeNodeStatesFollowEachOther: a real gpuctl server
// (--executor kubernetes) whose nodemons are the nodes of a real
// Kubernetes. A gpuctl cordon cordons the Node with
// gpuctl's reason and an uncordon lifts it; a Node cordoned in Kubernetes
// is cordoned in gpuctl until uncordoned there, and one tainted NoSchedule
// until the taint is lifted; a Node's topology.gpuctl.io/rack label is the
// node's rack in gpuctl; a pod gpuctl did not
// create that holds GPUs is listed as a job on its node's GPUs, and goes
// when the pod does; a stopped kubelet's Node goes NotReady and gpuctl
// cordons it saying so.
func TestKubeNodeStatesFollowEachOther(t *testing.T) {
	kubetest.Require(t, true)
	c := kubetest.Start(t, kubetest.Options{Nodes: []string{"kn-1", "kn-2"}})
	cs := c.Client()
	dir := t.TempDir()
	srv := servertest.Start(t, controlplane.Config{DataDir: dir + "/server", Executor: "kubernetes",
		Kube: kube.Options{Client: cs, Spec: kube.Spec{Namespace: "default", Image: "localhost/gpuctl/ranks:1"}}})
	simnodes.Join(t, srv, dir, "kn-1", "kn-2")

	gpuctlCordon := func(node string) (bool, string) {
		for _, n := range srv.Nodes() {
			if n.GetRegistration().GetName() == node {
				return n.GetCordoned(), n.GetCordonReason()
			}
		}
		return false, "no such node"
	}
	nodeCordon := func(node string) (bool, string) {
		n, err := cs.CoreV1().Nodes().Get(context.Background(), node, metav1.GetOptions{})
		if err != nil {
			return false, err.Error()
		}
		return n.Spec.Unschedulable, n.Annotations[kube.CordonAnnotation]
	}

	if err := srv.Cordon("kn-1", "flaky NIC"); err != nil {
		t.Fatal(err)
	}
	waitKube(t, 10*time.Second, "gpuctl's cordon reaches the Node", func() (bool, string) {
		on, why := nodeCordon("kn-1")
		return on && why == "flaky NIC", fmt.Sprint(on, why)
	})
	if _, err := srv.SetCordon("kn-1", nodes.ActionUncordon, ""); err != nil {
		t.Fatal(err)
	}
	waitKube(t, 10*time.Second, "gpuctl's uncordon lifts its Node cordon", func() (bool, string) {
		on, why := nodeCordon("kn-1")
		return !on && why == "", fmt.Sprint(on, why)
	})

	patch := func(unschedulable bool) {
		p := fmt.Sprintf(`{"spec":{"unschedulable":%v}}`, unschedulable)
		if _, err := cs.CoreV1().Nodes().Patch(context.Background(), "kn-2", types.StrategicMergePatchType, []byte(p), metav1.PatchOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	patch(true)
	waitKube(t, 10*time.Second, "a Kubernetes cordon reaches gpuctl", func() (bool, string) {
		on, why := gpuctlCordon("kn-2")
		return on && why == "Kubernetes: kn-2 is cordoned", fmt.Sprint(on, why)
	})
	patch(false)
	waitKube(t, 10*time.Second, "a Kubernetes uncordon reaches gpuctl", func() (bool, string) {
		on, why := gpuctlCordon("kn-2")
		return !on, fmt.Sprint(on, why)
	})
	taint := func(taints string) {
		p := fmt.Sprintf(`{"spec":{"taints":%s}}`, taints)
		if _, err := cs.CoreV1().Nodes().Patch(context.Background(), "kn-2", types.MergePatchType, []byte(p), metav1.PatchOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	// The Node's topology labels become gpuctl's.
	if _, err := cs.CoreV1().Nodes().Patch(context.Background(), "kn-1", types.MergePatchType,
		[]byte(`{"metadata":{"labels":{"`+kube.TopologyLabel+`rack":"r7"}}}`), metav1.PatchOptions{}); err != nil {
		t.Fatal(err)
	}
	waitKube(t, 10*time.Second, "a Node's topology label reaches gpuctl", func() (bool, string) {
		for _, n := range srv.Nodes() {
			if n.GetRegistration().GetName() == "kn-1" {
				return n.GetRegistration().GetLabels()["rack"] == "r7", fmt.Sprint(n.GetRegistration().GetLabels())
			}
		}
		return false, "no kn-1"
	})
	taint(`[{"key":"gpu","value":"broken","effect":"NoSchedule"}]`)
	waitKube(t, 10*time.Second, "a Kubernetes taint reaches gpuctl", func() (bool, string) {
		on, why := gpuctlCordon("kn-2")
		return on && why == "Kubernetes: kn-2 is tainted gpu=broken:NoSchedule", fmt.Sprint(on, why)
	})
	taint(`null`)
	waitKube(t, 10*time.Second, "a lifted taint reaches gpuctl", func() (bool, string) {
		on, why := gpuctlCordon("kn-2")
		return !on, fmt.Sprint(on, why)
	})

	// kn-2 advertises GPUs as a device plugin would make its kubelet do.
	capacity := `{"status":{"capacity":{"nvidia.com/gpu":"8"}}}`
	if _, err := cs.CoreV1().Nodes().Patch(context.Background(), "kn-2", types.StrategicMergePatchType, []byte(capacity), metav1.PatchOptions{}, "status"); err != nil {
		t.Fatal(err)
	}
	two := *resource.NewQuantity(2, resource.DecimalSI)
	foreign := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "notebook", Namespace: "default"}, Spec: corev1.PodSpec{
		NodeName: "kn-2", HostNetwork: true,
		Containers: []corev1.Container{{Name: "c", Image: kubetest.PauseImage, ImagePullPolicy: corev1.PullNever,
			Resources: corev1.ResourceRequirements{Limits: corev1.ResourceList{kube.GPUResource: two}}}}}}
	if _, err := cs.CoreV1().Pods("default").Create(context.Background(), foreign, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	listed := func() (*api.Job, string) {
		for _, j := range srv.Jobs() {
			if j.GetId() == "k8s-default.notebook" {
				return j, fmt.Sprint(j.GetState(), j.GetPlacement())
			}
		}
		return nil, "not listed"
	}
	waitKube(t, 30*time.Second, "a foreign GPU pod is listed with its GPUs", func() (bool, string) {
		j, state := listed()
		return j != nil && j.GetState() == api.JobState_JOB_STATE_RUNNING && len(j.GetPlacement()) == 1 &&
			j.GetPlacement()[0].GetNode() == "kn-2" && len(j.GetPlacement()[0].GetGpus()) == 2, state
	})
	zero := int64(0)
	if err := cs.CoreV1().Pods("default").Delete(context.Background(), "notebook", metav1.DeleteOptions{GracePeriodSeconds: &zero}); err != nil {
		t.Fatal(err)
	}
	waitKube(t, 30*time.Second, "a deleted foreign pod is no longer listed", func() (bool, string) {
		j, state := listed()
		return j == nil, state
	})

	start := time.Now()
	c.StopKubelet("kn-1")
	waitKube(t, 60*time.Second, "a NotReady Node is cordoned in gpuctl", func() (bool, string) {
		on, why := gpuctlCordon("kn-1")
		return on && strings.HasPrefix(why, "Kubernetes: kn-1 is NotReady"), fmt.Sprint(on, why)
	})
	t.Logf("kubelet stopped → gpuctl cordon: %v", time.Since(start))
	if on, why := nodeCordon("kn-1"); on {
		t.Errorf("gpuctl echoed Kubernetes' NotReady back as a Node cordon (%q)", why)
	}
}

// waitKube polls cond until it holds or limit passes, then fails with the
// state it last saw.
func waitKube(t *testing.T, limit time.Duration, what string, cond func() (bool, string)) {
	t.Helper()
	poll(t, limit, what, func() error {
		if ok, state := cond(); !ok {
			return errors.New(state)
		}
		return nil
	})
}
