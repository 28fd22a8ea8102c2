package main

import (
	"errors"
	"fmt"
	"math"
	"os"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/gpuctl/gpuctl/scheduler"
	"github.com/gpuctl/gpuctl/scheduler/costmodel"
	"github.com/gpuctl/gpuctl/scheduler/planner"
	"github.com/gpuctl/gpuctl/scheduler/simulate"
	"github.com/gpuctl/gpuctl/scheduler/trace"
	"github.com/gpuctl/gpuctl/views"
)

func init() { subcommands = append(subcommands, newSimulateCmd) }

// comparePolicies are the policies --compare runs side by side.
var comparePolicies = []string{"fifo", "sjf", "las", "priority", "fair", "backfill", "sjf+backfill", "las+backfill", "priority+backfill"}

// simFlags are gpuctl simulate's options: a trace replay, or with --model
// a long run under failures.
type simFlags struct {
	tracePath, policy, output string
	nodes, gpn, tenants       int
	ckpt                      time.Duration
	compare, noEstimates      bool
	policyWeights             string
	mix                       []string
	hetero                    string

	model, gpu         string
	gpus               int
	tp, cp, pp, zero   int
	virtual            int
	uneven             bool
	mtbf, gpuMTBF      time.Duration
	tokens             float64
	steps              int
	spares             int
	repair             time.Duration
	gpuShare           float64
	seed               uint64
	set                []string
	interval           time.Duration
	recompute, attnArg string
	stack              string
}

func newSimulateCmd() *cobra.Command {
	var f simFlags
	cmd := &cobra.Command{
		Use:   "simulate",
		Short: "Replay a job trace through the scheduler, or a long training run under failures",
		Long: `With --trace: replay a trace (Philly JSON or CSV) through gpuctl's scheduler on a
synthetic cluster of racks of 32 nodes, and report JCT, queueing, utilization,
restarts and lost GPU-hours. --nodes 0 sizes the cluster to the smallest on which
every job fits and whose GPUs cover the trace's mean offered load. The Philly
trace is committed at scheduler/trace/testdata/philly-multigpu-3034.json.

With --model: replay one long synchronous training run on a simulated cluster of
its nodes plus hot spares, with node and GPU failures drawn at random (--seed)
at the job's failure rate (--mtbf, or --gpu-mtbf per GPU). The cost model gives
the plan (gpuctl plan's best one, or --tp/--cp/--pp), its step time and its checkpoint and
restart costs; the run checkpoints at the Young–Daly interval, each failure loses
the work since the last checkpoint and is recovered by the scheduler's own
recovery decision (a spare swapped in, or a wait for a repair). It reports the
effective training time simulated against the cost model's prediction.

Philly trace: Jeon et al., "Analysis of Large-Scale Multi-Tenant GPU Clusters
for DNN Training Workloads", USENIX ATC 2019 (marwage/philly-traces, CC BY 4.0).`,
		Example: `  gpuctl simulate --trace scheduler/trace/testdata/philly-multigpu-3034.json --compare
  gpuctl simulate --model llama3-405b --gpus 16384 --gpu h100 --mtbf 3h --tokens 15.6e12 --seed 1`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if f.output != "table" && f.output != "json" {
				return fmt.Errorf("-o %q: use table or json", f.output)
			}
			if f.model != "" {
				if f.tracePath != "" {
					return errors.New("simulate: give --trace (replay a trace) or --model (a run under failures), not both")
				}
				return runSimulateFailures(cmd, f)
			}
			return runSimulateTrace(cmd, f)
		},
	}
	fl := cmd.Flags()
	fl.StringVar(&f.tracePath, "trace", "", "trace file: .json (Philly) or .csv (id,submit_seconds,gpus,runtime_seconds[,tenant,priority,failures]); default $GPUCTL_TRACE")
	fl.IntVar(&f.nodes, "nodes", 0, "nodes in the cluster (0: smallest that fits every job and the mean load)")
	fl.IntVar(&f.gpn, "gpus-per-node", 8, "GPUs per node")
	fl.StringVar(&f.policy, "policy", scheduler.DefaultPolicy, "queue policy: "+strings.Join(scheduler.PolicyNames(), ", "))
	fl.StringVar(&f.policyWeights, "policy-weights", "", "the weights of --policy learned (gpuctl simulate train --policy-out)")
	fl.BoolVar(&f.compare, "compare", false, "run every policy on the same trace and cluster, side by side")
	fl.StringVarP(&f.output, "output", "o", "table", "output: table or json")
	fl.DurationVar(&f.ckpt, "checkpoint-interval", 30*time.Minute, "trace replay: running time between a job's checkpoints; a failure loses the work since the last one")
	fl.IntVar(&f.tenants, "tenants", 4, "synthetic tenants for jobs without one, assigned by a hash of the job id (for fair share)")
	fl.BoolVar(&f.noEstimates, "no-estimates", false, "hide runtimes from the scheduler (sjf and backfill then have nothing to go on)")
	fl.StringSliceVar(&f.mix, "mix", nil, "trace replay on a mixed cluster: GPU profiles cutting the nodes into equal runs (e.g. a100,h100);\nthe trace's runtimes are on the first, every job may run on any, at its cost-model throughput on each (--seed draws its model)")
	fl.StringVar(&f.hetero, "hetero", "", "with --mix: allocate GPU models by throughput, max-throughput or max-min-fair (empty: type-agnostic)")

	fl.StringVar(&f.model, "model", "", "run under failures: model preset ("+strings.Join(costmodel.ModelNames(), ", ")+")")
	fl.StringVar(&f.gpu, "gpu", "h100", "GPU profile: "+strings.Join(costmodel.HardwareNames(), ", "))
	fl.IntVar(&f.gpus, "gpus", 0, "GPUs of the run")
	fl.IntVar(&f.tp, "tp", 0, "fix tensor parallelism")
	fl.IntVar(&f.cp, "cp", 0, "fix context parallelism")
	fl.IntVar(&f.pp, "pp", 0, "fix pipeline parallelism")
	fl.IntVar(&f.virtual, "max-virtual-stages", planner.MaxVirtualStages, "largest interleaving to try")
	fl.BoolVar(&f.uneven, "uneven", true, "also try pipelines that do not divide the layers, as gpuctl plan --uneven (=false: even ones only)")
	fl.IntVar(&f.zero, "zero", -1, "ZeRO stage 0-3 (default: the preset's)")
	fl.StringVar(&f.recompute, "recompute", "", "activation recomputation: none, selective or full")
	fl.StringVar(&f.attnArg, "attention", "", "attention kernel: flash or unfused")
	fl.DurationVar(&f.mtbf, "mtbf", 0, "mean time between the job's interruptions, e.g. 3h")
	fl.DurationVar(&f.gpuMTBF, "gpu-mtbf", 0, "mean time between interruptions per GPU, e.g. 50700h")
	fl.Float64Var(&f.tokens, "tokens", 0, "training tokens of the run, e.g. 15.6e12")
	fl.IntVar(&f.steps, "steps", 0, "optimizer steps of the run (instead of --tokens)")
	fl.IntVar(&f.spares, "spares", 0, "hot spare nodes (0: twice the nodes in repair at the failure rate, at least 2% of the job's and 8)")
	fl.DurationVar(&f.repair, "repair", 24*time.Hour, "time a failed node takes to come back")
	fl.Float64Var(&f.gpuShare, "gpu-fault-share", 0.587, "share of interruptions that are one GPU failing (Llama 3: 58.7% of 419), the rest whole nodes")
	fl.Uint64Var(&f.seed, "seed", 1, "seed of the failure sequence")
	fl.DurationVar(&f.interval, "run-checkpoint-interval", 0, "run under failures: work between checkpoints (0: the Young–Daly interval)")
	fl.StringVar(&f.stack, "stack", "", "training stack, which sets the overlap terms and its kernels' generation: "+strings.Join(costmodel.StackNames(), ", ")+" (default "+costmodel.DefaultStack+")")
	fl.StringArrayVar(&f.set, "set", nil, "override a GPU field or tunable, key=value (see gpuctl plan -o json); repeatable")
	cmd.AddCommand(newSimulateTrainCmd())
	return cmd
}

func runSimulateTrace(cmd *cobra.Command, f simFlags) error {
	tracePath := f.tracePath
	if tracePath == "" {
		tracePath = os.Getenv("GPUCTL_TRACE")
	}
	if tracePath == "" {
		return fmt.Errorf("no trace: pass --trace FILE (.json Philly or .csv; the Philly trace is scheduler/trace/testdata/philly-multigpu-3034.json) or set GPUCTL_TRACE; or --model to simulate a run under failures")
	}
	if f.ckpt < time.Second {
		return fmt.Errorf("--checkpoint-interval %s: must be at least 1s", f.ckpt)
	}
	jobs, err := trace.Load(tracePath)
	if err != nil {
		return err
	}
	names := []string{f.policy}
	if f.compare {
		names = comparePolicies
	}
	var weights *scheduler.ScoreWeights
	if f.policyWeights != "" {
		w, err := readPolicyWeights(f.policyWeights)
		if err != nil {
			return fmt.Errorf("--policy-weights: %w", err)
		}
		weights = &w
	}
	var mix *simulate.Mix
	var objective scheduler.Objective
	switch {
	case f.hetero != "" && len(f.mix) == 0:
		return errors.New("--hetero needs --mix: the GPU models of the cluster to allocate")
	case f.hetero != "":
		if objective, err = scheduler.ParseObjective(f.hetero); err != nil {
			return fmt.Errorf("--hetero: %w", err)
		}
	}
	if len(f.mix) > 0 {
		rates, err := simulate.CostRates(f.mix, f.seed)
		if err != nil {
			return fmt.Errorf("--mix: %w", err)
		}
		mix = &simulate.Mix{Models: f.mix, Rates: rates, Reshardable: true}
	}
	var rows []simulate.TraceRow
	for _, name := range names {
		p, err := scheduler.PolicyWithWeights(name, weights)
		if err != nil {
			return err
		}
		if objective != "" {
			p = scheduler.WithHetero(p, objective)
		}
		start := time.Now()
		res, err := simulate.Run(jobs, simulate.Config{
			Nodes: f.nodes, GPUsPerNode: f.gpn, Policy: p, Tenants: f.tenants,
			CheckpointInterval: int64(f.ckpt / time.Second), NoEstimates: f.noEstimates, Mix: mix,
		})
		if err != nil {
			return err
		}
		rows = append(rows, simulate.TraceRow{Result: res, WallSeconds: time.Since(start).Seconds()})
	}
	if f.output == "json" {
		return views.WriteDocument(cmd.OutOrStdout(), simulate.NewTraceDocument(tracePath, rows))
	}
	return views.SimTrace(cmd.OutOrStdout(), tracePath, rows)
}

// simRunInput resolves the flags of a run under failures into the cost
// model's terms and the replay's configuration.
func simRunInput(f simFlags) (costmodel.Config, costmodel.Evaluation, simulate.FailureConfig, int, error) {
	var zero costmodel.Config
	m, tr, err := costmodel.LookupModel(f.model)
	if err != nil {
		return zero, costmodel.Evaluation{}, simulate.FailureConfig{}, 0, fmt.Errorf("simulate: %w", err)
	}
	hw, err := costmodel.LookupHardware(f.gpu)
	if err != nil {
		return zero, costmodel.Evaluation{}, simulate.FailureConfig{}, 0, fmt.Errorf("simulate: %w", err)
	}
	if f.gpus <= 0 {
		return zero, costmodel.Evaluation{}, simulate.FailureConfig{}, 0, errors.New("simulate: how many GPUs? pass --gpus N")
	}
	if f.gpus%hw.GPUsPerNode != 0 {
		return zero, costmodel.Evaluation{}, simulate.FailureConfig{}, 0, fmt.Errorf("simulate: --gpus %d is not whole %d-GPU nodes", f.gpus, hw.GPUsPerNode)
	}
	tun := costmodel.DefaultTunables()
	if err := tun.ApplyStack(f.stack); err != nil {
		return zero, costmodel.Evaluation{}, simulate.FailureConfig{}, 0, fmt.Errorf("simulate: --stack: %w", err)
	}
	tr.Stack = f.stack
	for _, kv := range f.set {
		k, v, ok := strings.Cut(kv, "=")
		if !ok {
			return zero, costmodel.Evaluation{}, simulate.FailureConfig{}, 0, fmt.Errorf("simulate: --set %q: use key=value", kv)
		}
		if errHW := hw.Set(k, v); errHW != nil {
			if errTun := tun.Set(k, v); errTun != nil {
				return zero, costmodel.Evaluation{}, simulate.FailureConfig{}, 0, fmt.Errorf("simulate: --set %s: %v; %v", kv, errHW, errTun)
			}
		}
	}
	switch {
	case f.mtbf > 0 && f.gpuMTBF > 0:
		return zero, costmodel.Evaluation{}, simulate.FailureConfig{}, 0, errors.New("simulate: give --mtbf (the job's) or --gpu-mtbf (per GPU), not both")
	case f.mtbf > 0:
		tun.MTBF, tun.MTBFReferenceGPUs = f.mtbf, 0
	case f.gpuMTBF > 0:
		tun.MTBF, tun.MTBFReferenceGPUs = f.gpuMTBF, 1
	}
	if tun.MTBF <= 0 {
		return zero, costmodel.Evaluation{}, simulate.FailureConfig{}, 0, errors.New("simulate: a run under failures needs a failure rate: --mtbf 3h (the job's) or --gpu-mtbf 50700h (per GPU)")
	}
	if f.interval > 0 {
		tun.CheckpointInterval = f.interval
	}
	if f.zero >= 0 {
		tr.ZeROStage = f.zero
	}
	if f.recompute != "" {
		tr.Recompute = costmodel.Recompute(f.recompute)
	}
	if f.attnArg != "" {
		tr.Attention = costmodel.Attention(f.attnArg)
	}
	switch {
	case f.tokens > 0 && f.steps > 0:
		return zero, costmodel.Evaluation{}, simulate.FailureConfig{}, 0, errors.New("simulate: give --tokens or --steps, not both")
	case f.tokens > 0:
		tr.TrainTokens = f.tokens
	case f.steps > 0:
		tr.TrainTokens = float64(f.steps) * float64(tr.GlobalBatch) * float64(m.SeqLen)
	default:
		return zero, costmodel.Evaluation{}, simulate.FailureConfig{}, 0, errors.New("simulate: how long is the run? pass --tokens (e.g. 15.6e12) or --steps")
	}
	ranked, rejected := planner.Search(planner.Request{Model: m, Training: tr, Hardware: hw, Tunables: tun, GPUs: f.gpus,
		Fixed: costmodel.Plan{TP: f.tp, CP: f.cp, PP: f.pp}, MaxVirtualStages: f.virtual, EvenOnly: !f.uneven})
	if len(ranked) == 0 {
		return zero, costmodel.Evaluation{}, simulate.FailureConfig{}, 0, fmt.Errorf("simulate: no plan of %s fits %d %s GPUs (%d rejected): see gpuctl plan --model %s --gpus %d --gpu %s",
			m.Name, f.gpus, hw.Name, len(rejected), f.model, f.gpus, hw.Name)
	}
	best := ranked[0]
	c := costmodel.Config{Model: m, Hardware: hw, Training: tr, Tunables: tun}
	nodes := f.gpus / hw.GPUsPerNode
	spares := f.spares
	if spares == 0 {
		// Twice the nodes in repair at the failure rate, and at least 2%.
		spares = max(int(math.Ceil(2*f.repair.Seconds()/best.Goodput.MTBFSec)), nodes/50, 8)
	}
	steps := int(tr.TrainTokens / (float64(tr.GlobalBatch) * float64(m.SeqLen)))
	fc := simulate.FailureConfig{
		JobNodes: nodes, GPUsPerNode: hw.GPUsPerNode, Spares: spares,
		Work:               best.TrainSeconds,
		CheckpointInterval: best.CheckpointIntervalSec, CheckpointTime: best.CheckpointSec,
		Detect: tun.DetectWait.Seconds(), Restart: best.StartupSec,
		MTBF: best.Goodput.MTBFSec, GPUFaultShare: f.gpuShare, Repair: f.repair.Seconds(), Seed: f.seed,
	}
	return c, best, fc, steps, nil
}

func runSimulateFailures(cmd *cobra.Command, f simFlags) error {
	c, best, fc, steps, err := simRunInput(f)
	if err != nil {
		return err
	}
	start := time.Now()
	res, err := simulate.RunFailures(fc)
	if err != nil {
		return err
	}
	doc := simulate.NewRunDocument(c, best, fc, steps, res)
	if f.output == "json" {
		return views.WriteDocument(cmd.OutOrStdout(), doc)
	}
	return views.SimRun(cmd.OutOrStdout(), doc, time.Since(start))
}
