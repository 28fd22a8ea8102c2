package kubetest

import (
	"context"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// TestPodRunsWhereBound: with no scheduler but the test, a pod named for
// scheduler gpuctl waits unbound until bound to a node through the
// binding subresource, and then really runs there (its container started
// by that node's kubelet and containerd); a stopped kubelet makes its
// Node NotReady.
func TestPodRunsWhereBound(t *testing.T) {
	Require(t, true)
	c := Start(t, Options{Nodes: []string{"kn-a", "kn-b"}})
	cs := c.Client()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	pod := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: "sleeper", Namespace: "default"},
		Spec: corev1.PodSpec{
			SchedulerName: "gpuctl",
			HostNetwork:   true,
			Containers:    []corev1.Container{{Name: "c", Image: PauseImage, ImagePullPolicy: corev1.PullNever}},
		},
	}
	if _, err := cs.CoreV1().Pods("default").Create(ctx, pod, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	p, err := cs.CoreV1().Pods("default").Get(ctx, "sleeper", metav1.GetOptions{})
	if err != nil || p.Spec.NodeName != "" || p.Status.Phase != corev1.PodPending {
		t.Fatalf("before binding: node %q phase %s (%v), want unbound and pending", p.Spec.NodeName, p.Status.Phase, err)
	}
	err = cs.CoreV1().Pods("default").Bind(ctx, &corev1.Binding{
		ObjectMeta: metav1.ObjectMeta{Name: "sleeper"},
		Target:     corev1.ObjectReference{Kind: "Node", Name: "kn-b"},
	}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	for {
		p, err = cs.CoreV1().Pods("default").Get(ctx, "sleeper", metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		if p.Status.Phase == corev1.PodRunning {
			break
		}
		if ctx.Err() != nil {
			t.Fatalf("pod not running: %+v\nkubelet:\n%s", p.Status, c.logTail("kubelet-kn-b"))
		}
		time.Sleep(200 * time.Millisecond)
	}
	if p.Spec.NodeName != "kn-b" {
		t.Errorf("pod runs on %q, bound to kn-b", p.Spec.NodeName)
	}
	c.StopKubelet("kn-a")
	c.WaitNodeReady("kn-a", false, 30*time.Second)
}

func TestDevicePluginLast(t *testing.T) {
	for _, tc := range []struct {
		nodes   []string
		dp      string
		want    string
		wantErr bool
	}{
		{[]string{"a", "b", "c"}, "", "a b c", false},
		{[]string{"a", "b", "c"}, "a", "b c a", false},
		{[]string{"a", "b"}, "b", "a b", false},
		{[]string{"a", "b"}, "z", "", true},
	} {
		got, err := devicePluginLast(tc.nodes, tc.dp)
		if tc.wantErr {
			if err == nil || !strings.Contains(err.Error(), tc.dp) {
				t.Errorf("%v with %q: %v, want an error naming it", tc.nodes, tc.dp, err)
			}
			continue
		}
		if err != nil || strings.Join(got, " ") != tc.want {
			t.Errorf("%v with %q: %v %v, want %s", tc.nodes, tc.dp, got, err, tc.want)
		}
	}
}
