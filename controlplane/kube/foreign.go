package kube

import (
	"fmt"
	"slices"
	"strings"

	corev1 "k8s.io/api/core/v1"

	"github.com/gpuctl/gpuctl/api"
)

// ForeignJobName is the gpuctl job a pod gpuctl did not create is listed
// as.
func ForeignJobName(namespace, pod string) string { return "k8s-" + namespace + "." + pod }

// ForeignJobs lists the pods gpuctl did not create that hold GPUs (bound,
// not ended, asking for resource) as jobs: gpuctl's scheduler counts their
// GPUs busy, and the console lists them, as it does Slurm jobs submitted
// without gpuctl. Kubernetes' device plugin, not the API, knows which of
// a node's GPUs a pod got, so a pod asking for n is shown on GPUs 0…n-1:
// the count is what placement needs.
func ForeignJobs(pods []*corev1.Pod, resource string) []*api.Job {
	var out []*api.Job
	for _, p := range pods {
		if p.Labels[LabelManaged] == "gpuctl" || p.Spec.NodeName == "" ||
			p.Status.Phase == corev1.PodSucceeded || p.Status.Phase == corev1.PodFailed {
			continue
		}
		var gpus int64
		for _, c := range append(slices.Clone(p.Spec.InitContainers), p.Spec.Containers...) {
			if q, ok := c.Resources.Limits[corev1.ResourceName(resource)]; ok {
				gpus = max(gpus, q.Value())
			} else if q, ok := c.Resources.Requests[corev1.ResourceName(resource)]; ok {
				gpus = max(gpus, q.Value())
			}
		}
		if gpus == 0 {
			continue
		}
		jn := &api.JobNode{Node: p.Spec.NodeName}
		for i := range gpus {
			jn.Gpus = append(jn.Gpus, uint32(i))
		}
		j := &api.Job{Id: ForeignJobName(p.Namespace, p.Name), Name: p.Name, Attempt: 1, Placement: []*api.JobNode{jn},
			Reason: fmt.Sprintf("Kubernetes pod %s/%s (%s), created without gpuctl: its %d GPUs are counted busy; not scheduled or recovered by gpuctl",
				p.Namespace, p.Name, strings.ToLower(string(p.Status.Phase)), gpus)}
		j.State = api.JobState_JOB_STATE_RUNNING
		if p.Status.Phase == corev1.PodPending {
			j.State, j.PendingReason = api.JobState_JOB_STATE_PENDING, "Kubernetes: pod pending on "+p.Spec.NodeName
		}
		out = append(out, j)
	}
	slices.SortFunc(out, func(a, b *api.Job) int { return strings.Compare(a.GetId(), b.GetId()) })
	return out
}
