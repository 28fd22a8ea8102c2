package api

import (
	"sort"
	"strconv"
	"strings"
)

// RankEnv is the environment gpuctl gives one rank of a launch, after the
// host's: the job's own variables (sorted), then the variables that place
// the rank in its gang in the torchrun convention (RANK, LOCAL_RANK,
// WORLD_SIZE, LOCAL_WORLD_SIZE, NODE_RANK, MASTER_ADDR, MASTER_PORT,
// CUDA_VISIBLE_DEVICES) and gpuctl's own (GPUCTL_JOB, GPUCTL_NODE,
// GPUCTL_CLUSTER when known, GPUCTL_ATTEMPT, GPUCTL_CHECKPOINT_DIR,
// GPUCTL_RESUME_STEP). It is the one definition of that environment:
// nodemon sets exactly this.
func RankEnv(node, cluster string, l *LaunchRanks, r *RankSpec) []string {
	gpus := make([]string, len(r.GetGpus()))
	for i, g := range r.GetGpus() {
		gpus[i] = strconv.Itoa(int(g))
	}
	keys := make([]string, 0, len(l.GetEnv()))
	for k := range l.GetEnv() {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	env := make([]string, 0, len(keys)+13)
	for _, k := range keys {
		env = append(env, k+"="+l.GetEnv()[k])
	}
	env = append(env,
		"RANK="+strconv.Itoa(int(r.GetRank())),
		"LOCAL_RANK="+strconv.Itoa(int(r.GetLocalRank())),
		"WORLD_SIZE="+strconv.Itoa(int(l.GetWorldSize())),
		"LOCAL_WORLD_SIZE="+strconv.Itoa(len(l.GetRanks())),
		"NODE_RANK="+strconv.Itoa(int(l.GetNodeRank())),
		"MASTER_ADDR="+l.GetMasterAddr(),
		"MASTER_PORT="+strconv.Itoa(int(l.GetMasterPort())),
		"CUDA_VISIBLE_DEVICES="+strings.Join(gpus, ","),
		"GPUCTL_JOB="+l.GetJob(),
		"GPUCTL_NODE="+node,
		"GPUCTL_ATTEMPT="+strconv.Itoa(int(l.GetAttempt())),
	)
	if cluster != "" {
		env = append(env, "GPUCTL_CLUSTER="+cluster)
	}
	if l.GetCheckpointDir() != "" {
		env = append(env, "GPUCTL_CHECKPOINT_DIR="+l.GetCheckpointDir())
	}
	if l.GetResumeStep() > 0 {
		env = append(env, "GPUCTL_RESUME_STEP="+strconv.FormatInt(l.GetResumeStep(), 10))
	}
	return env
}
