package kube

import (
	"context"
	"path/filepath"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/gpuctl/gpuctl/internal/kubetest"
	"github.com/gpuctl/gpuctl/internal/testbin"
)

// TestRBACIsEnough: acting as the service account of
// deploy/kubernetes/rbac.yaml, the executor creates an attempt, binds its
// gang, cordons a Node and removes the attempt; the same account may not
// delete a Node, read Secrets, create pods of its own or delete another
// namespace's.
func TestRBACIsEnough(t *testing.T) {
	kubetest.Require(t, true)
	c := kubetest.Start(t, kubetest.Options{Nodes: []string{"kn-1"}})
	c.Apply(filepath.Join(testbin.Root(t), "deploy", "kubernetes", "rbac.yaml"))
	cs, err := kubernetes.NewForConfig(c.ServiceAccount("gpuctl", "gpuctl"))
	if err != nil {
		t.Fatal(err)
	}
	x := New(Config{Client: cs, StopGrace: time.Second,
		Spec: Spec{Namespace: "gpuctl", Image: kubetest.PauseImage, PullPolicy: corev1.PullNever, HostNetwork: true}})
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- x.Run(ctx) }()
	t.Cleanup(func() { cancel(); <-done })

	a := ringLaunch(t, "j-rbac", 1, []string{"kn-1"})
	lctx, lcancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer lcancel()
	if errs := x.Launch(lctx, a); errs != nil {
		t.Fatalf("launch as the service account: %v", errs)
	}
	if err := x.cordonNode(lctx, "kn-1", true, "rbac test"); err != nil {
		t.Errorf("cordon a Node as the service account: %v", err)
	}
	if errs := x.Signal(lctx, a.Job, a.Attempt, a.Nodes, "SIGKILL"); errs != nil {
		t.Errorf("remove the attempt as the service account: %v", errs)
	}
	for what, err := range map[string]error{
		"delete a Node":         cs.CoreV1().Nodes().Delete(lctx, "kn-1", metav1.DeleteOptions{}),
		"list Secrets":          listErr(cs.CoreV1().Secrets("gpuctl").List(lctx, metav1.ListOptions{})),
		"delete default's pods": cs.CoreV1().Pods("default").DeleteCollection(lctx, metav1.DeleteOptions{}, metav1.ListOptions{}),
		"create a pod of its own": createErr(cs.CoreV1().Pods("gpuctl").Create(lctx, &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "own"},
			Spec: corev1.PodSpec{Containers: []corev1.Container{{Name: "c", Image: kubetest.PauseImage}}}}, metav1.CreateOptions{})),
	} {
		if !apierrors.IsForbidden(err) {
			t.Errorf("%s as the service account: %v, want forbidden", what, err)
		}
	}
	if err := x.cordonNode(lctx, "kn-1", false, ""); err != nil {
		t.Errorf("uncordon a Node as the service account: %v", err)
	}
}

func listErr[T any](_ T, err error) error   { return err }
func createErr[T any](_ T, err error) error { return err }
