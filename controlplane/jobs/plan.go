package jobs

import (
	"fmt"
	"strings"

	"google.golang.org/protobuf/proto"

	"github.com/gpuctl/gpuctl/api"
	"github.com/gpuctl/gpuctl/jobspec"
	"github.com/gpuctl/gpuctl/scheduler"
	"github.com/gpuctl/gpuctl/scheduler/costmodel"
	"github.com/gpuctl/gpuctl/scheduler/planner"
)

// Plan sources, as JobPlan.source reports them.
const (
	planFixed   = "plan"
	planPlanner = "planner"
	planGPUs    = "gpus"
)

// plansFor resolves a job's parallel layout (planFor); for a job allowing
// several GPU models it plans each, in the job's order, and the first is
// the job's plan until it starts on one.
func plansFor(s *jobspec.Spec) (*api.JobPlan, []*api.JobTypePlan, error) {
	if len(s.GPUModels) < 2 {
		p, err := planFor(s)
		return p, nil, err
	}
	var types []*api.JobTypePlan
	for _, m := range s.Models() {
		one := *s
		one.GPUModel, one.GPUModels = m, nil
		p, err := planFor(&one)
		if err != nil {
			return nil, nil, fmt.Errorf("gpu_models %s: %w", m, err)
		}
		types = append(types, &api.JobTypePlan{GpuModel: m, Plan: p})
	}
	return proto.Clone(types[0].Plan).(*api.JobPlan), types, nil
}

// typeOptions are the scheduler's view of a job's type plans: each
// model's shape, and its throughput as one over the predicted step (all
// alike when the job has no model section to predict from).
func typeOptions(types []*api.JobTypePlan) []scheduler.TypeOption {
	out := make([]scheduler.TypeOption, 0, len(types))
	for _, t := range types {
		p := t.GetPlan()
		rate := 1.0
		if st := p.GetStepSeconds(); st > 0 {
			rate = 1 / st
		}
		out = append(out, scheduler.TypeOption{Model: t.GetGpuModel(),
			Shape: scheduler.Shape{TP: int(p.GetTp()), PP: int(p.GetPp()), DP: int(p.GetDp())}, Rate: rate})
	}
	return out
}

// useType makes the plan of model the job's, for the attempt about to
// start there, and records why it got that model. It returns what to put
// back if the start does not happen.
func useType(j *api.Job, model, why string) (undo func()) {
	plan, typ, reason := j.Plan, j.GpuType, j.GpuTypeReason
	undo = func() { j.Plan, j.GpuType, j.GpuTypeReason = plan, typ, reason }
	for _, t := range j.GetTypePlans() {
		if t.GetGpuModel() == model {
			p := proto.Clone(t.GetPlan()).(*api.JobPlan)
			if typ == model && plan != nil {
				// Same model again: keep what the running job measured.
				p = plan
			}
			j.Plan, j.GpuType, j.GpuTypeReason = p, model, why
		}
	}
	return undo
}

// planFor resolves a job's parallel layout: the plan section when the job
// fixes one, else the planner's fastest plan that fits when the job
// describes its model, else plain data parallelism over its GPUs.
func planFor(s *jobspec.Spec) (*api.JobPlan, error) {
	req, hasModel, err := planner.ForSpec(s)
	if err != nil {
		return nil, err
	}
	if p, ok := s.FixedPlan(); ok {
		out := &api.JobPlan{Tp: int32(p.TP), Cp: contextParallel(p.CP), Pp: int32(p.PP), Dp: int32(p.DP), MicroBatch: int32(p.MicroBatch),
			NumMicroBatches: int32(p.NumMicroBatches), VirtualStages: int32(p.VirtualStages), Source: planFixed}
		if hasModel {
			if ev, err := req.Config().Evaluate(p); err == nil {
				predict(out, ev)
			}
		}
		return out, nil
	}
	if !hasModel {
		return &api.JobPlan{Tp: 1, Pp: 1, Dp: int32(s.TotalGPUs()), Source: planGPUs}, nil
	}
	ranked, rejected := planner.Search(req)
	if len(ranked) == 0 {
		return nil, fmt.Errorf("job %s: no parallel plan of model %s fits %d %s GPUs (%s); run `gpuctl plan -f` on the job file to see every plan and why it lost",
			s.Name, req.Model.Name, req.GPUs, req.Hardware.Name, rejectionSummary(rejected))
	}
	best := ranked[0]
	out := &api.JobPlan{Tp: int32(best.TP), Cp: contextParallel(best.CP), Pp: int32(best.PP), Dp: int32(best.DP), MicroBatch: int32(best.MicroBatch),
		NumMicroBatches: int32(best.NumMicroBatches), VirtualStages: int32(best.VirtualStages), Source: planPlanner}
	predict(out, best)
	return out, nil
}

// contextParallel is cp as JobPlan holds it: 0 for none, so plans without
// context parallelism read as before it existed.
func contextParallel(cp int) int32 {
	if cp <= 1 {
		return 0
	}
	return int32(cp)
}

// minCalibrationSteps is how many steps an attempt must have run before
// its measured pace calibrates the cost model.
const minCalibrationSteps = 3

// calibrate feeds a running job's measured seconds per step back into the
// cost model: the efficiency that makes the model predict what the job
// really does, which `gpuctl plan --measured-step` can then reuse.
func calibrate(s *jobspec.Spec, p *api.JobPlan, measured float64) {
	if s == nil || p == nil || measured <= 0 {
		return
	}
	p.MeasuredStepSeconds = measured
	req, hasModel, err := planner.ForSpec(s)
	if err != nil || !hasModel {
		return
	}
	cfg := req.Config()
	plan := costmodel.Plan{TP: int(p.GetTp()), CP: int(p.GetCp()), PP: int(p.GetPp()), DP: int(p.GetDp()), MicroBatch: int(p.GetMicroBatch()),
		NumMicroBatches: int(p.GetNumMicroBatches()), VirtualStages: int(p.GetVirtualStages())}
	cal, err := cfg.CalibrateReport(plan, measured)
	if err != nil {
		p.CalibratedComputeScale, p.CalibratedCommScale, p.CalibratedTerm, p.CalibrationNote = 0, 0, "", err.Error()
		return
	}
	p.CalibratedComputeScale, p.CalibratedCommScale, p.CalibratedTerm, p.CalibrationNote = cal.ComputeScale, cal.CommScale, cal.Term, ""
}

func predict(p *api.JobPlan, ev costmodel.Evaluation) {
	p.StepSeconds, p.Mfu, p.MemPerGpuBytes = ev.StepSeconds, ev.MFU, ev.MemPerGPUBytes
	if p.NumMicroBatches == 0 {
		p.NumMicroBatches = int32(ev.NumMicroBatches)
	}
}

// rejectionSummary counts the planner's rejections by reason, most first.
func rejectionSummary(rs []costmodel.Rejection) string {
	var parts []string
	for _, rc := range planner.Reasons(rs) {
		parts = append(parts, fmt.Sprintf("%s: %d", rc.Reason, rc.Count))
	}
	if len(parts) == 0 {
		return "no candidates"
	}
	return strings.Join(parts, ", ")
}
