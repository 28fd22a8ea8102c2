package controlplane

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"strings"
	"time"

	"google.golang.org/protobuf/proto"

	"github.com/gpuctl/gpuctl/api"
	"github.com/gpuctl/gpuctl/jobspec"
	"github.com/gpuctl/gpuctl/scheduler"
	"github.com/gpuctl/gpuctl/transport"
)

// jobMinRole is the least role for the job requests: changing jobs needs
// an operator; looking (listing, a dry run, a rebalance plan) a viewer.
func jobMinRole(req *api.ClientRequest) (transport.Role, bool) {
	switch b := req.Body.(type) {
	case *api.ClientRequest_ListJobs:
		return transport.RoleViewer, true
	case *api.ClientRequest_SubmitJob:
		if b.SubmitJob.GetDryRun() {
			return transport.RoleViewer, true
		}
		return transport.RoleOperator, true
	case *api.ClientRequest_Rebalance:
		if !b.Rebalance.GetApply() {
			return transport.RoleViewer, true
		}
		return transport.RoleOperator, true
	case *api.ClientRequest_CancelJob, *api.ClientRequest_AssignJob,
		*api.ClientRequest_CheckpointJob, *api.ClientRequest_RestartJob:
		return transport.RoleOperator, true
	}
	return "", false
}

// handle answers one job request from client who.
func (m *jobManager) handle(ctx context.Context, who string, req *api.ClientRequest) *api.ClientResponse {
	var (
		resp = &api.ClientResponse{}
		err  error
	)
	switch b := req.Body.(type) {
	case *api.ClientRequest_SubmitJob:
		var r *api.SubmitJobResponse
		r, err = m.submit(b.SubmitJob)
		resp.Body = &api.ClientResponse_SubmitJob{SubmitJob: r}
	case *api.ClientRequest_ListJobs:
		resp.Body = &api.ClientResponse_ListJobs{ListJobs: &api.ListJobsResponse{Jobs: m.list(b.ListJobs.GetJob())}}
	case *api.ClientRequest_CancelJob:
		var j *api.Job
		j, err = m.cancel(b.CancelJob.GetJob(), who)
		resp.Body = &api.ClientResponse_CancelJob{CancelJob: &api.CancelJobResponse{Job: j}}
	case *api.ClientRequest_AssignJob:
		var j *api.Job
		j, err = m.assign(ctx, b.AssignJob.GetJob(), b.AssignJob.GetNodes())
		resp.Body = &api.ClientResponse_AssignJob{AssignJob: &api.AssignJobResponse{Job: j}}
	case *api.ClientRequest_Rebalance:
		var r *api.RebalanceResponse
		r, err = m.rebalance(b.Rebalance)
		resp.Body = &api.ClientResponse_Rebalance{Rebalance: r}
	case *api.ClientRequest_CheckpointJob:
		var j *api.Job
		j, err = m.checkpoint(ctx, b.CheckpointJob.GetJob())
		resp.Body = &api.ClientResponse_CheckpointJob{CheckpointJob: &api.CheckpointJobResponse{Job: j}}
	case *api.ClientRequest_RestartJob:
		var j *api.Job
		j, err = m.restart(b.RestartJob.GetJob(), b.RestartJob.GetFromCheckpoint(), b.RestartJob.GetExclude(), who)
		resp.Body = &api.ClientResponse_RestartJob{RestartJob: &api.RestartJobResponse{Job: j}}
	default:
		err = fmt.Errorf("not a job request: %T", req.Body)
	}
	if err != nil {
		return &api.ClientResponse{Error: err.Error()}
	}
	return resp
}

// submit parses and plans a job, then either shows where it would go now
// (dry run) or persists it as pending before answering.
func (m *jobManager) submit(req *api.SubmitJobRequest) (*api.SubmitJobResponse, error) {
	source := req.GetSource()
	if source == "" {
		source = "job"
	}
	spec, err := jobspec.Parse(source, []byte(req.GetSpecYaml()))
	if err != nil {
		return nil, err
	}
	plan, err := planFor(spec)
	if err != nil {
		return nil, err
	}
	now := m.now()
	j := &api.Job{Name: spec.Name, Tenant: spec.Tenant, Priority: int32(spec.Priority), SpecYaml: req.GetSpecYaml(),
		SpecSource: source, Plan: plan, State: api.JobState_JOB_STATE_PENDING, SubmitUnixNano: now.UnixNano(),
		Hold: req.GetHold(), CheckpointDir: spec.Checkpoint.Dir, PendingReason: "waiting for the scheduler"}
	m.mu.Lock()
	defer m.mu.Unlock()
	if req.GetDryRun() {
		return m.dryRunLocked(j, spec, now), nil
	}
	if j.Id, err = m.newIDLocked(); err != nil {
		return nil, err
	}
	if j.CheckpointDir == "" && m.cfg.CheckpointRoot != "" {
		j.CheckpointDir = filepath.Join(m.cfg.CheckpointRoot, j.Id)
	}
	if j.Hold {
		j.PendingReason = fmt.Sprintf("held: place it with `gpuctl assign %s --nodes …`", j.Id)
	}
	en := &jobEntry{job: j, spec: spec}
	if err := m.persistLocked(en); err != nil {
		return nil, fmt.Errorf("submit %s: %w", spec.Name, err)
	}
	m.jobs[j.Id] = en
	m.log.Info("job submitted", "job", j.Id, "name", j.Name, "gpus", spec.TotalGPUs(), "plan", shapeOf(j).String())
	m.poke()
	return &api.SubmitJobResponse{Job: proto.Clone(j).(*api.Job)}, nil
}

// dryRunLocked places the job on the cluster as it is now, without
// queueing it; pending_reason says why it would wait.
func (m *jobManager) dryRunLocked(j *api.Job, spec *jobspec.Spec, now time.Time) *api.SubmitJobResponse {
	j.Id = "dry-run"
	en := &jobEntry{job: j, spec: spec}
	snap := m.snapshotLocked(now)
	r := m.request(en)
	ahead := uint32(len(snap.Pending))
	pl, err := scheduler.Place(&snap, &r)
	var pe *scheduler.PlacementError
	switch {
	case err == nil:
		j.Placement = jobNodes(&pl)
		j.PendingReason = ""
		if ahead > 0 {
			j.PendingReason = fmt.Sprintf("fits now; %d queued jobs are ahead of it", ahead)
		}
	case errors.As(err, &pe):
		idle := idleCopy(&snap)
		if _, ierr := scheduler.Place(&idle, &r); ierr != nil {
			j.PendingReason = neverFitReason(ierr, &r, &idle)
		} else {
			j.PendingReason = placementReason(pe, &r)
		}
	default:
		j.PendingReason = err.Error()
	}
	return &api.SubmitJobResponse{Job: j, QueuedAhead: ahead}
}

// cancel ends a job: a queued one at once, a running one by SIGTERM to its
// ranks (SIGKILL after the grace); its GPUs stay held until they are gone.
func (m *jobManager) cancel(key, who string) (*api.Job, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	en, err := m.findLocked(key)
	if err != nil {
		return nil, err
	}
	j := en.job
	if terminal(j.GetState()) {
		return nil, fmt.Errorf("job %s already %s (%s)", j.GetId(), stateName(j.GetState()), j.GetReason())
	}
	now := m.now()
	prev := proto.Clone(j).(*api.Job)
	if j.GetState() == api.JobState_JOB_STATE_RUNNING {
		m.addAttainedLocked(j, now)
	}
	j.State = api.JobState_JOB_STATE_CANCELLED
	j.EndUnixNano = now.UnixNano()
	j.Reason = "cancelled by " + who
	j.PendingReason, j.MoveTarget = "", nil
	if live := liveRanks(j); live > 0 {
		j.Stopping = api.JobStop_JOB_STOP_CANCEL
		j.StopSinceUnixNano, j.TermSentUnixNano = now.UnixNano(), 0
		m.log.Info("stopping cancelled job's ranks", "job", j.GetId(), "live", live)
	} else {
		j.Stopping = api.JobStop_JOB_STOP_NONE
	}
	if err := m.persistLocked(en); err != nil {
		en.job = prev
		return nil, fmt.Errorf("cancel %s: %w", j.GetId(), err)
	}
	m.log.Info("job cancelled", "job", j.GetId(), "by", who)
	m.poke()
	return proto.Clone(j).(*api.Job), nil
}

// assign starts a pending job on exactly the named nodes.
func (m *jobManager) assign(ctx context.Context, key string, nodes []string) (*api.Job, error) {
	m.mu.Lock()
	en, err := m.findLocked(key)
	if err != nil {
		m.mu.Unlock()
		return nil, err
	}
	j := en.job
	switch {
	case j.GetState() == api.JobState_JOB_STATE_RUNNING:
		var on []string
		for _, jn := range j.GetPlacement() {
			on = append(on, jn.GetNode())
		}
		m.mu.Unlock()
		return nil, fmt.Errorf("job %s is running on %s: checkpoint-restart it first (`gpuctl rebalance --apply` moves running jobs that checkpoint)", j.GetId(), strings.Join(on, ","))
	case j.GetState() != api.JobState_JOB_STATE_PENDING:
		m.mu.Unlock()
		return nil, fmt.Errorf("job %s is %s; only a pending job can be assigned", j.GetId(), stateName(j.GetState()))
	case en.spec == nil:
		m.mu.Unlock()
		return nil, fmt.Errorf("job %s has no usable job file", j.GetId())
	}
	now := m.now()
	snap := m.snapshotLocked(now)
	r := m.request(en)
	pl, err := scheduler.Assign(&snap, &r, nodes)
	if err != nil {
		m.mu.Unlock()
		var pe *scheduler.PlacementError
		if errors.As(err, &pe) {
			return nil, assignError(pe, &r, nodes)
		}
		return nil, err
	}
	act := m.startLocked(en, pl, now)
	m.mu.Unlock()
	if act == nil {
		return nil, fmt.Errorf("assign %s: could not record the placement; see the server log", j.GetId())
	}
	act(ctx)
	m.poke()
	m.mu.Lock()
	defer m.mu.Unlock()
	out := proto.Clone(en.job).(*api.Job)
	if out.GetState() == api.JobState_JOB_STATE_FAILED {
		return out, fmt.Errorf("job %s: %s", out.GetId(), out.GetReason())
	}
	return out, nil
}

// rebalance plans moves of running, checkpointing jobs that pack the
// cluster tighter; with apply they run one by one: checkpoint, stop,
// relaunch on the new GPUs resuming from the checkpoint.
func (m *jobManager) rebalance(req *api.RebalanceRequest) (*api.RebalanceResponse, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	maxMoves := int(req.GetMaxMoves())
	if maxMoves <= 0 {
		maxMoves = m.cfg.MaxMoves
	}
	if req.GetApply() {
		busy := len(m.moves) > 0
		for _, en := range m.jobs {
			if en.job.GetStopping() == api.JobStop_JOB_STOP_MOVE {
				busy = true
			}
		}
		if busy {
			return nil, errors.New("a rebalance is already moving jobs; wait until `gpuctl jobs` shows none moving, then plan again")
		}
	}
	snap := m.snapshotLocked(m.now())
	plan := scheduler.Rebalance(&snap, maxMoves)
	out := &api.RebalanceResponse{Before: packingOf(plan.Before), After: packingOf(plan.After)}
	for _, mv := range plan.Moves {
		out.Moves = append(out.Moves, &api.RebalanceMove{Job: mv.Job, From: jobNodes(&mv.From), To: jobNodes(&mv.To),
			Before: packingOf(mv.Before), After: packingOf(mv.After)})
	}
	if !req.GetApply() || len(plan.Moves) == 0 {
		return out, nil
	}
	m.moves = plan.Moves
	out.Applied = true
	m.log.Info("rebalance started", "moves", len(plan.Moves), "cost_before", plan.Before.Cost(), "cost_after", plan.After.Cost())
	m.poke()
	return out, nil
}

func packingOf(p scheduler.Packing) *api.Packing {
	return &api.Packing{FragmentedNodes: int32(p.FragmentedNodes), ExtraSwitches: int32(p.ExtraSwitches),
		ExtraRacks: int32(p.ExtraRacks), Cost: p.Cost()}
}
