package jobspec

import (
	"fmt"
	"strings"
	"time"
)

// Flags are the values of `gpuctl submit --name … --gpus … -- CMD`.
// Zero values mean "not given".
type Flags struct {
	Name, Tenant, Queue string
	Priority            int
	GPUs                int
	Nodes               int
	GPUsPerNode         int
	GPUModel            string
	AllowMixed          bool
	// Model is a preset name; GlobalBatch and MicroBatch override it.
	Model               string
	GlobalBatch         int
	MicroBatch          int
	TP, CP, PP, DP      int
	VirtualStages       int
	CheckpointDir       string
	CheckpointInterval  time.Duration
	StallThreshold      time.Duration
	RestartPolicy       string
	MaxRestarts         int
	MaxRestartsSet      bool
	ElasticDataParallel []int
	EstimatedRuntime    time.Duration
	// Env holds KEY=VALUE pairs.
	Env []string
	// User and Group are what the ranks run as.
	User, Group string
	// Command is everything after "--".
	Command []string
}

// flagNames maps spec paths to the flags that set them, so problems read
// in the user's own terms.
var flagNames = map[string]string{
	"name": "--name", "tenant": "--tenant", "queue": "--queue", "priority": "--priority", "command": "command after --",
	"command[0]": "command after --", "gpus": "--gpus", "nodes": "--nodes", "gpus_per_node": "--gpus-per-node",
	"gpu_model": "--gpu", "allow_mixed": "--allow-mixed", "model": "--model", "model.preset": "--model",
	"model.global_batch": "--global-batch", "model.micro_batch": "--micro-batch", "plan": "--tp/--pp/--dp",
	"plan.tp": "--tp", "plan.cp": "--cp", "plan.pp": "--pp", "plan.dp": "--dp", "plan.virtual_stages": "--virtual-stages",
	"checkpoint.dir": "--checkpoint-dir", "checkpoint.interval": "--checkpoint-interval",
	"stall_threshold": "--stall-threshold", "restart_policy": "--restart-policy", "max_restarts": "--max-restarts",
	"elastic.data_parallel": "--elastic-dp", "estimated_runtime": "--estimated-runtime",
	"user": "--user", "group": "--group",
}

// FromFlags builds and validates a Spec from command-line values. Problems
// name the flag (--tp: …) rather than the YAML path.
func FromFlags(f Flags) (*Spec, error) {
	s := &Spec{
		Name: f.Name, Tenant: f.Tenant, Queue: f.Queue, Priority: f.Priority,
		Command: f.Command, GPUs: f.GPUs, Nodes: f.Nodes, GPUsPerNode: f.GPUsPerNode,
		GPUModel: f.GPUModel, AllowMixed: f.AllowMixed,
		Checkpoint:       CheckpointSpec{Dir: f.CheckpointDir, Interval: f.CheckpointInterval},
		StallThreshold:   f.StallThreshold,
		RestartPolicy:    RestartPolicy(f.RestartPolicy),
		EstimatedRuntime: f.EstimatedRuntime,
		User:             f.User, Group: f.Group,
	}
	var probs []Problem
	for _, kv := range f.Env {
		k, v, ok := strings.Cut(kv, "=")
		if !ok {
			probs = append(probs, Problem{Path: "--env", Reason: fmt.Sprintf("%q is not KEY=VALUE", kv)})
			continue
		}
		if s.Env == nil {
			s.Env = map[string]string{}
		}
		s.Env[k] = v
	}
	if f.MaxRestartsSet {
		n := f.MaxRestarts
		s.MaxRestarts = &n
	}
	if f.Model != "" || f.GlobalBatch != 0 || f.MicroBatch != 0 {
		s.Model = &ModelSpec{Preset: f.Model, GlobalBatch: f.GlobalBatch, MicroBatch: f.MicroBatch}
	}
	if f.TP != 0 || f.CP != 0 || f.PP != 0 || f.DP != 0 || f.VirtualStages != 0 {
		tp, pp := f.TP, f.PP
		// One of tp/pp alone means the other is 1.
		if tp == 0 {
			tp = 1
		}
		if pp == 0 {
			pp = 1
		}
		s.Plan = &PlanSpec{TP: tp, CP: f.CP, PP: pp, DP: f.DP, VirtualStages: f.VirtualStages}
	}
	if len(f.ElasticDataParallel) > 0 {
		s.Elastic = &ElasticSpec{DataParallel: f.ElasticDataParallel}
	}
	s.ApplyDefaults()
	if err := s.validate(nil); err != nil {
		probs = append(probs, err.Problems...)
	}
	if len(probs) == 0 {
		return s, nil
	}
	for i, p := range probs {
		if name, ok := flagNames[p.Path]; ok {
			probs[i].Path = name
		} else if strings.HasPrefix(p.Path, "env.") {
			probs[i].Path = "--env " + strings.TrimPrefix(p.Path, "env.")
		} else if strings.HasPrefix(p.Path, "elastic.data_parallel[") {
			probs[i].Path = "--elastic-dp"
		}
	}
	return nil, &ValidationError{Problems: probs}
}
