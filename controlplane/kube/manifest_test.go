package kube

import (
	"strings"
	"testing"

	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"

	"github.com/gpuctl/gpuctl/api"
	"github.com/gpuctl/gpuctl/controlplane/jobs"
)

// TestObjects: an attempt is a headless Service and an Indexed Job of one
// pod per node, scheduled by gpuctl, that Kubernetes never retries; the
// launch in the pods decodes to each node's own LaunchRanks by index; the
// run dir and the job's checkpoint directory are the host's own paths.
func TestObjects(t *testing.T) {
	a := jobs.AttemptLaunch{Job: "j-Big_Run.7", Attempt: 2, Nodes: []string{"n2", "n1"}, Ranks: map[string]*api.LaunchRanks{
		"n1": {Job: "j-Big_Run.7", NodeRank: 1, Command: []string{"train", "--x"}, CheckpointDir: "/shared/ck/big", Ranks: []*api.RankSpec{{Rank: 2, Gpus: []uint32{0, 1}}}},
		"n2": {Job: "j-Big_Run.7", NodeRank: 0, Command: []string{"train", "--x"}, CheckpointDir: "/shared/ck/big", Ranks: []*api.RankSpec{{Rank: 0, Gpus: []uint32{0}}, {Rank: 1, Gpus: []uint32{1}}}},
	}}
	svc, job, err := Objects(a, Spec{Namespace: "ml", Image: "img", GPUResource: GPUResource, HostNetwork: true})
	if err != nil {
		t.Fatal(err)
	}
	if job.Name != "gpuctl-j-big-run-7-a2" || svc.Name != job.Name || svc.Spec.ClusterIP != corev1.ClusterIPNone {
		t.Errorf("names %q/%q, cluster IP %q", job.Name, svc.Name, svc.Spec.ClusterIP)
	}
	if job.Labels[LabelJob] != "j-Big_Run.7" || job.Labels[LabelAttempt] != "2" || job.Annotations["gpuctl.io/job-id"] != "j-Big_Run.7" {
		t.Errorf("labels %v annotations %v", job.Labels, job.Annotations)
	}
	s := job.Spec
	if *s.CompletionMode != batchv1.IndexedCompletion || *s.Completions != 2 || *s.Parallelism != 2 || *s.BackoffLimitPerIndex != 0 || *s.MaxFailedIndexes != 0 {
		t.Errorf("job spec %+v", s)
	}
	if len(s.PodFailurePolicy.Rules) != 2 || s.PodFailurePolicy.Rules[0].Action != batchv1.PodFailurePolicyActionFailJob {
		t.Errorf("pod failure policy %+v", s.PodFailurePolicy)
	}
	pod := s.Template.Spec
	if pod.SchedulerName != SchedulerName || pod.RestartPolicy != corev1.RestartPolicyNever || !pod.HostNetwork {
		t.Errorf("pod spec %+v", pod)
	}
	c := pod.Containers[0]
	if strings.Join(c.Command, " ") != "nodemon kube-task --run-dir /tmp/gpuctl-kube -- train --x" {
		t.Errorf("command %q", c.Command)
	}
	var hostPaths []string
	for i, v := range pod.Volumes {
		if v.HostPath == nil || c.VolumeMounts[i].MountPath != v.HostPath.Path || c.VolumeMounts[i].Name != v.Name {
			t.Errorf("volume %d: %+v mounted as %+v, want a host path at its own path", i, v, c.VolumeMounts[i])
			continue
		}
		hostPaths = append(hostPaths, v.HostPath.Path)
	}
	if strings.Join(hostPaths, " ") != "/tmp/gpuctl-kube /shared/ck/big" {
		t.Errorf("host paths %v, want the run dir and the checkpoint dir", hostPaths)
	}
	if e := c.Env[2]; e.Name != api.KubePodEnv || e.ValueFrom == nil || e.ValueFrom.FieldRef.FieldPath != "metadata.name" {
		t.Errorf("env %+v, want the pod's name in %s", e, api.KubePodEnv)
	}
	if q := c.Resources.Limits[GPUResource]; q.Value() != 2 {
		t.Errorf("GPUs per pod %v, want 2", q.String())
	}
	parts, err := api.DecodeLaunch(api.KubeLaunchEnv, c.Env[0].Value)
	if err != nil {
		t.Fatal(err)
	}
	for i, node := range a.Nodes {
		p, err := api.NodeAt(parts, string(rune('0'+i)))
		if err != nil || p.Node != node || p.Launch.GetNodeRank() != int32(i) {
			t.Errorf("index %d: node %q rank %d (%v), want %s", i, p.Node, p.Launch.GetNodeRank(), err, node)
		}
	}
	for _, tc := range []struct {
		name string
		a    jobs.AttemptLaunch
		want string
	}{
		{"no nodes", jobs.AttemptLaunch{Job: "j", Attempt: 1}, "has no nodes"},
		{"a node without ranks", jobs.AttemptLaunch{Job: "j", Attempt: 1, Nodes: []string{"x"}}, "node x has no ranks"},
		{"uneven GPUs", jobs.AttemptLaunch{Job: "j", Attempt: 1, Nodes: []string{"x", "y"}, Ranks: map[string]*api.LaunchRanks{
			"x": {Command: []string{"t"}, Ranks: []*api.RankSpec{{Gpus: []uint32{0}}}},
			"y": {Command: []string{"t"}, Ranks: []*api.RankSpec{{Gpus: []uint32{0, 1}}}},
		}}, "all ask for the same number"},
	} {
		if _, _, err := Objects(tc.a, Spec{}); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: %v, want %q", tc.name, err, tc.want)
		}
	}
}
