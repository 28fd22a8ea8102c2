// Package kube runs gpuctl's attempts on Kubernetes: each attempt is an
// Indexed Job of one pod per node with a headless Service, and gpuctl is
// the pods' scheduler (schedulerName gpuctl): it binds each pod to the
// node its gang placement chose, only once every pod of the attempt
// exists (DecideGang), so placement, priorities and preemption stay
// gpuctl's and Kubernetes runs the pods.
package kube

import (
	"fmt"
	"regexp"
	"strconv"
	"strings"

	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/gpuctl/gpuctl/api"
	"github.com/gpuctl/gpuctl/controlplane/jobs"
)

// Labels and names gpuctl marks its objects with.
const (
	SchedulerName = "gpuctl"
	LabelJob      = "gpuctl.io/job"
	LabelAttempt  = "gpuctl.io/attempt"
	LabelManaged  = "app.kubernetes.io/managed-by"
	// GPUResource is the extended resource NVIDIA's device plugin (and
	// nodemon's) advertises.
	GPUResource = "nvidia.com/gpu"
)

// Spec is how an attempt's pods are made.
type Spec struct {
	Namespace string
	// Image holds nodemon (Task's program) and the job's program.
	Image      string
	PullPolicy corev1.PullPolicy
	// Task is how each pod starts, before -- and the job's command;
	// default nodemon kube-task.
	Task []string
	// HostNetwork runs pods in their node's network, where the ranks'
	// MASTER_ADDR (rank 0's node address) reaches them.
	HostNetwork bool
	// GPUResource is requested per pod, one per GPU its ranks use; ""
	// requests none (nodes without a device plugin).
	GPUResource string
	Cluster     string
	// RunDir is the host directory the pods' rank logs and exit status
	// files go to (nodemon kube-task --run-dir), mounted at the same path
	// so that nodemon --kube-node on the host reads them; default
	// api.DefaultKubeRunDir. A job's checkpoint directory is mounted the
	// same way: on shared storage, the same path on every node.
	RunDir string
}

var (
	notName       = regexp.MustCompile(`[^a-z0-9-]+`)
	notLabelValue = regexp.MustCompile(`[^A-Za-z0-9._-]+`)
)

// ObjectName is an attempt's Job and Service name.
func ObjectName(job string, attempt uint32) string {
	n := strings.Trim(notName.ReplaceAllString(strings.ToLower(job), "-"), "-")
	suffix := fmt.Sprintf("-a%d", attempt)
	// Pod names add the index and a random tail to the Job's: leave room.
	if max := 50 - len("gpuctl-") - len(suffix); len(n) > max {
		n = strings.TrimRight(n[:max], "-")
	}
	return "gpuctl-" + n + suffix
}

// AttemptLabels select an attempt's objects.
func AttemptLabels(job string, attempt uint32) map[string]string {
	return map[string]string{LabelJob: labelValue(job), LabelAttempt: strconv.FormatUint(uint64(attempt), 10), LabelManaged: "gpuctl"}
}

// labelValue fits a job id into a label value (63 characters of
// [A-Za-z0-9._-]); the Job's annotation keeps the id itself.
func labelValue(s string) string {
	v := notLabelValue.ReplaceAllString(s, "_")
	if len(v) > 63 {
		v = v[:63]
	}
	return strings.Trim(v, "._-")
}

// Objects are the Service and Indexed Job of one attempt: index i is the
// attempt's node i, in rank order. Kubernetes must never run a rank again
// behind gpuctl's back: no index is retried (backoffLimitPerIndex 0,
// maxFailedIndexes 0) and any failed or disrupted pod fails the Job.
func Objects(a jobs.AttemptLaunch, s Spec) (*corev1.Service, *batchv1.Job, error) {
	if len(a.Nodes) == 0 {
		return nil, nil, fmt.Errorf("kubernetes: attempt %d of %s has no nodes", a.Attempt, a.Job)
	}
	parts := make([]api.NodeLaunch, 0, len(a.Nodes))
	var command []string
	gpus := make([]int64, len(a.Nodes))
	for i, n := range a.Nodes {
		l := a.Ranks[n]
		if l == nil || len(l.GetRanks()) == 0 {
			return nil, nil, fmt.Errorf("kubernetes: attempt %d of %s: node %s has no ranks", a.Attempt, a.Job, n)
		}
		command = l.GetCommand()
		parts = append(parts, api.NodeLaunch{Node: n, Launch: l})
		seen := map[uint32]bool{}
		for _, r := range l.GetRanks() {
			for _, g := range r.GetGpus() {
				seen[g] = true
			}
		}
		gpus[i] = int64(len(seen))
	}
	if len(command) == 0 {
		return nil, nil, fmt.Errorf("kubernetes: attempt %d of %s has no command", a.Attempt, a.Job)
	}
	for _, g := range gpus[1:] {
		if g != gpus[0] {
			// One pod template: every node's pod asks for the same GPUs.
			return nil, nil, fmt.Errorf("kubernetes: attempt %d of %s uses %v GPUs on its nodes: an Indexed Job's pods all ask for the same number", a.Attempt, a.Job, gpus)
		}
	}
	launch, err := api.EncodeLaunch(parts)
	if err != nil {
		return nil, nil, err
	}
	task := s.Task
	if len(task) == 0 {
		task = []string{"nodemon", "kube-task"}
	}
	runDir := s.RunDir
	if runDir == "" {
		runDir = api.DefaultKubeRunDir
	}
	task = append(append([]string{}, task...), "--run-dir", runDir)
	mounts := []string{runDir}
	if ck := a.Ranks[a.Nodes[0]].GetCheckpointDir(); ck != "" {
		mounts = append(mounts, ck)
	}
	var volumes []corev1.Volume
	var volumeMounts []corev1.VolumeMount
	for i, path := range mounts {
		name := fmt.Sprintf("host-%d", i)
		volumes = append(volumes, corev1.Volume{Name: name, VolumeSource: corev1.VolumeSource{
			HostPath: &corev1.HostPathVolumeSource{Path: path, Type: ptr(corev1.HostPathDirectoryOrCreate)}}})
		volumeMounts = append(volumeMounts, corev1.VolumeMount{Name: name, MountPath: path})
	}
	name := ObjectName(a.Job, a.Attempt)
	labels := AttemptLabels(a.Job, a.Attempt)
	meta := metav1.ObjectMeta{Name: name, Namespace: s.Namespace, Labels: labels,
		Annotations: map[string]string{"gpuctl.io/job-id": a.Job}}
	svc := &corev1.Service{
		ObjectMeta: meta,
		Spec: corev1.ServiceSpec{
			ClusterIP:                corev1.ClusterIPNone,
			Selector:                 labels,
			PublishNotReadyAddresses: true,
		},
	}
	n := int32(len(a.Nodes))
	zero := int32(0)
	container := corev1.Container{
		Name:            "ranks",
		Image:           s.Image,
		ImagePullPolicy: s.PullPolicy,
		Command:         append(append(append([]string{}, task...), "--"), command...),
		Env: []corev1.EnvVar{
			{Name: api.KubeLaunchEnv, Value: launch},
			{Name: api.KubeClusterEnv, Value: s.Cluster},
			{Name: api.KubePodEnv, ValueFrom: &corev1.EnvVarSource{FieldRef: &corev1.ObjectFieldSelector{FieldPath: "metadata.name"}}},
		},
		VolumeMounts: volumeMounts,
	}
	if s.GPUResource != "" && gpus[0] > 0 {
		q := *resource.NewQuantity(gpus[0], resource.DecimalSI)
		container.Resources = corev1.ResourceRequirements{
			Requests: corev1.ResourceList{corev1.ResourceName(s.GPUResource): q},
			Limits:   corev1.ResourceList{corev1.ResourceName(s.GPUResource): q},
		}
	}
	job := &batchv1.Job{
		ObjectMeta: meta,
		Spec: batchv1.JobSpec{
			CompletionMode:       ptr(batchv1.IndexedCompletion),
			Completions:          &n,
			Parallelism:          &n,
			BackoffLimitPerIndex: &zero,
			MaxFailedIndexes:     &zero,
			PodFailurePolicy: &batchv1.PodFailurePolicy{Rules: []batchv1.PodFailurePolicyRule{
				{Action: batchv1.PodFailurePolicyActionFailJob, OnExitCodes: &batchv1.PodFailurePolicyOnExitCodesRequirement{
					Operator: batchv1.PodFailurePolicyOnExitCodesOpNotIn, Values: []int32{0}}},
				{Action: batchv1.PodFailurePolicyActionFailJob, OnPodConditions: []batchv1.PodFailurePolicyOnPodConditionsPattern{
					{Type: corev1.DisruptionTarget, Status: corev1.ConditionTrue}}},
			}},
			Template: corev1.PodTemplateSpec{
				ObjectMeta: metav1.ObjectMeta{Labels: labels},
				Spec: corev1.PodSpec{
					SchedulerName: SchedulerName,
					RestartPolicy: corev1.RestartPolicyNever,
					HostNetwork:   s.HostNetwork,
					Subdomain:     name,
					Containers:    []corev1.Container{container},
					Volumes:       volumes,
					// The ranks need no credentials for the API.
					AutomountServiceAccountToken: ptr(false),
				},
			},
		},
	}
	return svc, job, nil
}

func ptr[T any](v T) *T { return &v }
