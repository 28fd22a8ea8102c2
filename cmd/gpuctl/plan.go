package main

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"regexp"
	"sort"
	"strings"
	"text/tabwriter"

	"github.com/gpuctl/gpuctl/jobspec"
	"github.com/gpuctl/gpuctl/scheduler/costmodel"
	"github.com/gpuctl/gpuctl/scheduler/launch"
	"github.com/spf13/cobra"
)

func init() { subcommands = append(subcommands, newPlanCmd) }

// planFlags are gpuctl plan's options.
type planFlags struct {
	file        string
	model       string
	gpus        int
	gpu         string
	tp, pp, dp  int
	top         int
	output      string
	globalBatch int
	microBatch  []int
	zero        int
	recompute   string
	maxVirtual  int
	uneven      bool
	set         []string
	measured    float64
	name        string
	nodelist    []string
	image       string
}

func newPlanCmd() *cobra.Command {
	var f planFlags
	cmd := &cobra.Command{
		Use:   "plan",
		Short: "Choose tensor/pipeline/data parallelism for a model on N GPUs",
		Long: `plan predicts step time, TFLOP/s per GPU, MFU and memory per GPU for every
parallel layout of a transformer on a number of GPUs (Megatron-style cost model),
ranks the ones that fit, and says why the others lost. It can also emit the
launch configuration of the best plan.`,
		Example: `  gpuctl plan --model gpt3-175b --gpus 1024 --gpu a100-80gb
  gpuctl plan --model gpt-1t --gpus 3072 --gpu h100 --top 3 -o json
  gpuctl plan -f job.yaml -o slurm --nodelist gpu-[01-04]
  gpuctl plan --model llama2-70b --gpus 64 --tp 8 --pp 2 --measured-step 7.9`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			return runPlan(cmd, f)
		},
	}
	fl := cmd.Flags()
	fl.StringVarP(&f.file, "file", "f", "", "job file (YAML) giving the model, GPUs and optionally a fixed plan")
	fl.StringVar(&f.model, "model", "", "model preset: "+strings.Join(costmodel.ModelNames(), ", "))
	fl.IntVar(&f.gpus, "gpus", 0, "number of GPUs")
	fl.StringVar(&f.gpu, "gpu", "", "GPU profile: "+strings.Join(costmodel.HardwareNames(), ", ")+" (default h100)")
	fl.IntVar(&f.tp, "tp", 0, "fix tensor parallelism")
	fl.IntVar(&f.pp, "pp", 0, "fix pipeline parallelism")
	fl.IntVar(&f.dp, "dp", 0, "fix data parallelism")
	fl.IntVar(&f.top, "top", 5, "plans to show")
	fl.StringVarP(&f.output, "output", "o", "table", "table, json, megatron, deepspeed, torchrun, slurm or k8s")
	fl.IntVar(&f.globalBatch, "global-batch", 0, "global batch in sequences (default: the preset's)")
	fl.IntSliceVar(&f.microBatch, "micro-batch", nil, "micro-batch sizes to try (default 1,2,4,8)")
	fl.IntVar(&f.zero, "zero", -1, "ZeRO stage 0-3 (default: the preset's, 1)")
	fl.StringVar(&f.recompute, "recompute", "", "activation recomputation: none, selective or full")
	fl.IntVar(&f.maxVirtual, "max-virtual-stages", 8, "largest interleaving (virtual pipeline stages) to try")
	fl.BoolVar(&f.uneven, "uneven", false, "allow pipeline sizes that do not divide the layers")
	fl.StringArrayVar(&f.set, "set", nil, "override a GPU field or tunable, key=value (e.g. net_gbps=25, efficiency=0.45); repeatable")
	fl.Float64Var(&f.measured, "measured-step", 0, "measured seconds per step of the fixed plan: calibrate the efficiency to it first")
	fl.StringVar(&f.name, "name", "", "job name for launch outputs (default: the job's or model's)")
	fl.StringSliceVar(&f.nodelist, "nodelist", nil, "nodes to place the best plan on, in rank order (slurm, k8s, torchrun)")
	fl.StringVar(&f.image, "image", launch.DefaultImage, "container image for -o k8s")
	return cmd
}

// planInput is what the command plans for, from flags or a job file.
type planInput struct {
	spec   *jobspec.Spec
	model  costmodel.Model
	tr     costmodel.Training
	hw     costmodel.Hardware
	tun    costmodel.Tunables
	gpus   int
	fixed  costmodel.Plan
	mbsSet bool
}

func runPlan(cmd *cobra.Command, f planFlags) error {
	switch f.output {
	case "table", "json", "megatron", "deepspeed", "torchrun", "slurm", "k8s", "kubernetes":
	default:
		return fmt.Errorf("plan: unknown output %q: use table, json, megatron, deepspeed, torchrun, slurm or k8s", f.output)
	}
	in, err := planInputs(cmd, f)
	if err != nil {
		return err
	}
	cfg := costmodel.Config{Model: in.model, Hardware: in.hw, Training: in.tr, Tunables: in.tun}
	if err := cfg.Validate(); err != nil {
		return fmt.Errorf("plan: %w", err)
	}
	if f.measured > 0 {
		p := in.fixed
		if p.TP == 0 || p.PP == 0 {
			return errors.New("plan: --measured-step calibrates one plan: give --tp and --pp (and --dp, or let it follow from --gpus)")
		}
		if p.DP == 0 {
			p.DP = in.gpus / (p.TP * p.PP)
		}
		if p.MicroBatch == 0 {
			p.MicroBatch = 1
		}
		if err := cfg.Calibrate(p, f.measured); err != nil {
			return fmt.Errorf("plan: %w", err)
		}
		in.tun = cfg.Tunables
	}

	opt := costmodel.Options{
		Training: in.tr, Tunables: in.tun,
		TP: in.fixed.TP, PP: in.fixed.PP, DP: in.fixed.DP,
		MaxVirtualStages:    f.maxVirtual,
		AllowUnevenPipeline: f.uneven,
	}
	if len(f.microBatch) > 0 {
		opt.MicroBatchSizes = f.microBatch
	} else if in.fixed.MicroBatch > 0 && in.mbsSet {
		opt.MicroBatchSizes = []int{in.fixed.MicroBatch}
	}
	if in.fixed.VirtualStages > 0 {
		opt.MaxVirtualStages = in.fixed.VirtualStages
	}
	ranked, rejected := costmodel.Search(in.model, in.hw, in.gpus, opt)
	if in.fixed.VirtualStages > 1 {
		// A fixed interleaving keeps only that v.
		ranked = planKeep(ranked, func(e costmodel.Evaluation) bool { return e.VirtualStages == in.fixed.VirtualStages })
	}
	out := cmd.OutOrStdout()
	if len(ranked) == 0 {
		if f.output == "json" {
			if err := writePlanJSON(out, in, ranked, rejected, f.top); err != nil {
				return err
			}
		}
		return planNoFitError(in, rejected)
	}

	switch f.output {
	case "table":
		return writePlanTable(out, in, ranked, rejected, f.top)
	case "json":
		return writePlanJSON(out, in, ranked, rejected, f.top)
	default:
		return writePlanLaunch(out, f, in, ranked[0])
	}
}

func planKeep(evs []costmodel.Evaluation, ok func(costmodel.Evaluation) bool) []costmodel.Evaluation {
	var out []costmodel.Evaluation
	for _, e := range evs {
		if ok(e) {
			out = append(out, e)
		}
	}
	return out
}

// planInputs resolves the job file and flags (flags win) into planInput.
func planInputs(cmd *cobra.Command, f planFlags) (planInput, error) {
	var in planInput
	gpuName := f.gpu
	if f.file != "" {
		s, err := jobspec.ParseFile(f.file)
		if err != nil {
			return in, err
		}
		in.spec = s
		m, tr, ok, err := s.CostModel()
		if err != nil {
			return in, fmt.Errorf("%s: %w", f.file, err)
		}
		if !ok && f.model == "" {
			return in, fmt.Errorf("%s has no model section: add one (model: {preset: gpt3-175b}) or pass --model", f.file)
		}
		in.model, in.tr = m, tr
		in.gpus = s.TotalGPUs()
		if gpuName == "" {
			gpuName = s.GPUModel
		}
		if p, ok := s.FixedPlan(); ok {
			in.fixed = p
			in.mbsSet = s.Model != nil && s.Model.MicroBatch > 0
		} else if s.Model != nil && s.Model.MicroBatch > 0 {
			in.fixed.MicroBatch = s.Model.MicroBatch
			in.mbsSet = true
		}
	}
	if f.model != "" {
		m, tr, err := costmodel.LookupModel(f.model)
		if err != nil {
			return in, fmt.Errorf("plan: %w", err)
		}
		in.model, in.tr = m, tr
	}
	if in.model.Layers == 0 {
		return in, errors.New("plan: no model: pass --model (" + strings.Join(costmodel.ModelNames(), ", ") + ") or -f job.yaml")
	}
	if f.gpus != 0 {
		in.gpus = f.gpus
	}
	if in.gpus <= 0 {
		return in, errors.New("plan: how many GPUs? pass --gpus N (or gpus in the job file)")
	}
	if gpuName == "" {
		gpuName = "h100"
	}
	hw, err := costmodel.LookupHardware(gpuName)
	if err != nil {
		return in, fmt.Errorf("plan: %w", err)
	}
	in.hw = hw
	in.tun = costmodel.DefaultTunables()
	if in.spec != nil && in.spec.Checkpoint.Interval > 0 {
		in.tun.CheckpointInterval = in.spec.Checkpoint.Interval
	}
	for _, kv := range f.set {
		k, v, ok := strings.Cut(kv, "=")
		if !ok {
			return in, fmt.Errorf("plan: --set %q: use key=value", kv)
		}
		errHW := in.hw.Set(k, v)
		if errHW == nil {
			continue
		}
		errTun := in.tun.Set(k, v)
		if errTun == nil {
			continue
		}
		switch {
		case !strings.HasPrefix(errHW.Error(), "unknown"):
			return in, fmt.Errorf("plan: --set %s: %w", kv, errHW)
		case !strings.HasPrefix(errTun.Error(), "unknown"):
			return in, fmt.Errorf("plan: --set %s: %w", kv, errTun)
		}
		return in, fmt.Errorf("plan: --set %s: unknown key %q: gpu fields are %s; tunables are %s", kv, k,
			strings.Join(costmodel.HardwareFields, ", "), strings.Join(costmodel.TunableFields, ", "))
	}
	if f.globalBatch != 0 {
		in.tr.GlobalBatch = f.globalBatch
	}
	if cmd.Flags().Changed("zero") {
		in.tr.ZeROStage = f.zero
	}
	if f.recompute != "" {
		in.tr.Recompute = costmodel.Recompute(f.recompute)
	}
	if f.tp != 0 {
		in.fixed.TP = f.tp
	}
	if f.pp != 0 {
		in.fixed.PP = f.pp
	}
	if f.dp != 0 {
		in.fixed.DP = f.dp
	}
	return in, nil
}

// planDescribe is the one-line header of a plan report.
func planDescribe(in planInput) string {
	m, tr := in.model, in.tr
	name := m.Name
	if name == "" {
		name = "model"
	}
	parts := []string{
		fmt.Sprintf("global batch %d", tr.GlobalBatch),
		string(planOrDefault(string(tr.Precision), "bf16")),
		fmt.Sprintf("ZeRO-%d", tr.ZeROStage),
		planOrDefault(string(tr.Recompute), "no") + " recompute",
	}
	if tr.SequenceParallel {
		parts = append(parts, "sequence parallel")
	}
	return fmt.Sprintf("%s (%.1fB params) on %d × %s (%s)", name, m.Params()/1e9, in.gpus, in.hw.Name, strings.Join(parts, ", "))
}

func planOrDefault(s, d string) string {
	if s == "" {
		return d
	}
	return s
}

func writePlanTable(w io.Writer, in planInput, ranked []costmodel.Evaluation, rejected []costmodel.Rejection, top int) error {
	fmt.Fprintln(w, planDescribe(in))
	fmt.Fprintf(w, "efficiency %.2f of peak %.0f TFLOP/s, dp overlap %.0f%%\n\n", in.tun.Efficiency, in.hw.PeakTFLOPS, in.tun.DPOverlap*100)
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "#\tTP\tPP\tDP\tMBS\tM\tV\tSTEP\tTFLOP/S/GPU\tMFU\tMEM/GPU\tBUBBLE\tTOKENS/S\t")
	shown := ranked
	if top > 0 && len(shown) > top {
		shown = shown[:top]
	}
	for i, e := range shown {
		fmt.Fprintf(tw, "%d\t%d\t%d\t%d\t%d\t%d\t%d\t%.2fs\t%.0f\t%.1f%%\t%s\t%.1f%%\t%.0f\t\n",
			i+1, e.TP, e.PP, e.DP, e.MicroBatch, e.NumMicroBatches, e.VirtualStages, e.StepSeconds,
			e.TFLOPSPerGPU, e.MFU*100, costmodel.FormatBytes(e.MemPerGPUBytes), e.BubbleSec/e.StepSeconds*100, e.TokensPerSec)
	}
	if err := tw.Flush(); err != nil {
		return fmt.Errorf("plan: write table: %w", err)
	}
	best := ranked[0]
	fmt.Fprintf(w, "\nbest: %s — compute %.2fs, bubble %.2fs, tp comm %.2fs, pp comm %.2fs, dp comm %.2fs (%.2fs exposed)\n",
		best.Plan, best.ComputeSec, best.BubbleSec, best.TPCommSec, best.PPCommSec, best.DPCommSec, best.DPExposedSec)
	fmt.Fprintf(w, "      memory %s weights + %s grads + %s optimizer + %s activations + %s reserved\n",
		costmodel.FormatBytes(best.WeightBytes), costmodel.FormatBytes(best.GradBytes), costmodel.FormatBytes(best.OptimizerB),
		costmodel.FormatBytes(best.ActivationB), costmodel.FormatBytes(best.ReservedBytes))
	fmt.Fprintf(w, "      checkpoint %.0fs (%.1f%% of the interval), restart %.0fs\n", best.CheckpointSec, best.CheckpointOverhead*100, best.StartupSec)
	for _, n := range best.Notes {
		fmt.Fprintf(w, "      note: %s\n", n)
	}

	// Plans beyond the shown ones lost on speed.
	lost := planCopyRejections(rejected)
	for _, e := range ranked[len(shown):] {
		ev := e
		lost = append(lost, costmodel.Rejection{Plan: e.Plan, Reason: costmodel.ReasonSlower, Evaluation: &ev,
			Detail: fmt.Sprintf("slower by %.1f%%", (e.StepSeconds/best.StepSeconds-1)*100)})
	}
	if len(lost) == 0 {
		return nil
	}
	fmt.Fprintf(w, "\nwhy the others lost (%d plans or families):\n", len(lost))
	for _, rc := range planReasonCounts(lost) {
		fmt.Fprintf(w, "  %-26s %d\n", rc.reason, rc.count)
	}
	if cl := planClosest(lost, 5); len(cl) > 0 {
		fmt.Fprintln(w, "closest losers:")
		for _, r := range cl {
			fmt.Fprintf(w, "  %-36s %s: %s\n", r.Plan, r.Reason, r.Detail)
		}
	}
	return nil
}

// planCopyRejections copies rejections so the table can append to them.
func planCopyRejections(r []costmodel.Rejection) []costmodel.Rejection {
	return append([]costmodel.Rejection(nil), r...)
}

type planReasonCount struct {
	reason costmodel.Reason
	count  int
}

func planReasonCounts(rej []costmodel.Rejection) []planReasonCount {
	m := map[costmodel.Reason]int{}
	for _, r := range rej {
		m[r.Reason]++
	}
	out := make([]planReasonCount, 0, len(m))
	for r, c := range m {
		out = append(out, planReasonCount{r, c})
	}
	sort.Slice(out, func(i, j int) bool {
		if out[i].count != out[j].count {
			return out[i].count > out[j].count
		}
		return out[i].reason < out[j].reason
	})
	return out
}

// planClosest picks the losers nearest to winning: fitting plans by how
// little slower they are, alternating with out-of-memory plans by how
// little they overflow.
func planClosest(rej []costmodel.Rejection, n int) []costmodel.Rejection {
	var slower, oom []costmodel.Rejection
	for _, r := range rej {
		switch {
		case r.Reason == costmodel.ReasonSlower && r.Evaluation != nil:
			slower = append(slower, r)
		case r.Reason == costmodel.ReasonOutOfMemory && r.MemPerGPUBytes > 0:
			oom = append(oom, r)
		}
	}
	sort.SliceStable(slower, func(a, b int) bool { return slower[a].Evaluation.StepSeconds < slower[b].Evaluation.StepSeconds })
	sort.SliceStable(oom, func(a, b int) bool { return oom[a].MemPerGPUBytes < oom[b].MemPerGPUBytes })
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

// planJSON is -o json's document.
type planJSON struct {
	Model    costmodel.Model        `json:"model"`
	GPU      costmodel.Hardware     `json:"gpu"`
	GPUs     int                    `json:"gpus"`
	Training costmodel.Training     `json:"training"`
	Tunables costmodel.Tunables     `json:"tunables"`
	Plans    []costmodel.Evaluation `json:"plans"`
	// RejectedCounts counts why plans lost, by reason.
	RejectedCounts map[costmodel.Reason]int `json:"rejected_counts"`
	ClosestLosers  []costmodel.Rejection    `json:"closest_losers"`
}

func writePlanJSON(w io.Writer, in planInput, ranked []costmodel.Evaluation, rejected []costmodel.Rejection, top int) error {
	shown := ranked
	lost := planCopyRejections(rejected)
	if top > 0 && len(shown) > top {
		for _, e := range shown[top:] {
			ev := e
			lost = append(lost, costmodel.Rejection{Plan: e.Plan, Reason: costmodel.ReasonSlower, Evaluation: &ev,
				Detail: fmt.Sprintf("slower by %.1f%%", (e.StepSeconds/shown[0].StepSeconds-1)*100)})
		}
		shown = shown[:top]
	}
	doc := planJSON{Model: in.model, GPU: in.hw, GPUs: in.gpus, Training: in.tr, Tunables: in.tun,
		Plans: shown, RejectedCounts: map[costmodel.Reason]int{}, ClosestLosers: planClosest(lost, 5)}
	if doc.Plans == nil {
		doc.Plans = []costmodel.Evaluation{}
	}
	for _, rc := range planReasonCounts(lost) {
		doc.RejectedCounts[rc.reason] = rc.count
	}
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	if err := enc.Encode(doc); err != nil {
		return fmt.Errorf("plan: write json: %w", err)
	}
	return nil
}

// planNoFitError explains an empty result and what to change.
func planNoFitError(in planInput, rejected []costmodel.Rejection) error {
	var b strings.Builder
	fmt.Fprintf(&b, "plan: no plan for %s fits\n", planDescribe(in))
	for _, rc := range planReasonCounts(rejected) {
		fmt.Fprintf(&b, "  %-26s %d\n", rc.reason, rc.count)
	}
	for _, r := range rejected {
		if r.Reason == costmodel.ReasonInvalidInput {
			return fmt.Errorf("plan: %s", r.Detail)
		}
	}
	if cl := planClosest(rejected, 1); len(cl) > 0 {
		fmt.Fprintf(&b, "closest: %s: %s\n", cl[0].Plan, cl[0].Detail)
	} else if len(rejected) > 0 {
		fmt.Fprintf(&b, "for example: %s: %s\n", rejected[0].Plan, rejected[0].Detail)
	}
	b.WriteString("try: more GPUs (--gpus), --recompute full, --zero 3, --uneven, a larger GPU (--gpu h200), or drop a fixed --tp/--pp/--dp")
	return errors.New(b.String())
}

var planNonLabel = regexp.MustCompile(`[^a-z0-9-]+`)

// writePlanLaunch emits the best plan's launch configuration.
func writePlanLaunch(w io.Writer, f planFlags, in planInput, best costmodel.Evaluation) error {
	m := in.model
	j := launch.Job{
		Name:     f.name,
		Command:  []string{"python", "pretrain_gpt.py"},
		Model:    &m,
		Training: in.tr,
		Plan:     best.Plan,
		Image:    f.image,
	}
	if s := in.spec; s != nil {
		if j.Name == "" {
			j.Name = s.Name
		}
		j.Command, j.Env, j.CheckpointDir = s.Command, s.Env, s.Checkpoint.Dir
		if s.GPUsPerNode > 0 {
			j.GPUsPerNode = s.GPUsPerNode
		}
	}
	if j.Name == "" {
		j.Name = strings.Trim(planNonLabel.ReplaceAllString(strings.ToLower(m.Name), "-"), "-")
	}
	if j.GPUsPerNode == 0 {
		j.GPUsPerNode = in.hw.GPUsPerNode
	}
	if len(f.nodelist) > 0 {
		j.Placement = &launch.Placement{Nodes: f.nodelist, GPUsPerNode: j.GPUsPerNode}
	}
	var text string
	switch f.output {
	case "megatron":
		args, err := launch.MegatronArgs(j)
		if err != nil {
			return err
		}
		text = strings.Join(args, " ") + "\n"
	case "deepspeed":
		out, err := launch.DeepSpeedConfig(j)
		if err != nil {
			return err
		}
		text = string(out)
	case "torchrun":
		s, err := launch.TorchrunScript(j)
		if err != nil {
			return err
		}
		text = s
	case "slurm":
		s, err := launch.SlurmScript(j)
		if err != nil {
			return err
		}
		text = s
	default:
		s, err := launch.KubernetesManifest(j)
		if err != nil {
			return err
		}
		text = s
	}
	_, err := io.WriteString(w, text)
	return err
}
