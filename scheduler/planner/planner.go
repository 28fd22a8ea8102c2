// Package planner is the one place that decides a job's parallel layout:
// gpuctl serve when a job arrives, `gpuctl plan`, `gpuctl simulate` and the
// console's plan view and submit form all plan through it, so the same job
// gets the same plan whoever asks.
package planner

import (
	"cmp"
	"fmt"
	"slices"
	"time"

	"github.com/gpuctl/gpuctl/jobspec"
	"github.com/gpuctl/gpuctl/scheduler/costmodel"
)

// MaxVirtualStages is the largest interleaving tried: a job file can fix
// plan.virtual_stages, and gpuctl serve places an interleaved plan exactly
// as the plain one (interleaving changes no rank's GPU).
const MaxVirtualStages = 8

// PriorGPUMTBF is the per-GPU mean time between interruptions a plan
// assumes unless told otherwise: 419 unexpected interruptions in 54 days
// on 16,384 H100s (Dubey et al. 2024, §3.3.4). Plans are ranked by the
// step time failures and checkpoints make at this rate.
const PriorGPUMTBF = 50_700 * time.Hour

// DefaultGPU is the GPU profile of a job or question that names none.
const DefaultGPU = "h100"

// Request is one planning question: a model, its training settings, the
// GPUs and the cost model's tunables, and what the asker fixed.
type Request struct {
	Model costmodel.Model
	// Training names the job's training stack (Training.Stack); Tunables
	// carry that stack's overlaps, as StackTunables sets them.
	Training costmodel.Training
	Hardware costmodel.Hardware
	Tunables costmodel.Tunables
	GPUs     int
	// Fixed fixes TP, CP, PP, DP and VirtualStages where positive.
	Fixed costmodel.Plan
	// MicroBatchSizes are the micro-batch sizes tried; nil tries 1, 2, 4, 8.
	MicroBatchSizes []int
	// MaxCP tries context parallelism up to it; 0 tries it while each rank
	// keeps at least 4K tokens (see costmodel.Options.MaxCP).
	MaxCP int
	// MaxVirtualStages overrides MaxVirtualStages when positive.
	MaxVirtualStages int
	// EvenOnly leaves out pipelines that do not split the layers evenly
	// (by default they are tried: the first and last stages then count
	// the embedding and output layers, as a job file can say).
	EvenOnly bool
}

// Options is the cost model's search space for r: everything a job file
// can express and gpuctl serve can run (context parallelism, uneven
// pipelines, interleaving up to MaxVirtualStages), less what r fixes.
func (r Request) Options() costmodel.Options {
	opt := costmodel.Options{
		Training: r.Training, Tunables: r.Tunables,
		TP: r.Fixed.TP, CP: r.Fixed.CP, PP: r.Fixed.PP, DP: r.Fixed.DP,
		MaxCP:               r.MaxCP,
		MicroBatchSizes:     r.MicroBatchSizes,
		MaxVirtualStages:    cmp.Or(r.MaxVirtualStages, MaxVirtualStages),
		AllowUnevenPipeline: !r.EvenOnly,
	}
	if r.Fixed.VirtualStages > 0 {
		opt.MaxVirtualStages = r.Fixed.VirtualStages
	}
	return opt
}

// Search ranks every plan of r that fits, fastest first, and says why the
// others lost.
func Search(r Request) (ranked []costmodel.Evaluation, rejected []costmodel.Rejection) {
	ranked, rejected = costmodel.Search(r.Model, r.Hardware, r.GPUs, r.Options())
	if v := r.Fixed.VirtualStages; v > 1 {
		// A fixed interleaving keeps only that v, not the smaller ones.
		ranked = slices.DeleteFunc(ranked, func(e costmodel.Evaluation) bool { return e.VirtualStages != v })
	}
	return ranked, rejected
}

// Config is the cost model's configuration of r.
func (r Request) Config() costmodel.Config {
	return costmodel.Config{Model: r.Model, Hardware: r.Hardware, Training: r.Training, Tunables: r.Tunables}
}

// Tunables are the cost model's defaults (the default training stack's)
// with the prior failure rate.
func Tunables() costmodel.Tunables {
	tun := costmodel.DefaultTunables()
	tun.MTBF, tun.MTBFReferenceGPUs = PriorGPUMTBF, 1
	return tun
}

// StackTunables are Tunables with the named training stack's overlaps
// ("" is costmodel.DefaultStack).
func StackTunables(stack string) (costmodel.Tunables, error) {
	tun := Tunables()
	if err := tun.ApplyStack(stack); err != nil {
		return tun, err
	}
	return tun, nil
}

// ForPreset is the question "model preset on gpus GPUs of profile gpu,
// trained on stack" (gpu "" is DefaultGPU, stack "" the default stack), as
// the console's plan view and submit form ask it and as a job file with
// only those four says it.
func ForPreset(model, gpu, stack string, gpus int) (Request, error) {
	m, tr, err := costmodel.LookupModel(model)
	if err != nil {
		return Request{}, err
	}
	tr.Stack = stack
	tun, err := StackTunables(stack)
	if err != nil {
		return Request{}, err
	}
	hw, err := costmodel.LookupHardware(cmp.Or(gpu, DefaultGPU))
	if err != nil {
		return Request{}, err
	}
	if gpus <= 0 {
		return Request{}, fmt.Errorf("GPUs must be at least 1, got %d", gpus)
	}
	return Request{Model: m, Training: tr, Hardware: hw, Tunables: tun, GPUs: gpus}, nil
}

// ForSpec is a job file's question. ok is false when the job has no model
// section (the planner has nothing to go on). The fixed plan, if any, is
// in Fixed; the model section's micro-batch size is the only one tried.
func ForSpec(s *jobspec.Spec) (r Request, ok bool, err error) {
	m, tr, ok, err := s.CostModel()
	if err != nil {
		return Request{}, false, fmt.Errorf("job %s: model: %w", s.Name, err)
	}
	hw, err := costmodel.LookupHardware(cmp.Or(s.GPUModel, DefaultGPU))
	if err != nil {
		return Request{}, false, fmt.Errorf("job %s: gpu_model: %w", s.Name, err)
	}
	if s.GPUsPerNode > 0 && s.GPUsPerNode < hw.GPUsPerNode {
		// Tensor parallelism stays inside the GPUs the job takes per node.
		hw.GPUsPerNode = s.GPUsPerNode
	}
	tun, err := StackTunables(tr.Stack)
	if err != nil {
		return Request{}, false, fmt.Errorf("job %s: model.stack: %w", s.Name, err)
	}
	if s.Checkpoint.Interval > 0 {
		tun.CheckpointInterval = s.Checkpoint.Interval
	}
	r = Request{Model: m, Training: tr, Hardware: hw, Tunables: tun, GPUs: s.TotalGPUs()}
	if p, fixed := s.FixedPlan(); fixed {
		r.Fixed = p
	}
	if s.Model != nil && s.Model.MicroBatch > 0 {
		r.MicroBatchSizes = []int{s.Model.MicroBatch}
	}
	return r, ok, nil
}

// Effective is what a plan is ranked by: its step, or the step failures
// and checkpoints make when a failure rate is known.
func Effective(e *costmodel.Evaluation) float64 {
	if e.Goodput != nil {
		return e.Goodput.EffectiveStepSec
	}
	return e.StepSeconds
}

// Lost is every plan that lost to the first shown of ranked: the
// rejections, then the ranked plans past the shown ones as slower.
func Lost(ranked []costmodel.Evaluation, rejected []costmodel.Rejection, shown int) []costmodel.Rejection {
	lost := slices.Clone(rejected)
	if shown <= 0 || shown >= len(ranked) {
		return lost
	}
	best := Effective(&ranked[0])
	for _, e := range ranked[shown:] {
		ev := e
		lost = append(lost, costmodel.Rejection{Plan: e.Plan, Reason: costmodel.ReasonSlower, Evaluation: &ev,
			Detail: fmt.Sprintf("slower by %.1f%%", (Effective(&ev)/best-1)*100)})
	}
	return lost
}

// ReasonCount is how many plans lost for one reason.
type ReasonCount struct {
	Reason costmodel.Reason `json:"reason"`
	Count  int              `json:"count"`
}

// Reasons counts the losers by reason, most first.
func Reasons(lost []costmodel.Rejection) []ReasonCount {
	counts := map[costmodel.Reason]int{}
	for _, r := range lost {
		counts[r.Reason]++
	}
	out := make([]ReasonCount, 0, len(counts))
	for r, c := range counts {
		out = append(out, ReasonCount{r, c})
	}
	slices.SortFunc(out, func(a, b ReasonCount) int { return cmp.Or(b.Count-a.Count, cmp.Compare(a.Reason, b.Reason)) })
	return out
}

// Closest picks the n losers nearest to winning: fitting plans by how
// little slower they are (by Effective, the ranking's own measure),
// alternating with out-of-memory plans by how little they overflow.
func Closest(lost []costmodel.Rejection, n int) []costmodel.Rejection {
	var slower, oom []costmodel.Rejection
	for _, r := range lost {
		switch {
		case r.Reason == costmodel.ReasonSlower && r.Evaluation != nil:
			slower = append(slower, r)
		case r.Reason == costmodel.ReasonOutOfMemory && r.MemPerGPUBytes > 0:
			oom = append(oom, r)
		}
	}
	slices.SortStableFunc(slower, func(a, b costmodel.Rejection) int {
		return cmp.Compare(Effective(a.Evaluation), Effective(b.Evaluation))
	})
	slices.SortStableFunc(oom, func(a, b costmodel.Rejection) int { return cmp.Compare(a.MemPerGPUBytes, b.MemPerGPUBytes) })
	var out []costmodel.Rejection
	for i := 0; len(out) < n && (i < len(slower) || i < len(oom)); i++ {
		if i < len(slower) {
			out = append(out, slower[i])
		}
		if i < len(oom) && len(out) < n {
			out = append(out, oom[i])
		}
	}
	return out
}
