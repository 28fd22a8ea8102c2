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
	ID       string `json:"id"`
	Name     string `json:"name"`
	Tenant   string `json:"tenant,omitempty"`
	Priority int32  `json:"priority"`
	State    string `json:"state"`
	// Stopping is why gpuctl is stopping the ranks: cancel, preempt, move
	// or failed; empty when it is not.
	Stopping      string        `json:"stopping,omitempty"`
	PendingReason string        `json:"pending_reason,omitempty"`
	Reason        string        `json:"reason,omitempty"`
	Hold          bool          `json:"hold,omitempty"`
	GPUs          int           `json:"gpus"`
	Plan          PlanJSON      `json:"plan"`
	Attempt       uint32        `json:"attempt"`
	Restarts      uint32        `json:"restarts"`
	Preemptions   uint32        `json:"preemptions"`
	Placement     []JobNodeJSON `json:"placement"`
	MoveTarget    []JobNodeJSON `json:"move_target,omitempty"`
	Master        string        `json:"master,omitempty"`
	CheckpointDir string        `json:"checkpoint_dir,omitempty"`
	ResumeStep    int64         `json:"resume_step"`
	Step          int64         `json:"step"`
	LastCkptStep  int64         `json:"last_checkpoint_step"`
	Goodput       float64       `json:"goodput"`
	// Recovery counters: steps redone, seconds not running since the
	// first start, useful step seconds, energy of the job's GPUs.
	LostSteps       int64   `json:"lost_steps"`
	DowntimeSeconds float64 `json:"downtime_seconds"`
	UsefulSeconds   float64 `json:"useful_seconds"`
	EnergyJoules    float64 `json:"energy_joules"`
	// Checkpoints reported, their mean seconds, and the Young–Daly interval
	// advised from it and the cluster's failure rate.
	Checkpoints         uint32     `json:"checkpoints"`
	CheckpointSeconds   float64    `json:"checkpoint_seconds"`
	AdvisedCkptInterval float64    `json:"advised_checkpoint_interval_seconds"`
	Exclude             []string   `json:"exclude,omitempty"`
	Stalled             bool       `json:"stalled,omitempty"`
	GPUSeconds          float64    `json:"attained_gpu_seconds"`
	Submitted           time.Time  `json:"submitted"`
	Started             *time.Time `json:"started"`
	Ended               *time.Time `json:"ended"`
}

// PlanJSON is a job's parallel layout.
type PlanJSON struct {
	TP              int32   `json:"tp"`
	PP              int32   `json:"pp"`
	DP              int32   `json:"dp"`
	MicroBatch      int32   `json:"micro_batch"`
	NumMicroBatches int32   `json:"num_micro_batches"`
	VirtualStages   int32   `json:"virtual_stages"`
	Source          string  `json:"source"`
	StepSeconds     float64 `json:"predicted_step_seconds,omitempty"`
	MFU             float64 `json:"predicted_mfu,omitempty"`
	MemPerGPUBytes  int64   `json:"predicted_mem_per_gpu_bytes,omitempty"`
	// Measured on the running job and fed back into the cost model.
	MeasuredStepSeconds  float64 `json:"measured_step_seconds,omitempty"`
	CalibratedEfficiency float64 `json:"calibrated_efficiency,omitempty"`
	CalibrationNote      string  `json:"calibration_note,omitempty"`
}

// JobNodeJSON is the part of a placement on one node.
type JobNodeJSON struct {
	Node  string        `json:"node"`
	GPUs  []uint32      `json:"gpus"`
	Ranks []JobRankJSON `json:"ranks"`
}

// JobRankJSON is one rank; pid is 0 until the node reports it started,
// exit_code is null while it runs.
type JobRankJSON struct {
	Rank      int32  `json:"rank"`
	LocalRank int32  `json:"local_rank"`
	GPU       uint32 `json:"gpu"`
	PID       uint32 `json:"pid"`
	Exited    bool   `json:"exited"`
	ExitCode  *int32 `json:"exit_code"`
	Signal    string `json:"signal,omitempty"`
}

// JobStateName is a job state as scripts see it: pending, running,
// recovering, succeeded, failed or cancelled.
func JobStateName(s api.JobState) string {
	switch s {
	case api.JobState_JOB_STATE_PENDING:
		return "pending"
	case api.JobState_JOB_STATE_RUNNING:
		return "running"
	case api.JobState_JOB_STATE_RECOVERING:
		return "recovering"
	case api.JobState_JOB_STATE_SUCCEEDED:
		return "succeeded"
	case api.JobState_JOB_STATE_FAILED:
		return "failed"
	case api.JobState_JOB_STATE_CANCELLED:
		return "cancelled"
	}
	return "unknown"
}

func stopName(s api.JobStop) string {
	switch s {
	case api.JobStop_JOB_STOP_CANCEL:
		return "cancel"
	case api.JobStop_JOB_STOP_PREEMPT:
		return "preempt"
	case api.JobStop_JOB_STOP_MOVE:
		return "move"
	case api.JobStop_JOB_STOP_FAILED:
		return "failed"
	}
	return ""
}

func timePtr(unixNano int64) *time.Time {
	if unixNano == 0 {
		return nil
	}
	t := timeOf(unixNano)
	return &t
}

func jobNodesJSON(nodes []*api.JobNode) []JobNodeJSON {
	out := []JobNodeJSON{}
	for _, jn := range nodes {
		n := JobNodeJSON{Node: jn.GetNode(), GPUs: append([]uint32{}, jn.GetGpus()...), Ranks: []JobRankJSON{}}
		for _, r := range jn.GetRanks() {
			rj := JobRankJSON{Rank: r.GetRank(), LocalRank: r.GetLocalRank(), GPU: r.GetGpu(), PID: r.GetPid(),
				Exited: r.GetExited(), Signal: r.GetSignal()}
			if r.GetExited() {
				code := r.GetExitCode()
				rj.ExitCode = &code
			}
			n.Ranks = append(n.Ranks, rj)
		}
		out = append(out, n)
	}
	return out
}

// JobFromAPI converts a job to its JSON view.
func JobFromAPI(j *api.Job) JobJSON {
	p := j.GetPlan()
	out := JobJSON{
		ID: j.GetId(), Name: j.GetName(), Tenant: j.GetTenant(), Priority: j.GetPriority(),
		State: JobStateName(j.GetState()), Stopping: stopName(j.GetStopping()),
		PendingReason: j.GetPendingReason(), Reason: j.GetReason(), Hold: j.GetHold(),
		Plan: PlanJSON{TP: p.GetTp(), PP: p.GetPp(), DP: p.GetDp(), MicroBatch: p.GetMicroBatch(),
			NumMicroBatches: p.GetNumMicroBatches(), VirtualStages: p.GetVirtualStages(), Source: p.GetSource(),
			StepSeconds: p.GetStepSeconds(), MFU: p.GetMfu(), MemPerGPUBytes: p.GetMemPerGpuBytes(),
			MeasuredStepSeconds: p.GetMeasuredStepSeconds(), CalibratedEfficiency: p.GetCalibratedEfficiency(),
			CalibrationNote: p.GetCalibrationNote()},
		GPUs:    int(p.GetTp() * p.GetPp() * p.GetDp()),
		Attempt: j.GetAttempt(), Restarts: j.GetRestarts(), Preemptions: j.GetPreemptions(),
		Placement: jobNodesJSON(j.GetPlacement()), CheckpointDir: j.GetCheckpointDir(), ResumeStep: j.GetResumeStep(),
		Step: j.GetStep(), LastCkptStep: j.GetLastCheckpointStep(), Goodput: j.GetGoodput(),
		LostSteps: j.GetLostSteps(), DowntimeSeconds: j.GetDowntimeSeconds(), UsefulSeconds: j.GetUsefulSeconds(),
		EnergyJoules: j.GetEnergyJoules(), Checkpoints: j.GetCheckpoints(), CheckpointSeconds: j.GetCheckpointSeconds(),
		AdvisedCkptInterval: j.GetAdvisedCheckpointIntervalSeconds(), Exclude: j.GetExclude(), Stalled: j.GetStalled(),
		GPUSeconds: j.GetAttainedGpuSeconds(), Submitted: timeOf(j.GetSubmitUnixNano()),
		Started: timePtr(j.GetStartUnixNano()), Ended: timePtr(j.GetEndUnixNano()),
	}
	if len(j.GetMoveTarget()) > 0 {
		out.MoveTarget = jobNodesJSON(j.GetMoveTarget())
	}
	if j.GetMasterAddr() != "" {
		out.Master = j.GetMasterAddr() + ":" + strconv.Itoa(int(j.GetMasterPort()))
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
	switch j.Stopping {
	case "cancel":
		return j.State + " (stopping)"
	case "preempt":
		return j.State + " (preempting)"
	case "move":
		return j.State + " (moving)"
	case "failed":
		return j.State + " (stopping)"
	}
	if j.Hold {
		return j.State + " (held)"
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
	return strings.Join(names, ",")
}

func pidList(ns []JobNodeJSON) string {
	var pids []string
	for _, n := range ns {
		for _, r := range n.Ranks {
			switch {
			case r.Exited:
				pids = append(pids, "x")
			case r.PID == 0:
				pids = append(pids, "?")
			default:
				pids = append(pids, strconv.Itoa(int(r.PID)))
			}
		}
	}
	if len(pids) == 0 {
		return "-"
	}
	return strings.Join(pids, ",")
}

// Jobs writes the job list in format f; now is used for ages in tables.
func Jobs(w io.Writer, f Format, jobs []*api.Job, now time.Time) error {
	if f == JSON {
		doc := struct {
			Jobs []JobJSON `json:"jobs"`
		}{Jobs: []JobJSON{}}
		for _, j := range jobs {
			doc.Jobs = append(doc.Jobs, JobFromAPI(j))
		}
		return writeJSON(w, doc)
	}
	header := []string{"ID", "NAME", "STATE", "GPUS", "PLAN", "NODES", "ATTEMPT", "AGE", "REASON"}
	if f == Wide {
		header = []string{"ID", "NAME", "TENANT", "PRIO", "STATE", "GPUS", "PLAN", "NODES", "PIDS", "ATTEMPT",
			"RESTARTS", "CKPT", "LOST", "GOODPUT", "ADV-CKPT", "MASTER", "SUBMITTED", "REASON"}
	}
	var rows [][]string
	for _, j := range jobs {
		v := JobFromAPI(j)
		reason := v.Reason
		if v.State == "pending" {
			reason = v.PendingReason
		}
		if reason == "" {
			reason = "-"
		}
		if f == Wide {
			tenant := v.Tenant
			if tenant == "" {
				tenant = "-"
			}
			master := v.Master
			if master == "" {
				master = "-"
			}
			rows = append(rows, []string{v.ID, v.Name, tenant, strconv.Itoa(int(v.Priority)), stateText(v),
				strconv.Itoa(v.GPUs), planText(v.Plan), nodeList(v.Placement), pidList(v.Placement),
				strconv.Itoa(int(v.Attempt)), strconv.Itoa(int(v.Restarts)), strconv.FormatInt(v.LastCkptStep, 10),
				strconv.FormatInt(v.LostSteps, 10), percent(v.Goodput), seconds(v.AdvisedCkptInterval),
				master, v.Submitted.Format(time.RFC3339), reason})
			continue
		}
		rows = append(rows, []string{v.ID, v.Name, stateText(v), strconv.Itoa(v.GPUs), planText(v.Plan),
			nodeList(v.Placement), strconv.Itoa(int(v.Attempt)), age(now, v.Submitted), reason})
	}
	return table(w, header, rows)
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
		fmt.Fprintf(w, "%s%s  gpus %s  ranks %s\n", indent, n.Node, strings.Join(gpus, ","), strings.Join(ranks, ","))
	}
}

// DryRun writes `gpuctl submit --dry-run`: the plan, and the placement the
// scheduler would choose now or why the job would wait.
func DryRun(w io.Writer, f Format, r *api.SubmitJobResponse) error {
	v := JobFromAPI(r.GetJob())
	if f == JSON {
		return writeJSON(w, struct {
			Job         JobJSON `json:"job"`
			QueuedAhead uint32  `json:"queued_ahead"`
		}{v, r.GetQueuedAhead()})
	}
	fmt.Fprintf(w, "job %s: %d GPUs, plan %s (%s)\n", v.Name, v.GPUs, planText(v.Plan), planSourceText(v.Plan.Source))
	if v.Plan.StepSeconds > 0 {
		fmt.Fprintf(w, "predicted: %.2f s/step, MFU %.1f%%", v.Plan.StepSeconds, 100*v.Plan.MFU)
		if v.Plan.MemPerGPUBytes > 0 {
			fmt.Fprintf(w, ", %s per GPU", Bytes(uint64(v.Plan.MemPerGPUBytes)))
		}
		fmt.Fprintln(w)
	}
	if len(v.Placement) > 0 {
		fmt.Fprintln(w, "would run on:")
		placementText(w, "  ", v.Placement)
	}
	if v.PendingReason != "" {
		fmt.Fprintf(w, "would wait: %s\n", v.PendingReason)
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
func Rebalance(w io.Writer, f Format, r *api.RebalanceResponse) error {
	moves := []MoveJSON{}
	for _, m := range r.GetMoves() {
		moves = append(moves, MoveJSON{Job: m.GetJob(), From: jobNodesJSON(m.GetFrom()), To: jobNodesJSON(m.GetTo()),
			Before: packingJSON(m.GetBefore()), After: packingJSON(m.GetAfter())})
	}
	before, after := packingJSON(r.GetBefore()), packingJSON(r.GetAfter())
	if f == JSON {
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
	var rows [][]string
	for _, m := range moves {
		rows = append(rows, []string{m.Job, nodeList(m.From), nodeList(m.To), fmt.Sprintf("%g → %g", m.Before.Cost, m.After.Cost)})
	}
	if err := table(w, []string{"JOB", "FROM", "TO", "COST"}, rows); err != nil {
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

// percent formats a fraction as a percentage, "-" when unknown (0).
func percent(f float64) string {
	if f <= 0 {
		return "-"
	}
	return strconv.FormatFloat(100*f, 'f', 1, 64) + "%"
}

// seconds formats a duration in seconds, rounded, "-" when unknown (0).
func seconds(s float64) string {
	if s <= 0 {
		return "-"
	}
	return (time.Duration(s) * time.Second).String()
}
