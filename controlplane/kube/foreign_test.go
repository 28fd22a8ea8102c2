package kube

import (
	"testing"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/gpuctl/gpuctl/api"
)

func TestForeignJobs(t *testing.T) {
	pod := func(name, node string, phase corev1.PodPhase, gpus int64, ours bool) *corev1.Pod {
		p := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: "ml", Name: name}, Spec: corev1.PodSpec{NodeName: node},
			Status: corev1.PodStatus{Phase: phase}}
		c := corev1.Container{Name: "c"}
		if gpus > 0 {
			c.Resources.Limits = corev1.ResourceList{GPUResource: *resource.NewQuantity(gpus, resource.DecimalSI)}
		}
		p.Spec.Containers = []corev1.Container{c}
		if ours {
			p.Labels = map[string]string{LabelManaged: "gpuctl"}
		}
		return p
	}
	got := ForeignJobs([]*corev1.Pod{
		pod("train", "n1", corev1.PodRunning, 4, false),
		pod("wait", "n2", corev1.PodPending, 1, false),
		pod("unbound", "", corev1.PodPending, 8, false),
		pod("cpu-only", "n1", corev1.PodRunning, 0, false),
		pod("done", "n1", corev1.PodSucceeded, 2, false),
		pod("gpuctls", "n1", corev1.PodRunning, 8, true),
	}, GPUResource)
	if len(got) != 2 {
		t.Fatalf("got %d jobs, want the running and the pending GPU pods: %v", len(got), got)
	}
	run, wait := got[0], got[1]
	if run.GetId() != "k8s-ml.train" || run.GetState() != api.JobState_JOB_STATE_RUNNING || len(run.GetPlacement()[0].GetGpus()) != 4 || run.GetPlacement()[0].GetNode() != "n1" {
		t.Errorf("running pod as %v", run)
	}
	if wait.GetId() != "k8s-ml.wait" || wait.GetState() != api.JobState_JOB_STATE_PENDING || len(wait.GetPlacement()[0].GetGpus()) != 1 {
		t.Errorf("pending pod as %v", wait)
	}
}
