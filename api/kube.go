package api

import (
	"fmt"
	"strconv"
)

// How a gpuctl launch reaches ranks that Kubernetes starts: each attempt
// is an Indexed Job of one pod per node, in node rank order, every pod
// carrying every node's LaunchRanks (EncodeSlurmLaunch's form) in
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
)

// NodeAt is the launch of the node index names (its place in rank order).
func NodeAt(parts []SlurmNodeLaunch, index string) (SlurmNodeLaunch, error) {
	i, err := strconv.Atoi(index)
	if err != nil || i < 0 {
		return SlurmNodeLaunch{}, fmt.Errorf("%s=%q is not a node index", KubeIndexEnv, index)
	}
	if i >= len(parts) {
		return SlurmNodeLaunch{}, fmt.Errorf("%s=%d: the launch has %d nodes", KubeIndexEnv, i, len(parts))
	}
	return parts[i], nil
}
