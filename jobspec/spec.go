// Package jobspec reads and checks job files: what to run, on how many and
// which GPUs, the model and parallel plan, checkpointing and what to do when
// the job breaks. Every refusal names the field (and line) and says why.
package jobspec

import (
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/gpuctl/gpuctl/scheduler/costmodel"
)

// RestartPolicy says what gpuctl does when a running job fails.
type RestartPolicy string

// Restart policies.
const (
	// RestartInPlace restarts every rank on the same nodes from the last checkpoint.
	RestartInPlace RestartPolicy = "restart-in-place"
	// ReplaceNode swaps the failed node for a healthy spare, then restarts.
	ReplaceNode RestartPolicy = "replace-node"
	// Shrink restarts with a smaller data-parallel size from Elastic.
	Shrink RestartPolicy = "shrink"
	// NoRestart leaves the job failed.
	NoRestart RestartPolicy = "none"
)

// RestartPolicies lists the accepted policies.
var RestartPolicies = []RestartPolicy{RestartInPlace, ReplaceNode, Shrink, NoRestart}

// StallRecovery says what gpuctl does when it declares the job stalled.
type StallRecovery string

// Stall recovery modes.
const (
	// StallManual reports the stall and leaves the job to the operator
	// (`gpuctl restart JOB --exclude NODE`).
	StallManual StallRecovery = "manual"
	// StallAuto restarts the job from its last checkpoint without the
	// lagging ranks' nodes, under its restart policy.
	StallAuto StallRecovery = "auto"
)

// StallRecoveries lists the accepted stall recovery modes.
var StallRecoveries = []StallRecovery{StallManual, StallAuto}

// SlowRecovery says what gpuctl does about a fail-slow finding of the job.
// It is a field of its own, not stall_recovery: a hang stops training, a
// slow rank only costs time and may pass, so a job may well restart on a
// hang by itself and still want a person to decide about a slow node.
type SlowRecovery string

// Slow recovery modes.
const (
	// SlowAlert reports the finding (an event, `gpuctl stalls`, metrics)
	// and leaves the job to the operator.
	SlowAlert SlowRecovery = "alert"
	// SlowAuto checkpoints the job and restarts it from that checkpoint
	// without the slow node, on a spare, once the finding has stood for
	// the hold, within the bound on automatic exclusions
	// (scheduler.DefaultSlowRule).
	SlowAuto SlowRecovery = "auto"
)

// SlowRecoveries lists the accepted slow recovery modes.
var SlowRecoveries = []SlowRecovery{SlowAlert, SlowAuto}

// Defaults applied to fields a job leaves out.
const (
	DefaultGPUsPerNode        = 8
	DefaultMaxRestarts        = 3
	DefaultCheckpointInterval = 30 * time.Minute
)

// Spec is one job as submitted.
type Spec struct {
	// Name identifies the job; a DNS label (lower case, digits, '-').
	Name string `yaml:"name" json:"name"`
	// Tenant and Queue select the fair-share account and queue.
	Tenant string `yaml:"tenant,omitempty" json:"tenant,omitempty"`
	Queue  string `yaml:"queue,omitempty" json:"queue,omitempty"`
	// Priority orders jobs within a queue, -1000..1000, higher first.
	Priority int `yaml:"priority,omitempty" json:"priority,omitempty"`
	// Command is the per-node program and its arguments.
	Command []string `yaml:"command" json:"command"`
	// Env is added to every rank's environment.
	Env map[string]string `yaml:"env,omitempty" json:"env,omitempty"`
	// User is the account every rank runs as, a name or a numeric uid;
	// empty: the server's default. Group is the ranks' group (name or
	// gid); empty: the user's primary group. See CheckRunAs.
	User  string `yaml:"user,omitempty" json:"user,omitempty"`
	Group string `yaml:"group,omitempty" json:"group,omitempty"`

	// GPUs is the total GPU count; or give Nodes × GPUsPerNode.
	GPUs        int `yaml:"gpus,omitempty" json:"gpus,omitempty"`
	Nodes       int `yaml:"nodes,omitempty" json:"nodes,omitempty"`
	GPUsPerNode int `yaml:"gpus_per_node,omitempty" json:"gpus_per_node,omitempty"`
	// GPUModel constrains placement to one hardware profile (h100, …).
	GPUModel string `yaml:"gpu_model,omitempty" json:"gpu_model,omitempty"`
	// GPUModels lets the job run on any one of several profiles, with the
	// plan chosen for each; it never spans two of them. Give GPUModel (one
	// model) or GPUModels (several), not both; AllowMixed (any models at
	// once) goes with neither. With none of the three the job runs on one
	// model, whichever places it best.
	GPUModels []string `yaml:"gpu_models,omitempty" json:"gpu_models,omitempty"`
	// AllowMixed lets the job span GPU models (only without GPUModel).
	AllowMixed bool `yaml:"allow_mixed,omitempty" json:"allow_mixed,omitempty"`

	// Model describes the network, for the planner; optional.
	Model *ModelSpec `yaml:"model,omitempty" json:"model,omitempty"`
	// Plan fixes the parallel layout instead of letting the planner choose.
	Plan *PlanSpec `yaml:"plan,omitempty" json:"plan,omitempty"`

	Checkpoint CheckpointSpec `yaml:"checkpoint,omitempty" json:"checkpoint,omitempty"`
	// StallThreshold bounds how long collectives may make no progress
	// before the job counts as hung; 0 (unset) leaves it to what the stall
	// detector learns of the job, and to its default before it has
	// learned (scheduler/stall.DefaultRule).
	StallThreshold time.Duration `yaml:"stall_threshold,omitempty" json:"stall_threshold,omitempty"`
	// StallRecovery is manual (default) or auto.
	StallRecovery StallRecovery `yaml:"stall_recovery,omitempty" json:"stall_recovery,omitempty"`
	// SlowRecovery is alert (default) or auto.
	SlowRecovery  SlowRecovery  `yaml:"slow_recovery,omitempty" json:"slow_recovery,omitempty"`
	RestartPolicy RestartPolicy `yaml:"restart_policy,omitempty" json:"restart_policy,omitempty"`
	// MaxRestarts bounds automatic restarts; nil means DefaultMaxRestarts.
	MaxRestarts *int         `yaml:"max_restarts,omitempty" json:"max_restarts,omitempty"`
	Elastic     *ElasticSpec `yaml:"elastic,omitempty" json:"elastic,omitempty"`
	// EstimatedRuntime feeds shortest-job-first ordering, backfill and
	// carbon-aware deferral.
	EstimatedRuntime time.Duration `yaml:"estimated_runtime,omitempty" json:"estimated_runtime,omitempty"`
	// Deferrable lets a carbon-aware server hold the job for cleaner power.
	Deferrable *DeferrableSpec `yaml:"deferrable,omitempty" json:"deferrable,omitempty"`
}

// DeferrableSpec says by when a deferrable job must have finished.
type DeferrableSpec struct {
	// Until is an RFC 3339 time, or a duration from submission (24h).
	Until string `yaml:"until" json:"until"`
}

// deadline parses Until: an absolute time, or a duration (rel true).
func (d *DeferrableSpec) deadline() (at time.Time, after time.Duration, rel bool, err error) {
	if dur, derr := time.ParseDuration(d.Until); derr == nil {
		return time.Time{}, dur, true, nil
	}
	at, err = time.Parse(time.RFC3339, d.Until)
	return at, 0, false, err
}

// Deadline is when a job submitted at submit must have finished; the zero
// time when the spec is not deferrable (or Until does not parse: Validate
// refuses it).
func (s *Spec) Deadline(submit time.Time) time.Time {
	if s.Deferrable == nil {
		return time.Time{}
	}
	at, after, rel, err := s.Deferrable.deadline()
	switch {
	case err != nil:
		return time.Time{}
	case rel:
		return submit.Add(after)
	}
	return at
}

// ModelSpec names a preset or gives the shape, plus how it is trained.
// Fields given next to a preset override it.
type ModelSpec struct {
	Preset         string `yaml:"preset,omitempty" json:"preset,omitempty"`
	Layers         int    `yaml:"layers,omitempty" json:"layers,omitempty"`
	Hidden         int    `yaml:"hidden,omitempty" json:"hidden,omitempty"`
	Heads          int    `yaml:"heads,omitempty" json:"heads,omitempty"`
	KVHeads        int    `yaml:"kv_heads,omitempty" json:"kv_heads,omitempty"`
	FFN            int    `yaml:"ffn,omitempty" json:"ffn,omitempty"`
	SeqLen         int    `yaml:"seq_len,omitempty" json:"seq_len,omitempty"`
	Vocab          int    `yaml:"vocab,omitempty" json:"vocab,omitempty"`
	GatedMLP       *bool  `yaml:"gated_mlp,omitempty" json:"gated_mlp,omitempty"`
	TiedEmbeddings *bool  `yaml:"tied_embeddings,omitempty" json:"tied_embeddings,omitempty"`
	GlobalBatch    int    `yaml:"global_batch,omitempty" json:"global_batch,omitempty"`
	// MicroBatch is the micro-batch size in sequences.
	MicroBatch       int    `yaml:"micro_batch,omitempty" json:"micro_batch,omitempty"`
	Precision        string `yaml:"precision,omitempty" json:"precision,omitempty"`
	ZeROStage        *int   `yaml:"zero_stage,omitempty" json:"zero_stage,omitempty"`
	Recompute        string `yaml:"recompute,omitempty" json:"recompute,omitempty"`
	SequenceParallel *bool  `yaml:"sequence_parallel,omitempty" json:"sequence_parallel,omitempty"`
	// Stack names the training software stack (costmodel.StackNames):
	// which communication it overlaps with compute. Empty: the default.
	Stack string `yaml:"stack,omitempty" json:"stack,omitempty"`
}

// PlanSpec fixes the parallel layout. DP may be left out and is then the
// GPUs left after TP × CP × PP. PP × VirtualStages need not divide the
// layers: the embedding and the output layer then count as one layer each
// and the first and last stages carry fewer blocks (the cost model's
// uneven layout, as `gpuctl plan` shows it).
type PlanSpec struct {
	TP int `yaml:"tp" json:"tp"`
	// CP is context parallelism (ring attention); 0 means 1.
	CP            int `yaml:"cp,omitempty" json:"cp,omitempty"`
	PP            int `yaml:"pp" json:"pp"`
	DP            int `yaml:"dp,omitempty" json:"dp,omitempty"`
	VirtualStages int `yaml:"virtual_stages,omitempty" json:"virtual_stages,omitempty"`
	// MicroBatches is the number of micro-batches per step per replica.
	MicroBatches int `yaml:"micro_batches,omitempty" json:"micro_batches,omitempty"`
}

// CheckpointSpec says where and how often ranks checkpoint.
type CheckpointSpec struct {
	Interval time.Duration `yaml:"interval,omitempty" json:"interval,omitempty"`
	// Dir is exported to ranks as GPUCTL_CHECKPOINT_DIR.
	Dir string `yaml:"dir,omitempty" json:"dir,omitempty"`
	// Reshardable says the job's checkpoints can be loaded by another
	// parallel plan (Megatron's and PyTorch's distributed checkpoints
	// can), so a job allowing several GPU models may restart on another
	// model with that model's plan. Otherwise it restarts only on the
	// model it started on.
	Reshardable bool `yaml:"reshardable,omitempty" json:"reshardable,omitempty"`
	// IntervalAuto is set when the job gave a dir but no interval: the
	// server then asks for checkpoints (SIGUSR1) at the Young–Daly interval
	// it advises, and Interval holds the default only for planning.
	IntervalAuto bool `yaml:"-" json:"-"`
}

// ElasticSpec lists the data-parallel sizes the job may run at.
type ElasticSpec struct {
	DataParallel []int `yaml:"data_parallel" json:"data_parallel"`
}

// NodeSize is the GPUs of one node for the job's GPU model.
func (s *Spec) NodeSize() int {
	if hw, err := costmodel.LookupHardware(s.GPUModel); err == nil && s.GPUModel != "" {
		return hw.GPUsPerNode
	}
	return DefaultGPUsPerNode
}

// Models are the hardware profiles the job may run on, by their profile
// names: GPUModels, or GPUModel alone; nil when any model will do.
// Validate refuses unknown names.
func (s *Spec) Models() []string {
	names := s.GPUModels
	if s.GPUModel != "" {
		names = []string{s.GPUModel}
	}
	var out []string
	for _, n := range names {
		if hw, err := costmodel.LookupHardware(n); err == nil && !slices.Contains(out, hw.Name) {
			out = append(out, hw.Name)
		}
	}
	return out
}

// TotalGPUs is the job's GPU count in either form.
func (s *Spec) TotalGPUs() int {
	if s.GPUs > 0 {
		return s.GPUs
	}
	return s.Nodes * s.GPUsPerNode
}

// Restarts is MaxRestarts with its default.
func (s *Spec) Restarts() int {
	if s.MaxRestarts == nil {
		return DefaultMaxRestarts
	}
	return *s.MaxRestarts
}

// ApplyDefaults fills the fields a job may leave out.
func (s *Spec) ApplyDefaults() {
	if s.Nodes > 0 && s.GPUsPerNode == 0 {
		s.GPUsPerNode = s.NodeSize()
	}
	if s.RestartPolicy == "" {
		s.RestartPolicy = RestartInPlace
	}
	if s.Checkpoint.Dir != "" && s.Checkpoint.Interval == 0 {
		s.Checkpoint.Interval = DefaultCheckpointInterval
		s.Checkpoint.IntervalAuto = true
	}
	if s.StallRecovery == "" {
		s.StallRecovery = StallManual
	}
	if s.SlowRecovery == "" {
		s.SlowRecovery = SlowAlert
	}
}

// CostModel resolves the model section into the cost model's terms: the
// preset (if any) with the given fields laid over it. ok is false when the
// job has no model section.
func (s *Spec) CostModel() (m costmodel.Model, tr costmodel.Training, ok bool, err error) {
	ms := s.Model
	if ms == nil {
		return m, tr, false, nil
	}
	tr = costmodel.Training{Precision: costmodel.PrecisionBF16, ZeROStage: 1, Recompute: costmodel.RecomputeSelective, SequenceParallel: true}
	if ms.Preset != "" {
		m, tr, err = costmodel.LookupModel(ms.Preset)
		if err != nil {
			return m, tr, false, err
		}
	}
	over := func(dst *int, v int) {
		if v != 0 {
			*dst = v
		}
	}
	over(&m.Layers, ms.Layers)
	over(&m.Hidden, ms.Hidden)
	over(&m.Heads, ms.Heads)
	over(&m.KVHeads, ms.KVHeads)
	over(&m.FFN, ms.FFN)
	over(&m.SeqLen, ms.SeqLen)
	over(&m.Vocab, ms.Vocab)
	over(&tr.GlobalBatch, ms.GlobalBatch)
	if ms.GatedMLP != nil {
		m.GatedMLP = *ms.GatedMLP
	}
	if ms.TiedEmbeddings != nil {
		m.TiedEmbeddings = *ms.TiedEmbeddings
	}
	if ms.Precision != "" {
		tr.Precision = costmodel.Precision(strings.ToLower(ms.Precision))
	}
	if ms.ZeROStage != nil {
		tr.ZeROStage = *ms.ZeROStage
	}
	if ms.Recompute != "" {
		tr.Recompute = costmodel.Recompute(strings.ToLower(ms.Recompute))
	}
	if ms.SequenceParallel != nil {
		tr.SequenceParallel = *ms.SequenceParallel
	}
	if ms.Stack != "" {
		tr.Stack = strings.ToLower(ms.Stack)
	}
	if m.Name == "" {
		m.Name = s.Name
	}
	return m, tr, true, nil
}

// FixedPlan returns the plan section in the cost model's terms, with DP
// derived when left out and the micro-batch size taken from the model
// section (or derived from the micro-batch count). ok is false without a
// plan section.
func (s *Spec) FixedPlan() (costmodel.Plan, bool) {
	if s.Plan == nil {
		return costmodel.Plan{}, false
	}
	p := costmodel.Plan{TP: s.Plan.TP, CP: s.Plan.CP, PP: s.Plan.PP, DP: s.Plan.DP, VirtualStages: s.Plan.VirtualStages, NumMicroBatches: s.Plan.MicroBatches}
	if p.DP == 0 && p.TP > 0 && p.PP > 0 {
		p.DP = s.TotalGPUs() / (p.TP * max(p.CP, 1) * p.PP)
	}
	if s.Model != nil {
		p.MicroBatch = s.Model.MicroBatch
		_, tr, ok, err := s.CostModel()
		if ok && err == nil && p.MicroBatch == 0 && p.NumMicroBatches > 0 && p.DP > 0 {
			p.MicroBatch = tr.GlobalBatch / (p.DP * p.NumMicroBatches)
		}
	}
	if p.MicroBatch == 0 {
		p.MicroBatch = 1
	}
	return p, true
}

// String is a one-line summary for logs.
func (s *Spec) String() string {
	return fmt.Sprintf("job %s: %d GPUs, %q", s.Name, s.TotalGPUs(), strings.Join(s.Command, " "))
}
