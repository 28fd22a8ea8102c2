package views

import (
	"cmp"
	"errors"
	"fmt"
	"io"
	"slices"
	"strings"
	"text/tabwriter"

	"github.com/gpuctl/gpuctl/scheduler/costmodel"
	"github.com/gpuctl/gpuctl/scheduler/planner"
)

// PlanReport is what `gpuctl plan` reports: the request, what the search
// ranked and rejected, and how many of the ranked to show.
type PlanReport struct {
	Request planner.Request
	// Calibration is what --measured-step moved; nil without it.
	Calibration *costmodel.Calibration
	// MTBFSource says where the failure rate comes from.
	MTBFSource string
	Ranked     []costmodel.Evaluation
	Rejected   []costmodel.Rejection
	Top        int
}

// Describe is the one-line header of a plan report.
func (r PlanReport) Describe() string {
	m, tr := r.Request.Model, r.Request.Training
	name := m.Name
	if name == "" {
		name = "model"
	}
	parts := []string{
		fmt.Sprintf("global batch %d", tr.GlobalBatch),
		cmp.Or(string(tr.Precision), "bf16"),
		fmt.Sprintf("ZeRO-%d", tr.ZeROStage),
		cmp.Or(string(tr.Recompute), "no") + " recompute",
		cmp.Or(string(tr.Attention), "flash") + " attention",
	}
	if tr.SequenceParallel {
		parts = append(parts, "sequence parallel")
	}
	return fmt.Sprintf("%s (%.1fB params) on %d × %s (%s)", name, m.Params()/1e9, r.Request.GPUs, r.Request.Hardware.Name, strings.Join(parts, ", "))
}

// WritePlanTable writes the ranked plans, the best one's breakdown and
// why the others lost.
func WritePlanTable(w io.Writer, r PlanReport) error {
	in, ranked, rejected, top := r.Request, r.Ranked, r.Rejected, r.Top
	fmt.Fprintln(w, r.Describe())
	t := in.Tunables
	generation := ""
	if t.StackComputeScale != 1 {
		generation = fmt.Sprintf(" × the stack's stack_compute_scale %.3g", t.StackComputeScale)
	}
	fmt.Fprintf(w, "kernels as fitted for %s × compute_scale %.3g%s, communication × comm_scale %.3g\n", in.Hardware.Name, t.Efficiency, generation, t.CommScale)
	fmt.Fprintf(w, "stack %s: overlap tp %.0f%% cp %.0f%% pp %.0f%% dp-grad %.0f%% dp-param %.0f%% zero-3 %.0f%%, gradients %g bytes/param\n",
		cmp.Or(in.Training.Stack, costmodel.DefaultStack), t.TPOverlap*100, t.CPOverlap*100, t.PPOverlap*100, t.DPGradOverlap*100, t.DPParamOverlap*100,
		t.ZeRO3Overlap*100, t.GradBytes)
	if c := r.Calibration; c != nil {
		fmt.Fprintf(w, "calibrated to the measured %.3gs step (predicted %.3gs): moved %s %.4g → %.4g, the %s stack's overlaps kept\n",
			c.MeasuredStepSec, c.PredictedStepSec, c.Term, c.From, c.To, c.Stack)
	}
	fmt.Fprintln(w)
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "#\tTP\tCP\tPP\tDP\tMBS\tM\tV\tSTEP\tEFF STEP\tTFLOP/S/GPU\tMFU\tMEM/GPU\tBUBBLE\tGOODPUT\tTOKENS/S\t")
	shown := ranked
	if top > 0 && len(shown) > top {
		shown = shown[:top]
	}
	for i, e := range shown {
		goodput := "-"
		if e.Goodput != nil {
			goodput = fmt.Sprintf("%.1f%%", e.Goodput.Fraction*100)
		}
		fmt.Fprintf(tw, "%d\t%d\t%d\t%d\t%d\t%d\t%d\t%d\t%.2fs\t%.2fs\t%.0f\t%.1f%%\t%s\t%.1f%%\t%s\t%.0f\t\n",
			i+1, e.TP, max(e.CP, 1), e.PP, e.DP, e.MicroBatch, e.NumMicroBatches, e.VirtualStages, e.StepSeconds, planner.Effective(&e),
			e.TFLOPSPerGPU, e.MFU*100, costmodel.FormatBytes(e.MemPerGPUBytes), e.BubbleSec/e.StepSeconds*100, goodput, e.TokensPerSec)
	}
	if err := tw.Flush(); err != nil {
		return fmt.Errorf("write table: %w", err)
	}
	best := ranked[0]
	fmt.Fprintf(w, "\nbest: %s — compute %.2fs (GEMM %.2fs at %.0f%% of peak, attention %.2fs, element-wise %.2fs), bubble %.2fs, optimizer %.2fs\n",
		best.Plan, best.ComputeSec, best.GEMMSec, best.GEMMEfficiency*100, best.AttentionSec, best.ElementwiseSec, best.BubbleSec, best.OptimizerSec)
	fmt.Fprintf(w, "      exposed comm: tp %.2fs of %.2fs, cp %.2fs of %.2fs, pp %.2fs of %.2fs, dp %.2fs of %.2fs, zero-3 %.2fs of %.2fs\n",
		best.TPExposedSec, best.TPCommSec, best.CPExposedSec, best.CPCommSec, best.PPExposedSec, best.PPCommSec,
		best.DPExposedSec, best.DPCommSec, best.ZeRO3ExposedSec, best.ZeRO3CommSec)
	fmt.Fprintf(w, "      memory (stage %d): %s weights + %s grads + %s optimizer + %s activations + %s buffers + %s reserved + %s fragmentation\n",
		best.MemoryStage, costmodel.FormatBytes(best.WeightBytes), costmodel.FormatBytes(best.GradBytes), costmodel.FormatBytes(best.OptimizerB),
		costmodel.FormatBytes(best.ActivationB), costmodel.FormatBytes(best.CommBufferBytes), costmodel.FormatBytes(best.ReservedBytes),
		costmodel.FormatBytes(best.FragmentationBytes))
	fmt.Fprintf(w, "      checkpoint %.0fs", best.CheckpointSec)
	if best.CheckpointIntervalSec > 0 {
		fmt.Fprintf(w, " every %s (%.1f%% of the interval)", Span(best.CheckpointIntervalSec), best.CheckpointOverhead*100)
	}
	fmt.Fprintf(w, ", restart %.0fs\n", best.StartupSec)
	if g := best.Goodput; g != nil {
		fmt.Fprintf(w, "      failures: MTBF %s (%s): goodput %.1f%%, %.0fs lost per interruption, effective step %.2fs\n",
			Span(g.MTBFSec), r.MTBFSource, g.Fraction*100, g.LostSecPerFailure, g.EffectiveStepSec)
	}
	if best.TrainSeconds > 0 {
		fmt.Fprintf(w, "      %.3g tokens: %s without failures", in.Training.TrainTokens, Span(best.TrainSeconds))
		if g := best.Goodput; g != nil {
			fmt.Fprintf(w, ", %s effective with %.0f interruptions", Span(g.EffectiveTrainSec), g.ExpectedFailures)
		}
		fmt.Fprintln(w)
	}
	for _, n := range best.Notes {
		fmt.Fprintf(w, "      note: %s\n", n)
	}

	// Plans beyond the shown ones lost on speed.
	lost := planner.Lost(ranked, rejected, len(shown))
	if len(lost) == 0 {
		return nil
	}
	fmt.Fprintf(w, "\nwhy the others lost (%d plans or families):\n", len(lost))
	for _, rc := range planner.Reasons(lost) {
		fmt.Fprintf(w, "  %-28s %d\n", rc.Reason, rc.Count)
	}
	if cl := planner.Closest(lost, 5); len(cl) > 0 {
		fmt.Fprintln(w, "closest losers:")
		for _, r := range cl {
			fmt.Fprintf(w, "  %-40s %s: %s\n", r.Plan, r.Reason, r.Detail)
		}
	}
	return nil
}

// WritePlanJSON writes the plan document (planner.NewDocument).
func WritePlanJSON(w io.Writer, r PlanReport) error {
	req := planner.Request{Model: r.Request.Model, Training: r.Request.Training, Hardware: r.Request.Hardware,
		Tunables: r.Request.Tunables, GPUs: r.Request.GPUs}
	return WriteDocument(w, planner.NewDocument(req, r.Calibration, r.MTBFSource, r.Ranked, r.Rejected, r.Top))
}

// PlanNoFit explains an empty result and what to change.
func PlanNoFit(r PlanReport) error {
	rejected := r.Rejected
	var b strings.Builder
	fmt.Fprintf(&b, "no plan for %s fits\n", r.Describe())
	for _, rc := range planner.Reasons(rejected) {
		fmt.Fprintf(&b, "  %-28s %d\n", rc.Reason, rc.Count)
	}
	for _, r := range rejected {
		if r.Reason == costmodel.ReasonInvalidInput {
			return errors.New(r.Detail)
		}
	}
	if cl := planner.Closest(rejected, 1); len(cl) > 0 {
		fmt.Fprintf(&b, "closest: %s: %s\n", cl[0].Plan, cl[0].Detail)
	} else if len(rejected) > 0 {
		fmt.Fprintf(&b, "for example: %s: %s\n", rejected[0].Plan, rejected[0].Detail)
	}
	b.WriteString("try: more GPUs (--gpus), --recompute full, --zero 3, a larger GPU (--gpu h200), or drop a fixed --tp/--cp/--pp/--dp")
	if slices.ContainsFunc(rejected, func(r costmodel.Rejection) bool { return r.Reason == costmodel.ReasonLayersNotDivisible }) {
		fmt.Fprintf(&b, "; --uneven (the default) also tries the plans whose pipeline does not divide the %d layers", r.Request.Model.Layers)
	}
	return errors.New(b.String())
}
