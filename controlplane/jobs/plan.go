package jobs

import (
	"fmt"
	"slices"
	"strings"

	"github.com/gpuctl/gpuctl/api"
	"github.com/gpuctl/gpuctl/jobspec"
	"github.com/gpuctl/gpuctl/scheduler/costmodel"
)

// Plan sources, as JobPlan.source reports them.
const (
	planFixed   = "plan"
	planPlanner = "planner"
	planGPUs    = "gpus"
)

// planFor resolves a job's parallel layout: the plan section when the job
// fixes one, else the cost model's fastest plan that fits when the job
// describes its model, else plain data parallelism over its GPUs.
func planFor(s *jobspec.Spec) (*api.JobPlan, error) {
	gpus := s.TotalGPUs()
	cfg, hasModel, err := costConfig(s)
	if err != nil {
		return nil, err
	}
	m, hw, tr, tun := cfg.Model, cfg.Hardware, cfg.Training, cfg.Tunables
	if p, ok := s.FixedPlan(); ok {
		out := &api.JobPlan{Tp: int32(p.TP), Pp: int32(p.PP), Dp: int32(p.DP), MicroBatch: int32(p.MicroBatch),
			NumMicroBatches: int32(p.NumMicroBatches), VirtualStages: int32(p.VirtualStages), Source: planFixed}
		if hasModel {
			if ev, err := cfg.Evaluate(p); err == nil {
				predict(out, ev)
			}
		}
		return out, nil
	}
	if !hasModel {
		return &api.JobPlan{Tp: 1, Pp: 1, Dp: int32(gpus), Source: planGPUs}, nil
	}
	opt := costmodel.Options{Training: tr, Tunables: tun}
	if s.Model.MicroBatch > 0 {
		opt.MicroBatchSizes = []int{s.Model.MicroBatch}
	}
	ranked, rejected := costmodel.Search(m, hw, gpus, opt)
	if len(ranked) == 0 {
		return nil, fmt.Errorf("job %s: no parallel plan of model %s fits %d %s GPUs (%s); run `gpuctl plan -f` on the job file to see every plan and why it lost",
			s.Name, m.Name, gpus, hw.Name, rejectionSummary(rejected))
	}
	best := ranked[0]
	out := &api.JobPlan{Tp: int32(best.TP), Pp: int32(best.PP), Dp: int32(best.DP), MicroBatch: int32(best.MicroBatch),
		NumMicroBatches: int32(best.NumMicroBatches), VirtualStages: int32(best.VirtualStages), Source: planPlanner}
	predict(out, best)
	return out, nil
}

// costConfig is the cost model's view of a job: its model, the hardware of
// the GPUs it asks for, its training settings and the default tunables.
func costConfig(s *jobspec.Spec) (costmodel.Config, bool, error) {
	m, tr, hasModel, err := s.CostModel()
	if err != nil {
		return costmodel.Config{}, false, fmt.Errorf("job %s: model: %w", s.Name, err)
	}
	hwName := s.GPUModel
	if hwName == "" {
		hwName = "h100"
	}
	hw, err := costmodel.LookupHardware(hwName)
	if err != nil {
		return costmodel.Config{}, false, fmt.Errorf("job %s: gpu_model: %w", s.Name, err)
	}
	if s.GPUsPerNode > 0 && s.GPUsPerNode < hw.GPUsPerNode {
		// Tensor parallelism stays inside the GPUs the job takes per node.
		hw.GPUsPerNode = s.GPUsPerNode
	}
	tun := costmodel.DefaultTunables()
	if s.Checkpoint.Interval > 0 {
		tun.CheckpointInterval = s.Checkpoint.Interval
	}
	return costmodel.Config{Model: m, Hardware: hw, Training: tr, Tunables: tun}, hasModel, nil
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
	cfg, hasModel, err := costConfig(s)
	if err != nil || !hasModel {
		return
	}
	plan := costmodel.Plan{TP: int(p.GetTp()), PP: int(p.GetPp()), DP: int(p.GetDp()), MicroBatch: int(p.GetMicroBatch()),
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
	counts := map[costmodel.Reason]int{}
	for _, r := range rs {
		counts[r.Reason]++
	}
	reasons := make([]costmodel.Reason, 0, len(counts))
	for r := range counts {
		reasons = append(reasons, r)
	}
	slices.SortFunc(reasons, func(a, b costmodel.Reason) int {
		if d := counts[b] - counts[a]; d != 0 {
			return d
		}
		return strings.Compare(string(a), string(b))
	})
	parts := make([]string, len(reasons))
	for i, r := range reasons {
		parts[i] = fmt.Sprintf("%s: %d", r, counts[r])
	}
	if len(parts) == 0 {
		return "no candidates"
	}
	return strings.Join(parts, ", ")
}
