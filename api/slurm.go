package api

import (
	"encoding/base64"
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
	// SlurmLogEnv and SlurmStatusEnv name the rank log and the exit status
	// file the task's rank shim writes; nodemon reads them from the task's
	// /proc/PID/environ when it finds the rank.
	SlurmLogEnv    = "GPUCTL_SLURM_LOG"
	SlurmStatusEnv = "GPUCTL_SLURM_STATUS"
	// SlurmMasterEnv, set by the batch script when Slurm chose the nodes,
	// is the address of the first of them: rank 0's, MASTER_ADDR.
	SlurmMasterEnv = "GPUCTL_SLURM_MASTER"
)

// SlurmJobName is the gpuctl job a Slurm job submitted without gpuctl
// (plain sbatch) is listed as.
func SlurmJobName(slurmID string) string { return "slurm-" + slurmID }

// SlurmNodeLaunch is one node's part of a launch; Node is "" when Slurm
// places the job (the task then picks its part by SLURM_NODEID).
type SlurmNodeLaunch struct {
	Node   string
	Launch *LaunchRanks
}

// EncodeSlurmLaunch writes the per-node launches as NODE:BASE64,… .
func EncodeSlurmLaunch(parts []SlurmNodeLaunch) (string, error) {
	out := make([]string, 0, len(parts))
	for _, p := range parts {
		if strings.ContainsAny(p.Node, ":,") {
			return "", fmt.Errorf("slurm launch: node name %q holds ':' or ','", p.Node)
		}
		b, err := proto.Marshal(p.Launch)
		if err != nil {
			return "", fmt.Errorf("slurm launch: %w", err)
		}
		out = append(out, p.Node+":"+base64.RawURLEncoding.EncodeToString(b))
	}
	return strings.Join(out, ","), nil
}

// DecodeSlurmLaunch reads what EncodeSlurmLaunch wrote.
func DecodeSlurmLaunch(s string) ([]SlurmNodeLaunch, error) {
	if s == "" {
		return nil, fmt.Errorf("%s is empty: the job was not submitted by gpuctl serve --executor slurm", SlurmLaunchEnv)
	}
	var parts []SlurmNodeLaunch
	for i, item := range strings.Split(s, ",") {
		node, enc, ok := strings.Cut(item, ":")
		if !ok {
			return nil, fmt.Errorf("%s part %d: want NODE:BASE64", SlurmLaunchEnv, i)
		}
		b, err := DecodeBase64URL(enc)
		if err != nil {
			return nil, fmt.Errorf("%s part %d: %w", SlurmLaunchEnv, i, err)
		}
		l := &LaunchRanks{}
		if err := proto.Unmarshal(b, l); err != nil {
			return nil, fmt.Errorf("%s part %d: %w", SlurmLaunchEnv, i, err)
		}
		parts = append(parts, SlurmNodeLaunch{Node: node, Launch: l})
	}
	return parts, nil
}

// SlurmTask picks one srun'd task's launch and rank: by its Slurm node
// name when the launch names nodes, else by its node index, and by its
// local task id on the node.
// master, when set, is the address of Slurm's first node (SlurmMasterEnv),
// rank 0's when Slurm chose the nodes.
func SlurmTask(parts []SlurmNodeLaunch, slurmNode, nodeID, localID, master string) (*LaunchRanks, *RankSpec, error) {
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

func slurmNodes(parts []SlurmNodeLaunch) string {
	var ns []string
	for _, p := range parts {
		ns = append(ns, p.Node)
	}
	return strings.Join(ns, ",")
}
