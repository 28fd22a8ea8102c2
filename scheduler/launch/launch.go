// Package launch turns a chosen parallel plan (and, when there is one, a
// placement on named nodes) into the launch configuration of the tools
// sites already run: Megatron-LM arguments, a DeepSpeed config, a torchrun
// command, a Slurm batch script and a Kubernetes manifest.
//
// The package is pure: it formats text from its inputs and touches nothing.
package launch

import (
	"fmt"
	"regexp"
	"slices"
	"strconv"
	"strings"

	"github.com/gpuctl/gpuctl/scheduler/costmodel"
)

// DefaultMasterPort is the rendezvous port when a Job does not name one.
const DefaultMasterPort = 29500

// DefaultImage is the container image for Kubernetes when a Job names none:
// NVIDIA's PyTorch container, which carries torchrun and NCCL.
const DefaultImage = "nvcr.io/nvidia/pytorch:24.07-py3"

// Placement is where the scheduler put the job: one entry per node, in
// node-rank order.
type Placement struct {
	Nodes       []string `json:"nodes"`
	GPUsPerNode int      `json:"gpus_per_node"`
}

// Job is everything the emitters need.
type Job struct {
	// Name names the Slurm job and the Kubernetes objects (a DNS label).
	Name string
	// Command is the per-rank program, e.g. [python, pretrain_gpt.py].
	Command []string
	// Env is added to every rank's environment.
	Env map[string]string
	// Model is the network; nil for programs that are not Megatron-style
	// transformers (Megatron arguments are then not emitted).
	Model *costmodel.Model
	// Training holds global batch, precision, ZeRO stage and recomputation.
	Training costmodel.Training
	// Plan is the parallel layout; MicroBatch must be set, NumMicroBatches
	// is derived when zero.
	Plan costmodel.Plan
	// GPUsPerNode is the GPUs each node contributes (8 when zero, or the
	// placement's).
	GPUsPerNode int
	// Placement pins the job to nodes; nil leaves it to Slurm/Kubernetes.
	Placement *Placement
	// CheckpointDir is exported as GPUCTL_CHECKPOINT_DIR and passed to
	// Megatron as --save/--load.
	CheckpointDir string
	// MasterPort is the torchrun rendezvous port.
	MasterPort int
	// Image and Namespace are for Kubernetes.
	Image     string
	Namespace string
}

var labelRE = regexp.MustCompile(`^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$`)

// resolved is a checked Job with its derived sizes.
type resolved struct {
	Job
	nodes int
	gpn   int
	port  int
}

// resolve checks j and derives node count, GPUs per node and the
// micro-batch count.
func resolve(j Job) (resolved, error) {
	r := resolved{Job: j, gpn: j.GPUsPerNode, port: j.MasterPort}
	if !labelRE.MatchString(j.Name) {
		return r, fmt.Errorf("launch: job name %q is not a DNS label (lower-case letters, digits, '-')", j.Name)
	}
	if len(j.Command) == 0 || j.Command[0] == "" {
		return r, fmt.Errorf("launch %s: no command to run: give the training program, e.g. python pretrain_gpt.py", j.Name)
	}
	p := j.Plan
	if p.TP <= 0 || p.PP <= 0 || p.DP <= 0 || p.MicroBatch <= 0 {
		return r, fmt.Errorf("launch %s: plan %s needs positive tp, pp, dp and micro-batch size", j.Name, p)
	}
	if p.VirtualStages == 0 {
		p.VirtualStages = 1
	}
	if j.Placement != nil && j.Placement.GPUsPerNode > 0 {
		if r.gpn > 0 && r.gpn != j.Placement.GPUsPerNode {
			return r, fmt.Errorf("launch %s: %d GPUs per node disagrees with the placement's %d", j.Name, r.gpn, j.Placement.GPUsPerNode)
		}
		r.gpn = j.Placement.GPUsPerNode
	}
	if r.gpn == 0 {
		r.gpn = 8
	}
	gpus := p.GPUs()
	switch {
	case gpus < r.gpn:
		// A job smaller than a node runs on one node with fewer GPUs.
		r.gpn, r.nodes = gpus, 1
	case gpus%r.gpn != 0:
		return r, fmt.Errorf("launch %s: %d GPUs are not whole nodes of %d", j.Name, gpus, r.gpn)
	default:
		r.nodes = gpus / r.gpn
	}
	if p.TP > r.gpn {
		return r, fmt.Errorf("launch %s: tp %d exceeds the %d GPUs per node (tensor parallelism stays inside a node)", j.Name, p.TP, r.gpn)
	}
	if j.Placement != nil {
		if len(j.Placement.Nodes) != r.nodes {
			return r, fmt.Errorf("launch %s: placement names %d nodes, the plan needs %d", j.Name, len(j.Placement.Nodes), r.nodes)
		}
		seen := map[string]bool{}
		for _, n := range j.Placement.Nodes {
			if n == "" || seen[n] {
				return r, fmt.Errorf("launch %s: placement node %q is empty or repeated", j.Name, n)
			}
			seen[n] = true
		}
	}
	if j.Training.GlobalBatch > 0 {
		per := p.DP * p.MicroBatch
		if j.Training.GlobalBatch%per != 0 {
			return r, fmt.Errorf("launch %s: global batch %d is not divisible by dp %d × micro-batch %d", j.Name, j.Training.GlobalBatch, p.DP, p.MicroBatch)
		}
		if p.NumMicroBatches == 0 {
			p.NumMicroBatches = j.Training.GlobalBatch / per
		}
	} else if p.NumMicroBatches > 0 {
		r.Training.GlobalBatch = p.NumMicroBatches * p.DP * p.MicroBatch
	}
	if j.Model != nil {
		if err := j.Model.Validate(); err != nil {
			return r, fmt.Errorf("launch %s: %w", j.Name, err)
		}
		if p.VirtualStages > 1 && j.Model.Layers%(p.PP*p.VirtualStages) != 0 {
			return r, fmt.Errorf("launch %s: %d layers do not split into pp %d × %d virtual stages", j.Name, j.Model.Layers, p.PP, p.VirtualStages)
		}
		if r.Training.GlobalBatch == 0 {
			return r, fmt.Errorf("launch %s: the model needs a global batch size", j.Name)
		}
	}
	if r.port == 0 {
		r.port = DefaultMasterPort
	}
	if r.port < 1 || r.port > 65535 {
		return r, fmt.Errorf("launch %s: master port %d is not a TCP port", j.Name, r.port)
	}
	r.Plan = p
	return r, nil
}

// MegatronArgs returns the Megatron-LM pretrain_gpt.py arguments for the
// plan and model. It needs j.Model.
func MegatronArgs(j Job) ([]string, error) {
	r, err := resolve(j)
	if err != nil {
		return nil, err
	}
	if j.Model == nil {
		return nil, fmt.Errorf("launch %s: Megatron arguments need a model (a preset or its layers/hidden/heads)", j.Name)
	}
	return r.megatronArgs(), nil
}

func (r resolved) megatronArgs() []string {
	m, p, tr := *r.Model, r.Plan, r.Training
	itoa := strconv.Itoa
	a := []string{
		"--tensor-model-parallel-size", itoa(p.TP),
		"--pipeline-model-parallel-size", itoa(p.PP),
	}
	if p.CP > 1 {
		a = append(a, "--context-parallel-size", itoa(p.CP))
	}
	if p.VirtualStages > 1 {
		a = append(a, "--num-layers-per-virtual-pipeline-stage", itoa(m.Layers/(p.PP*p.VirtualStages)))
	}
	if tr.SequenceParallel && p.TP > 1 {
		a = append(a, "--sequence-parallel")
	}
	a = append(a,
		"--micro-batch-size", itoa(p.MicroBatch),
		"--global-batch-size", itoa(tr.GlobalBatch),
		"--num-layers", itoa(m.Layers),
		"--hidden-size", itoa(m.Hidden),
		"--num-attention-heads", itoa(m.Heads),
		"--seq-length", itoa(m.SeqLen),
		"--max-position-embeddings", itoa(m.SeqLen),
	)
	if m.KVHeads > 0 && m.KVHeads != m.Heads {
		a = append(a, "--group-query-attention", "--num-query-groups", itoa(m.KVHeads))
	}
	if m.FFN > 0 {
		a = append(a, "--ffn-hidden-size", itoa(m.FFN))
	}
	if m.GatedMLP {
		a = append(a, "--swiglu")
	}
	if !m.LearnedPositions {
		a = append(a, "--position-embedding-type", "rope")
	}
	if !m.TiedEmbeddings {
		a = append(a, "--untie-embeddings-and-output-weights")
	}
	switch tr.Precision {
	case costmodel.PrecisionFP16:
		a = append(a, "--fp16")
	case costmodel.PrecisionFP8:
		a = append(a, "--bf16", "--fp8-format", "hybrid")
	default:
		a = append(a, "--bf16")
	}
	switch tr.Recompute {
	case costmodel.RecomputeSelective:
		a = append(a, "--recompute-granularity", "selective")
	case costmodel.RecomputeFull:
		a = append(a, "--recompute-granularity", "full", "--recompute-method", "uniform", "--recompute-num-layers", "1")
	}
	if tr.ZeROStage >= 1 {
		// Megatron's distributed optimizer shards optimizer state across
		// data-parallel ranks (ZeRO stage 1); higher stages need DeepSpeed.
		a = append(a, "--use-distributed-optimizer")
	}
	if r.CheckpointDir != "" {
		a = append(a, "--save", r.CheckpointDir, "--load", r.CheckpointDir)
	}
	return a
}

// rankCommand is the program each rank runs: the job's command, followed by
// the Megatron arguments when there is a model.
func (r resolved) rankCommand() []string {
	cmd := slices.Clone(r.Command)
	if r.Model != nil {
		cmd = append(cmd, r.megatronArgs()...)
	}
	return cmd
}

// env returns the rank environment: the job's variables, the checkpoint
// directory, and what Megatron's tensor-parallel overlap needs.
func (r resolved) env() [][2]string {
	var out [][2]string
	keys := make([]string, 0, len(r.Env))
	for k := range r.Env {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	set := map[string]bool{}
	for _, k := range keys {
		out = append(out, [2]string{k, r.Env[k]})
		set[k] = true
	}
	if r.Model != nil && r.Plan.TP > 1 && !set["CUDA_DEVICE_MAX_CONNECTIONS"] {
		out = append(out, [2]string{"CUDA_DEVICE_MAX_CONNECTIONS", "1"})
	}
	if r.CheckpointDir != "" {
		out = append(out, [2]string{"GPUCTL_CHECKPOINT_DIR", r.CheckpointDir})
	}
	return out
}

// quote renders s for a POSIX shell.
func quote(s string) string {
	if s != "" && strings.Trim(s, "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789-_./=:,+@%") == "" {
		return s
	}
	return "'" + strings.ReplaceAll(s, "'", `'\''`) + "'"
}

// shellJoin quotes each word and joins them, wrapping long commands with
// backslash-newlines before each flag so scripts stay readable.
func shellJoin(words []string, indent string) string {
	var b strings.Builder
	for i, w := range words {
		if i > 0 {
			if strings.HasPrefix(w, "--") {
				b.WriteString(" \\\n" + indent)
			} else {
				b.WriteByte(' ')
			}
		}
		b.WriteString(quote(w))
	}
	return b.String()
}
