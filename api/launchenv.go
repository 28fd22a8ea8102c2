package api

import (
	"encoding/base64"
	"fmt"
	"strings"

	"google.golang.org/protobuf/proto"
)

// How a launch reaches ranks another system starts (Slurm's srun,
// Kubernetes' pods): every node's LaunchRanks, in rank order, in one
// environment variable of the job (SlurmLaunchEnv, KubeLaunchEnv), from
// which the task on each node takes its own part.

// RankLogEnv and RankStatusEnv name the rank log and the exit status file
// a task's rank shim writes; nodemon reads them from the rank's
// /proc/PID/environ when it finds the rank.
const (
	RankLogEnv    = "GPUCTL_RANK_LOG"
	RankStatusEnv = "GPUCTL_RANK_STATUS"
)

// NodeLaunch is one node's part of a launch; Node is "" when Slurm
// places the job (the task then picks its part by SLURM_NODEID).
type NodeLaunch struct {
	Node   string
	Launch *LaunchRanks
}

// EncodeLaunch writes the per-node launches as NODE:BASE64,… .
func EncodeLaunch(parts []NodeLaunch) (string, error) {
	out := make([]string, 0, len(parts))
	for _, p := range parts {
		if strings.ContainsAny(p.Node, ":,") {
			return "", fmt.Errorf("launch: node name %q holds ':' or ','", p.Node)
		}
		b, err := proto.Marshal(p.Launch)
		if err != nil {
			return "", fmt.Errorf("launch: %w", err)
		}
		out = append(out, p.Node+":"+base64.RawURLEncoding.EncodeToString(b))
	}
	return strings.Join(out, ","), nil
}

// DecodeLaunch reads what EncodeLaunch wrote into the variable env.
func DecodeLaunch(env, s string) ([]NodeLaunch, error) {
	if s == "" {
		return nil, fmt.Errorf("%s is empty: the job was not submitted by gpuctl serve", env)
	}
	var parts []NodeLaunch
	for i, item := range strings.Split(s, ",") {
		node, enc, ok := strings.Cut(item, ":")
		if !ok {
			return nil, fmt.Errorf("%s part %d: want NODE:BASE64", env, i)
		}
		b, err := DecodeBase64URL(enc)
		if err != nil {
			return nil, fmt.Errorf("%s part %d: %w", env, i, err)
		}
		l := &LaunchRanks{}
		if err := proto.Unmarshal(b, l); err != nil {
			return nil, fmt.Errorf("%s part %d: %w", env, i, err)
		}
		parts = append(parts, NodeLaunch{Node: node, Launch: l})
	}
	return parts, nil
}
