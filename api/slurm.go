package api

import (
	"fmt"
	"strconv"
	"strings"

	"google.golang.org/protobuf/proto"
)

// How a gpuctl launch reaches ranks that Slurm starts: the server puts
// every node's LaunchRanks, in rank order, into the job's environment
// (SlurmLaunchEnv), and `nodemon slurm-task` in each srun'd task picks its
// own by SLURMD_NODENAME (or SLURM_NODEID, when Slurm chose the nodes) and
// SLURM_LOCALID, then gives the rank exactly RankEnv.
const (
	SlurmLaunchEnv = "GPUCTL_SLURM_LAUNCH"
	// SlurmClusterEnv carries the cluster id RankEnv names.
	SlurmClusterEnv = "GPUCTL_SLURM_CLUSTER"
	// SlurmMasterEnv, set by the batch script when Slurm chose the nodes,
	// is the address of the first of them: rank 0's, MASTER_ADDR.
	SlurmMasterEnv = "GPUCTL_SLURM_MASTER"
)

// SlurmJobName is the gpuctl job a Slurm job submitted without gpuctl
// (plain sbatch) is listed as.
func SlurmJobName(slurmID string) string { return "slurm-" + slurmID }

// SlurmTask picks one srun'd task's launch and rank: by its Slurm node
// name when the launch names nodes, else by its node index, and by its
// local task id on the node.
// master, when set, is the address of Slurm's first node (SlurmMasterEnv),
// rank 0's when Slurm chose the nodes.
func SlurmTask(parts []NodeLaunch, slurmNode, nodeID, localID, master string) (*LaunchRanks, *RankSpec, error) {
	var l *LaunchRanks
	for _, p := range parts {
		if p.Node != "" && p.Node == slurmNode {
			l = p.Launch
		}
	}
	if l == nil {
		i, err := strconv.Atoi(nodeID)
		if err != nil || i < 0 || i >= len(parts) || parts[i].Node != "" {
			return nil, nil, fmt.Errorf("slurm task on node %q (SLURM_NODEID %q) has no part in the launch (nodes %s): was the job's --nodelist changed?",
				slurmNode, nodeID, slurmNodes(parts))
		}
		l = parts[i].Launch
		if master != "" {
			l = proto.Clone(l).(*LaunchRanks)
			l.MasterAddr = master
		}
	}
	li, err := strconv.Atoi(localID)
	if err != nil || li < 0 || li >= len(l.GetRanks()) {
		return nil, nil, fmt.Errorf("slurm task %q on node %q: the launch has %d ranks there (--ntasks-per-node must match)", localID, slurmNode, len(l.GetRanks()))
	}
	return l, l.GetRanks()[li], nil
}

func slurmNodes(parts []NodeLaunch) string {
	var ns []string
	for _, p := range parts {
		ns = append(ns, p.Node)
	}
	return strings.Join(ns, ",")
}
