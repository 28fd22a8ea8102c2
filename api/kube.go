package api

import (
	"fmt"
	"strconv"
	"strings"
)

// How a gpuctl launch reaches ranks that Kubernetes starts: each attempt
// is an Indexed Job of one pod per node, in node rank order, every pod
// carrying every node's LaunchRanks (EncodeLaunch's form) in
// KubeLaunchEnv; `nodemon kube-task` in the pod takes the node its
// JOB_COMPLETION_INDEX names and starts that node's ranks, each with
// exactly RankEnv.
const (
	KubeLaunchEnv = "GPUCTL_KUBE_LAUNCH"
	// KubeClusterEnv carries the cluster id RankEnv names.
	KubeClusterEnv = "GPUCTL_KUBE_CLUSTER"
	// KubeIndexEnv is the Indexed Job's completion index, which the Job
	// controller sets in each pod.
	KubeIndexEnv = "JOB_COMPLETION_INDEX"
	// KubePodEnv is the pod's name (the downward API sets it): a rank
	// whose environment holds it runs in a pod of gpuctl's.
	KubePodEnv = "GPUCTL_KUBE_POD"
	// DefaultKubeRunDir holds the pods' rank logs and status files on
	// each node: <dir>/KubeRunName(job, attempt)/rank-R.log and .status.
	DefaultKubeRunDir = "/tmp/gpuctl-kube"
)

// KubeRunName is the directory under the run dir that holds an attempt's
// rank logs and status files on each node.
func KubeRunName(job string, attempt uint32) string {
	name := strings.Map(func(r rune) rune {
		if r == '/' || r == 0 {
			return '_'
		}
		return r
	}, job)
	return fmt.Sprintf("%s-a%d", name, attempt)
}

// NodeAt is the launch of the node index names (its place in rank order).
func NodeAt(parts []NodeLaunch, index string) (NodeLaunch, error) {
	i, err := strconv.Atoi(index)
	if err != nil || i < 0 {
		return NodeLaunch{}, fmt.Errorf("%s=%q is not a node index", KubeIndexEnv, index)
	}
	if i >= len(parts) {
		return NodeLaunch{}, fmt.Errorf("%s=%d: the launch has %d nodes", KubeIndexEnv, i, len(parts))
	}
	return parts[i], nil
}
