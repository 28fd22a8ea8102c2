package main

import (
	"cmp"
	"errors"
	"fmt"
	"io"
	"regexp"
	"slices"
	"strings"
	"time"

	"github.com/gpuctl/gpuctl/jobspec"
	"github.com/gpuctl/gpuctl/scheduler/costmodel"
	"github.com/gpuctl/gpuctl/scheduler/launch"
	"github.com/gpuctl/gpuctl/scheduler/planner"
	"github.com/gpuctl/gpuctl/views"
	"github.com/spf13/cobra"
)

func init() { subcommands = append(subcommands, newPlanCmd) }

// planFlags are gpuctl plan's options.
type planFlags struct {
	file           string
	model          string
	gpus           int
	gpu            string
	tp, cp, pp, dp int
	maxCP          int
	top            int
	output         string
	globalBatch    int
	microBatch     []int
	zero           int
	recompute      string
	maxVirtual     int
	uneven         bool
	attention      string
	stack          string
	set            []string
	measured       float64
	mtbf           time.Duration
	gpuMTBF        time.Duration
	tokens         float64
	name           string
	nodelist       []string
	image          string
}

func newPlanCmd() *cobra.Command {
	var f planFlags
	cmd := &cobra.Command{
		Use:   "plan",
		Short: "Choose tensor/pipeline/data parallelism for a model on N GPUs",
		Long: `plan predicts step time, TFLOP/s per GPU, MFU and memory per GPU for every
parallel layout of a transformer on a number of GPUs — tensor, context, pipeline
(plain or interleaved 1F1B) and data parallelism with any ZeRO stage — ranks the ones that fit, and says why the others lost. Kernel speeds
are fitted per GPU to published runs (docs/costmodel.md); every tunable is in
-o json and settable with --set. With a failure rate (--mtbf for the job, or
--gpu-mtbf per GPU; by default the Llama 3 run's 419 interruptions in 54 days on
16,384 H100s) each plan also gets its goodput and effective step time, and with
--tokens the run's effective training time. It can also emit the launch
configuration of the best plan. With -f it makes the same search gpuctl serve
makes for that job file: context parallelism for sequences of 8K and more, pipelines
whose stages do not divide the layers, interleaving; --max-cp widens the
context parallelism tried, --uneven=false keeps to even pipelines.`,
		Example: `  gpuctl plan --model gpt3-175b --gpus 1024 --gpu a100-80gb
  gpuctl plan --model gpt-1t --gpus 3072 --gpu h100 --top 3 -o json
  gpuctl plan --model llama3-405b --gpus 16384 --gpu h100 --mtbf 3h --tokens 15.6e12
  gpuctl plan -f job.yaml -o slurm --nodelist gpu-[01-04]
  gpuctl plan --model llama2-70b --gpus 64 --tp 8 --pp 2 --measured-step 7.9
  gpuctl plan --model gpt3-175b --gpus 1024 --stack megatron-core-2024 --set tp_overlap=0.5`,
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
	fl.IntVar(&f.cp, "cp", 0, "fix context parallelism (ring attention)")
	fl.IntVar(&f.maxCP, "max-cp", 0, "largest context parallelism to try (default: while each rank keeps 4K tokens or more, up to 16)")
	fl.IntVar(&f.pp, "pp", 0, "fix pipeline parallelism")
	fl.IntVar(&f.dp, "dp", 0, "fix data parallelism")
	fl.IntVar(&f.top, "top", 5, "plans to show")
	fl.StringVarP(&f.output, "output", "o", "table", "table, json, megatron, deepspeed, torchrun, slurm or k8s")
	fl.IntVar(&f.globalBatch, "global-batch", 0, "global batch in sequences (default: the preset's)")
	fl.IntSliceVar(&f.microBatch, "micro-batch", nil, "micro-batch sizes to try (default 1,2,4,8)")
	fl.IntVar(&f.zero, "zero", -1, "ZeRO stage 0-3 (default: the preset's, 1)")
	fl.StringVar(&f.recompute, "recompute", "", "activation recomputation: none, selective or full")
	fl.IntVar(&f.maxVirtual, "max-virtual-stages", planner.MaxVirtualStages, "largest interleaving (virtual pipeline stages) to try")
	fl.BoolVar(&f.uneven, "uneven", true, "also try pipelines that do not divide the layers (first and last stages count the embedding and output layers), as a job file can say; =false keeps to even ones")
	fl.StringVar(&f.attention, "attention", "", "attention kernel: flash (default) or unfused")
	fl.StringVar(&f.stack, "stack", "", "training stack, which sets the overlap terms and its kernels' generation: "+strings.Join(costmodel.StackNames(), ", ")+
		" (default: the job file's model.stack, else "+costmodel.DefaultStack+"); --set overrides single terms")
	fl.StringArrayVar(&f.set, "set", nil, "override a GPU field or tunable by its -o json name, key=value (e.g. net_bytes_per_second=25GB/s, compute_scale=0.9, checkpoint_write_bytes_per_second=2TB/s); repeatable")
	fl.Float64Var(&f.measured, "measured-step", 0, "measured seconds per step of the fixed plan: calibrate to it first (reports the term moved)")
	fl.DurationVar(&f.mtbf, "mtbf", 0, "mean time between the job's interruptions, e.g. 3h")
	fl.DurationVar(&f.gpuMTBF, "gpu-mtbf", 0, "mean time between interruptions per GPU (the job's MTBF is this over its GPUs), e.g. 50700h")
	fl.Float64Var(&f.tokens, "tokens", 0, "training tokens of the run, for its (effective) training time, e.g. 15.6e12")
	fl.StringVar(&f.name, "name", "", "job name for launch outputs (default: the job's or model's)")
	fl.StringSliceVar(&f.nodelist, "nodelist", nil, "nodes to place the best plan on, in rank order (slurm, k8s, torchrun)")
	fl.StringVar(&f.image, "image", launch.DefaultImage, "container image for -o k8s")
	return cmd
}

// planInput is what the command plans for, from flags or a job file.
type planInput struct {
	spec  *jobspec.Spec
	model costmodel.Model
	tr    costmodel.Training
	hw    costmodel.Hardware
	tun   costmodel.Tunables
	gpus  int
	fixed costmodel.Plan
	// mbs are the micro-batch sizes the job file allows (nil: any).
	mbs []int
	// cal is what --measured-step moved.
	cal *costmodel.Calibration
	// mtbfSource says where the failure rate comes from.
	mtbfSource string
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
			p.DP = in.gpus / (p.TP * max(p.CP, 1) * p.PP)
		}
		if p.MicroBatch == 0 {
			p.MicroBatch = 1
		}
		cal, err := cfg.CalibrateReport(p, f.measured)
		if err != nil {
			return fmt.Errorf("plan: %w", err)
		}
		in.tun, in.cal = cfg.Tunables, &cal
	}

	req := planner.Request{Model: in.model, Training: in.tr, Hardware: in.hw, Tunables: in.tun, GPUs: in.gpus,
		Fixed: in.fixed, MicroBatchSizes: in.mbs, MaxCP: f.maxCP, MaxVirtualStages: f.maxVirtual, EvenOnly: !f.uneven}
	if len(f.microBatch) > 0 {
		req.MicroBatchSizes = f.microBatch
	}
	ranked, rejected := planner.Search(req)
	out := cmd.OutOrStdout()
	report := views.PlanReport{Request: req, Calibration: in.cal, MTBFSource: in.mtbfSource, Ranked: ranked, Rejected: rejected, Top: f.top}
	if len(ranked) == 0 {
		if f.output == "json" {
			if err := views.WritePlanJSON(out, report); err != nil {
				return fmt.Errorf("plan: %w", err)
			}
		}
		return fmt.Errorf("plan: %w", views.PlanNoFit(report))
	}

	switch f.output {
	case "table":
		if err := views.WritePlanTable(out, report); err != nil {
			return fmt.Errorf("plan: %w", err)
		}
		return nil
	case "json":
		if err := views.WritePlanJSON(out, report); err != nil {
			return fmt.Errorf("plan: %w", err)
		}
		return nil
	}
	// The launch configurations split layers evenly over the chunks.
	even := slices.DeleteFunc(slices.Clone(ranked), func(e costmodel.Evaluation) bool { return in.model.Layers%(e.PP*max(e.VirtualStages, 1)) != 0 })
	if len(even) == 0 {
		return fmt.Errorf("plan: every plan that fits splits the %d layers unevenly (best: %s), which -o %s does not emit: use --uneven=false or fix --pp to a divisor of the layers",
			in.model.Layers, ranked[0].Plan, f.output)
	}
	return writePlanLaunch(out, f, in, even[0])
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
		req, ok, err := planner.ForSpec(s)
		if err != nil {
			return in, fmt.Errorf("%s: %w", f.file, err)
		}
		if !ok && f.model == "" {
			return in, fmt.Errorf("%s has no model section: add one (model: {preset: gpt3-175b}) or pass --model", f.file)
		}
		in.model, in.tr, in.gpus, in.fixed, in.mbs, in.tun = req.Model, req.Training, req.GPUs, req.Fixed, req.MicroBatchSizes, req.Tunables
		if f.gpu == "" {
			in.hw = req.Hardware
		}
	}
	if f.model != "" {
		m, tr, err := costmodel.LookupModel(f.model)
		if err != nil {
			return in, fmt.Errorf("plan: %w", err)
		}
		tr.Stack = in.tr.Stack // the job file's stack, whose overlaps in.tun carries
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
	if in.hw.Name == "" {
		hw, err := costmodel.LookupHardware(cmp.Or(gpuName, planner.DefaultGPU))
		if err != nil {
			return in, fmt.Errorf("plan: %w", err)
		}
		in.hw = hw
	}
	if in.spec == nil {
		in.tun = planner.Tunables()
	}
	if f.stack != "" {
		in.tr.Stack = f.stack
	}
	if f.stack != "" || in.spec == nil {
		if err := in.tun.ApplyStack(in.tr.Stack); err != nil {
			return in, fmt.Errorf("plan: --stack: %w", err)
		}
	}
	in.mtbfSource = "Llama 3's 419 interruptions in 54 days on 16,384 H100s, per GPU"
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
	for _, kv := range f.set {
		if k, _, _ := strings.Cut(kv, "="); strings.HasPrefix(k, "mtbf") {
			in.mtbfSource = "--set " + kv
		}
	}
	switch {
	case f.mtbf < 0 || f.gpuMTBF < 0:
		return in, errors.New("plan: --mtbf and --gpu-mtbf must not be negative")
	case f.mtbf > 0 && f.gpuMTBF > 0:
		return in, errors.New("plan: give --mtbf (the job's) or --gpu-mtbf (per GPU), not both")
	case f.mtbf > 0:
		in.tun.MTBF, in.tun.MTBFReferenceGPUs = f.mtbf, 0
		in.mtbfSource = "--mtbf " + f.mtbf.String()
	case f.gpuMTBF > 0:
		in.tun.MTBF, in.tun.MTBFReferenceGPUs = f.gpuMTBF, 1
		in.mtbfSource = "--gpu-mtbf " + f.gpuMTBF.String()
	}
	if f.tokens < 0 {
		return in, fmt.Errorf("plan: --tokens %g: must not be negative", f.tokens)
	}
	in.tr.TrainTokens = f.tokens
	if f.attention != "" {
		in.tr.Attention = costmodel.Attention(f.attention)
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
	if f.cp != 0 {
		in.fixed.CP = f.cp
	}
	if f.pp != 0 {
		in.fixed.PP = f.pp
	}
	if f.dp != 0 {
		in.fixed.DP = f.dp
	}
	return in, nil
}

var planNonLabel = regexp.MustCompile(`[^a-z0-9-]+`)

// writePlanLaunch emits the best plan's launch configuration.
func writePlanLaunch(w io.Writer, f planFlags, in planInput, best costmodel.Evaluation) error {
	if best.CP > 1 {
		return fmt.Errorf("plan: the best plan %s uses context parallelism, which -o %s does not emit yet: fix --cp 1 or use -o json", best.Plan, f.output)
	}
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
