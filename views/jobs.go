package views

import (
	"fmt"
	"io"
	"strconv"
	"strings"
	"time"

	"github.com/gpuctl/gpuctl/api"
)

// JobJSON is one job in `gpuctl jobs -o json`.
type JobJSON struct {
	ID       string  `json:"id"`
	Name     string  `json:"name"`
	Tenant   *string `json:"tenant"`
	Priority int32   `json:"priority"`
	State    string  `json:"state"`
	// Stopping is why gpuctl is stopping the ranks: cancel, preempt, move
	// or failed; null when it is not.
	Stopping      *string       `json:"stopping"`
	PendingReason *string       `json:"pending_reason"`
	Reason        *string       `json:"reason"`
	Hold          bool          `json:"hold"`
	GPUs          int           `json:"gpus"`
	FullGPUs      int           `json:"full_gpus"`
	Plan          PlanJSON      `json:"plan"`
	Attempt       uint32        `json:"attempt"`
	Attempts      []AttemptJSON `json:"attempts"`
	Restarts      uint32        `json:"restarts"`
	Preemptions   uint32        `json:"preemptions"`
	Placement     []JobNodeJSON `json:"placement"`
	MoveTarget    []JobNodeJSON `json:"move_target"`
	Master        *string       `json:"master"`
	CheckpointDir *string       `json:"checkpoint_dir"`
	ResumeStep    int64         `json:"resume_step"`
	Step          *int64        `json:"step"`
	LastCkptStep  *int64        `json:"last_checkpoint_step"`
	Goodput       *float64      `json:"goodput"`
	// Recovery counters: steps redone, seconds not running since the
	// first start, useful step seconds, energy of the job's GPUs.
	LostSteps       int64   `json:"lost_steps"`
	DowntimeSeconds float64 `json:"downtime_seconds"`
	UsefulSeconds   float64 `json:"useful_seconds"`
	EnergyJoules    float64 `json:"energy_joules"`
	EnergyKWh       float64 `json:"energy_kwh"`
	// CO2eKg is the energy's emissions; nil where no carbon-intensity
	// source covered all of it.
	CO2eKg          *float64 `json:"co2e_kg"`
	Checkpoints     uint32   `json:"checkpoints"`
	CheckpointSecs  *float64 `json:"checkpoint_seconds"`
	AdvisedInterval *float64 `json:"advised_checkpoint_interval_seconds"`
	Exclude         []string `json:"exclude"`
	Stalled         bool     `json:"stalled"`
	GPUSeconds      float64  `json:"attained_gpu_seconds"`
	// The runtime SJF and backfill expect of the job, and where it came
	// from (the job file, or the runtime model's group); null without one.
	EstimateSeconds *int64  `json:"estimate_seconds"`
	EstimateBasis   *string `json:"estimate_basis"`
	// For a job allowing several GPU models (gpu_models): the model it
	// got and why (null until it first starts), and its plan on each.
	GPUType       *string        `json:"gpu_type"`
	GPUTypeReason *string        `json:"gpu_type_reason"`
	TypePlans     []TypePlanJSON `json:"type_plans"`
	// Times: submitted, the current attempt's start, the end, and the
	// first attempt's start (goodput and downtime count from it).
	SubmitTime     *time.Time `json:"submit_time"`
	StartTime      *time.Time `json:"start_time"`
	EndTime        *time.Time `json:"end_time"`
	FirstStartTime *time.Time `json:"first_start_time"`
}

// PlanJSON is a job's parallel layout, the cost model's predictions for
// it (null without a model section) and what the running job measured.
type PlanJSON struct {
	TP              int32    `json:"tp"`
	CP              int32    `json:"cp,omitempty"`
	PP              int32    `json:"pp"`
	DP              int32    `json:"dp"`
	MicroBatch      int32    `json:"micro_batch"`
	NumMicroBatches int32    `json:"num_micro_batches"`
	VirtualStages   int32    `json:"virtual_stages"`
	Source          string   `json:"source"`
	StepSeconds     *float64 `json:"predicted_step_seconds"`
	MFU             *float64 `json:"predicted_mfu"`
	MemPerGPUBytes  *int64   `json:"predicted_mem_per_gpu_bytes"`
	// Measured on the running job and fed back into the cost model.
	MeasuredStepSeconds    *float64 `json:"measured_step_seconds"`
	CalibratedComputeScale *float64 `json:"calibrated_compute_scale"`
	CalibratedCommScale    *float64 `json:"calibrated_comm_scale"`
	CalibratedTerm         *string  `json:"calibrated_term"`
	CalibrationNote        *string  `json:"calibration_note"`
}

// AttemptJSON is one launch of a job, as sacct lists a job's steps.
type AttemptJSON struct {
	Attempt      uint32     `json:"attempt"`
	StartTime    *time.Time `json:"start_time"`
	EndTime      *time.Time `json:"end_time"`
	EndReason    *string    `json:"end_reason"`
	Nodes        []string   `json:"nodes"`
	GPUs         int32      `json:"gpus"`
	DP           int32      `json:"dp"`
	ResumeStep   int64      `json:"resume_step"`
	LastStep     int64      `json:"last_step"`
	LostSteps    int64      `json:"lost_steps"`
	GPUSeconds   float64    `json:"gpu_seconds"`
	EnergyJoules float64    `json:"energy_joules"`
}

// JobNodeJSON is the part of a placement on one node.
type JobNodeJSON struct {
	Node  string        `json:"node"`
	GPUs  []uint32      `json:"gpus"`
	Ranks []JobRankJSON `json:"ranks"`
}

// JobRankJSON is one rank; pid is null until the node reports it
// started, exit_code null while it runs.
type JobRankJSON struct {
	Rank      int32   `json:"rank"`
	LocalRank int32   `json:"local_rank"`
	GPU       uint32  `json:"gpu"`
	PID       *uint32 `json:"pid"`
	Exited    bool    `json:"exited"`
	ExitCode  *int32  `json:"exit_code"`
	Signal    *string `json:"signal"`
}

// JobStateName is a job state as scripts see it: pending, running,
// recovering, succeeded, failed or cancelled.
func JobStateName(s api.JobState) string { return s.Short() }

// JobStateNames lists the job states, for flags that take one.
func JobStateNames() []string {
	return []string{"pending", "running", "recovering", "succeeded", "failed", "cancelled"}
}

func stopName(s api.JobStop) *string {
	switch s {
	case api.JobStop_JOB_STOP_CANCEL:
		return ptr("cancel")
	case api.JobStop_JOB_STOP_PREEMPT:
		return ptr("preempt")
	case api.JobStop_JOB_STOP_MOVE:
		return ptr("move")
	case api.JobStop_JOB_STOP_FAILED:
		return ptr("failed")
	}
	return nil
}

func jobNodesJSON(nodes []*api.JobNode) []JobNodeJSON {
	out := []JobNodeJSON{}
	for _, jn := range nodes {
		n := JobNodeJSON{Node: jn.GetNode(), GPUs: append([]uint32{}, jn.GetGpus()...), Ranks: []JobRankJSON{}}
		for _, r := range jn.GetRanks() {
			rj := JobRankJSON{Rank: r.GetRank(), LocalRank: r.GetLocalRank(), GPU: r.GetGpu(), Exited: r.GetExited(), Signal: optString(r.GetSignal())}
			if r.GetPid() != 0 {
				rj.PID = ptr(r.GetPid())
			}
			if r.GetExited() {
				rj.ExitCode = ptr(r.GetExitCode())
			}
			n.Ranks = append(n.Ranks, rj)
		}
		out = append(out, n)
	}
	return out
}

// TypePlanJSON is a job's plan on one GPU model it allows.
type TypePlanJSON struct {
	GPUModel string   `json:"gpu_model"`
	Plan     PlanJSON `json:"plan"`
}

func planJSON(p *api.JobPlan) PlanJSON {
	return PlanJSON{TP: p.GetTp(), CP: p.GetCp(), PP: p.GetPp(), DP: p.GetDp(), MicroBatch: p.GetMicroBatch(),
		NumMicroBatches: p.GetNumMicroBatches(), VirtualStages: p.GetVirtualStages(), Source: p.GetSource(),
		StepSeconds: optFloat(p.GetStepSeconds()), MFU: optFloat(p.GetMfu()), MemPerGPUBytes: optInt64(p.GetMemPerGpuBytes()),
		MeasuredStepSeconds: optFloat(p.GetMeasuredStepSeconds()), CalibratedComputeScale: optFloat(p.GetCalibratedComputeScale()),
		CalibratedCommScale: optFloat(p.GetCalibratedCommScale()), CalibratedTerm: optString(p.GetCalibratedTerm()),
		CalibrationNote: optString(p.GetCalibrationNote())}
}

// JobFromAPI converts a job to its JSON view.
func JobFromAPI(j *api.Job) JobJSON {
	p := j.GetPlan()
	out := JobJSON{
		ID: j.GetId(), Name: j.GetName(), Tenant: optString(j.GetTenant()), Priority: j.GetPriority(),
		State: JobStateName(j.GetState()), Stopping: stopName(j.GetStopping()),
		PendingReason: optString(j.GetPendingReason()), Reason: optString(j.GetReason()), Hold: j.GetHold(),
		Plan:    planJSON(p),
		GPUType: optString(j.GetGpuType()), GPUTypeReason: optString(j.GetGpuTypeReason()), TypePlans: []TypePlanJSON{},
		GPUs:    int(p.GPUs()),
		Attempt: j.GetAttempt(), Attempts: []AttemptJSON{}, Restarts: j.GetRestarts(), Preemptions: j.GetPreemptions(),
		Placement: jobNodesJSON(j.GetPlacement()), MoveTarget: jobNodesJSON(j.GetMoveTarget()),
		CheckpointDir: optString(j.GetCheckpointDir()), ResumeStep: j.GetResumeStep(),
		Step: optInt64(j.GetStep()), LastCkptStep: optInt64(j.GetLastCheckpointStep()), Goodput: optFloat(j.GetGoodput()),
		LostSteps: j.GetLostSteps(), DowntimeSeconds: j.GetDowntimeSeconds(), UsefulSeconds: j.GetUsefulSeconds(),
		EnergyJoules: j.GetEnergyJoules(), EnergyKWh: j.GetEnergyJoules() / 3.6e6, CO2eKg: co2eKg(j), Checkpoints: j.GetCheckpoints(), CheckpointSecs: optFloat(j.GetCheckpointSeconds()),
		AdvisedInterval: optFloat(j.GetAdvisedCheckpointIntervalSeconds()), Exclude: orEmpty(j.GetExclude()), Stalled: j.GetStalled(),
		GPUSeconds: j.GetAttainedGpuSeconds(), EstimateSeconds: optInt64(j.GetEstimateSeconds()), EstimateBasis: optString(j.GetEstimateBasis()),
		SubmitTime: optTime(j.GetSubmitUnixNano()),
		StartTime:  optTime(j.GetStartUnixNano()), EndTime: optTime(j.GetEndUnixNano()), FirstStartTime: optTime(j.GetFirstStartUnixNano()),
	}
	for _, t := range j.GetTypePlans() {
		out.TypePlans = append(out.TypePlans, TypePlanJSON{GPUModel: t.GetGpuModel(), Plan: planJSON(t.GetPlan())})
	}
	out.FullGPUs = int(j.GetFullGpus())
	if out.FullGPUs == 0 {
		out.FullGPUs = out.GPUs
	}
	if j.GetMasterAddr() != "" {
		out.Master = ptr(j.GetMasterAddr() + ":" + strconv.Itoa(int(j.GetMasterPort())))
	}
	for _, a := range j.GetAttempts() {
		out.Attempts = append(out.Attempts, AttemptJSON{Attempt: a.GetAttempt(), StartTime: optTime(a.GetStartUnixNano()),
			EndTime: optTime(a.GetEndUnixNano()), EndReason: optString(a.GetEndReason()), Nodes: orEmpty(a.GetNodes()),
			GPUs: a.GetGpus(), DP: a.GetDp(), ResumeStep: a.GetResumeStep(), LastStep: a.GetLastStep(), LostSteps: a.GetLostSteps(),
			GPUSeconds: a.GetGpuSeconds(), EnergyJoules: a.GetEnergyJoules()})
	}
	return out
}

// planText renders a plan compactly: tp2·pp1·dp4 mb1.
func planText(p PlanJSON) string {
	s := fmt.Sprintf("tp%d·pp%d·dp%d", p.TP, p.PP, p.DP)
	if p.MicroBatch > 0 {
		s += fmt.Sprintf(" mb%d", p.MicroBatch)
	}
	return s
}

// stateText is the STATE column: the state, and why ranks are stopping.
func stateText(j JobJSON) string {
	switch deref(j.Stopping) {
	case "cancel", "failed":
		return j.State + ",stopping"
	case "preempt":
		return j.State + ",preempting"
	case "move":
		return j.State + ",moving"
	}
	if j.Hold {
		return j.State + ",held"
	}
	if j.Stalled {
		return j.State + ",stalled"
	}
	return j.State
}

func nodeList(ns []JobNodeJSON) string {
	if len(ns) == 0 {
		return "-"
	}
	names := make([]string, len(ns))
	for i, n := range ns {
		names[i] = n.Node
	}
	return HostList(names)
}

func pidList(ns []JobNodeJSON) string {
	var pids []string
	for _, n := range ns {
		for _, r := range n.Ranks {
			switch {
			case r.Exited:
				pids = append(pids, "x")
			case r.PID == nil:
				pids = append(pids, "?")
			default:
				pids = append(pids, strconv.Itoa(int(*r.PID)))
			}
		}
	}
	if len(pids) == 0 {
		return "-"
	}
	return strings.Join(pids, ",")
}

func jobReason(v JobJSON) string {
	if v.State == "pending" && v.PendingReason != nil {
		return *v.PendingReason
	}
	return dash(deref(v.Reason))
}

// Jobs writes the job list.
func Jobs(w io.Writer, o Options, jobs []*api.Job) error {
	if o.Format == JSON {
		doc := struct {
			Jobs []JobJSON `json:"jobs"`
		}{Jobs: []JobJSON{}}
		for _, j := range jobs {
			doc.Jobs = append(doc.Jobs, JobFromAPI(j))
		}
		return writeJSON(w, doc)
	}
	now := o.now()
	t := tableData{empty: "no jobs"}
	t.cols = []column{{name: "ID"}, {name: "NAME"}, {name: "STATE"}, {name: "GPUS"}, {name: "NODES"}, {name: "AGE"}, {name: "REASON", flex: true}}
	if o.Format == Wide {
		t.cols = []column{{name: "ID"}, {name: "NAME"}, {name: "TENANT"}, {name: "PRIO"}, {name: "STATE"}, {name: "GPUS"}, {name: "PLAN"},
			{name: "NODES"}, {name: "PIDS"}, {name: "ATTEMPT"}, {name: "RESTARTS"}, {name: "STEP"}, {name: "CKPT"}, {name: "LOST"},
			{name: "GOODPUT"}, {name: "ADV-CKPT"}, {name: "MASTER"}, {name: "SUBMITTED"}, {name: "REASON", flex: true}}
	}
	for _, j := range jobs {
		v := JobFromAPI(j)
		submitted := timeOrZero(v.SubmitTime)
		if o.Format == Wide {
			t.add(txt(v.ID), txt(v.Name), txt(dash(deref(v.Tenant))), count(v.Priority), txt(stateText(v)), count(v.GPUs),
				txt(planText(v.Plan)), txt(nodeList(v.Placement)), txt(pidList(v.Placement)), count(v.Attempt), count(v.Restarts),
				optInt(v.Step), optInt(v.LastCkptStep), count(v.LostSteps), num(percent(v.Goodput), deref0(v.Goodput)),
				num(seconds(v.AdvisedInterval), deref0(v.AdvisedInterval)), txt(dash(deref(v.Master))),
				num(submitted.Format(time.RFC3339), float64(submitted.Unix())), txt(jobReason(v)))
			continue
		}
		gpus := count(v.GPUs)
		if v.FullGPUs != v.GPUs {
			gpus = num(fmt.Sprintf("%d/%d", v.GPUs, v.FullGPUs), float64(v.GPUs))
		}
		t.add(txt(v.ID), txt(v.Name), txt(stateText(v)), gpus, txt(nodeList(v.Placement)),
			num(age(now, submitted), now.Sub(submitted).Seconds()), txt(jobReason(v)))
	}
	return o.writeTable(w, t)
}

func optInt(v *int64) cell {
	if v == nil {
		return txt("-")
	}
	return count(*v)
}

func deref0(f *float64) float64 {
	if f == nil {
		return 0
	}
	return *f
}

// placementText lists a placement one node per line: node, GPUs, ranks.
func placementText(w io.Writer, indent string, ns []JobNodeJSON) {
	for _, n := range ns {
		gpus := make([]string, len(n.GPUs))
		for i, g := range n.GPUs {
			gpus[i] = strconv.Itoa(int(g))
		}
		ranks := make([]string, len(n.Ranks))
		for i, r := range n.Ranks {
			ranks[i] = strconv.Itoa(int(r.Rank))
		}
		fmt.Fprintf(w, "%s%s  gpus %s  ranks %s\n", indent, api.EscapeText(n.Node), strings.Join(gpus, ","), strings.Join(ranks, ","))
	}
}

// DryRun writes `gpuctl submit --dry-run`: the plan, and the placement the
// scheduler would choose now or why the job would wait.
func DryRun(w io.Writer, o Options, r *api.SubmitJobResponse) error {
	v := JobFromAPI(r.GetJob())
	if o.Format == JSON {
		return writeJSON(w, struct {
			Jobs        []JobJSON `json:"jobs"`
			QueuedAhead uint32    `json:"queued_ahead"`
		}{[]JobJSON{v}, r.GetQueuedAhead()})
	}
	fmt.Fprintf(w, "job %s: %d GPUs, plan %s (%s)\n", api.EscapeText(v.Name), v.GPUs, planText(v.Plan), planSourceText(v.Plan.Source))
	if v.Plan.StepSeconds != nil {
		fmt.Fprintf(w, "predicted: %.2f s/step, MFU %.1f%%", *v.Plan.StepSeconds, 100*deref0(v.Plan.MFU))
		if v.Plan.MemPerGPUBytes != nil {
			fmt.Fprintf(w, ", %s per GPU", Bytes(uint64(*v.Plan.MemPerGPUBytes)))
		}
		fmt.Fprintln(w)
	}
	if len(v.Placement) > 0 {
		fmt.Fprintln(w, "would run on:")
		placementText(w, "  ", v.Placement)
	}
	if v.PendingReason != nil {
		fmt.Fprintf(w, "would wait: %s\n", api.EscapeText(*v.PendingReason))
	}
	return nil
}

func planSourceText(s string) string {
	switch s {
	case "plan":
		return "fixed by the job"
	case "planner":
		return "chosen by the cost model"
	case "gpus":
		return "data parallel over the GPUs asked for"
	}
	return s
}

// PackingJSON is a packing score: lower cost is better.
type PackingJSON struct {
	FragmentedNodes int32   `json:"fragmented_nodes"`
	ExtraSwitches   int32   `json:"extra_switches"`
	ExtraRacks      int32   `json:"extra_racks"`
	Cost            float64 `json:"cost"`
}

// MoveJSON is one planned move of a running job.
type MoveJSON struct {
	Job    string        `json:"job"`
	From   []JobNodeJSON `json:"from"`
	To     []JobNodeJSON `json:"to"`
	Before PackingJSON   `json:"before"`
	After  PackingJSON   `json:"after"`
}

func packingJSON(p *api.Packing) PackingJSON {
	return PackingJSON{FragmentedNodes: p.GetFragmentedNodes(), ExtraSwitches: p.GetExtraSwitches(), ExtraRacks: p.GetExtraRacks(), Cost: p.GetCost()}
}

// Rebalance writes a rebalance plan, and whether its moves were started.
func Rebalance(w io.Writer, o Options, r *api.RebalanceResponse) error {
	moves := []MoveJSON{}
	for _, m := range r.GetMoves() {
		moves = append(moves, MoveJSON{Job: m.GetJob(), From: jobNodesJSON(m.GetFrom()), To: jobNodesJSON(m.GetTo()),
			Before: packingJSON(m.GetBefore()), After: packingJSON(m.GetAfter())})
	}
	before, after := packingJSON(r.GetBefore()), packingJSON(r.GetAfter())
	if o.Format == JSON {
		return writeJSON(w, struct {
			Moves   []MoveJSON  `json:"moves"`
			Before  PackingJSON `json:"before"`
			After   PackingJSON `json:"after"`
			Applied bool        `json:"applied"`
		}{moves, before, after, r.GetApplied()})
	}
	if len(moves) == 0 {
		fmt.Fprintf(w, "nothing to move: no checkpointing job can be packed tighter (cost %g: %s)\n", before.Cost, packingText(before))
		return nil
	}
	t := tableData{cols: []column{{name: "JOB"}, {name: "FROM"}, {name: "TO"}, {name: "COST"}}}
	for _, m := range moves {
		t.add(txt(m.Job), txt(nodeList(m.From)), txt(nodeList(m.To)), num(fmt.Sprintf("%g → %g", m.Before.Cost, m.After.Cost), m.After.Cost-m.Before.Cost))
	}
	if err := o.writeTable(w, t); err != nil {
		return err
	}
	fmt.Fprintf(w, "packing cost %g → %g (before: %s; after: %s)\n", before.Cost, after.Cost, packingText(before), packingText(after))
	if r.GetApplied() {
		fmt.Fprintf(w, "moving %d job(s) one at a time: checkpoint (SIGUSR1), stop, relaunch resuming from the checkpoint; follow with `gpuctl jobs --watch`\n", len(moves))
	} else {
		fmt.Fprintln(w, "dry run: add --apply to move them")
	}
	return nil
}

func packingText(p PackingJSON) string {
	return fmt.Sprintf("%d fragmented nodes, %d extra switches, %d extra racks", p.FragmentedNodes, p.ExtraSwitches, p.ExtraRacks)
}

// percent formats a fraction as a percentage, "-" when unknown.
func percent(f *float64) string {
	if f == nil || *f <= 0 {
		return "-"
	}
	return strconv.FormatFloat(100**f, 'f', 1, 64) + "%"
}

// seconds formats a duration in seconds, rounded, "-" when unknown.
func seconds(s *float64) string {
	if s == nil || *s <= 0 {
		return "-"
	}
	return (time.Duration(*s) * time.Second).String()
}

func co2eKg(j *api.Job) *float64 {
	if j.Co2EGrams == nil {
		return nil
	}
	kg := j.GetCo2EGrams() / 1000
	return &kg
}
