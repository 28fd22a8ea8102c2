package jobs

import (
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"path/filepath"

	"github.com/gpuctl/gpuctl/api"
	"github.com/gpuctl/gpuctl/jobspec"
	"github.com/gpuctl/gpuctl/scheduler"
)

// intake takes submitted jobs in for the owner: it checks a job can ever
// run here, gives it an id, and keeps the submits' idempotency keys, so
// that a retried submit answers with the job it created. A dry run is
// placed and answered, never kept. The jobs and the current step are the
// owner's, reached through m. It runs on the owner's goroutine only.
type intake struct {
	m *Manager
	// idem maps a submit's idempotency key to the job it created.
	idem map[string]string
}

// submit stores a parsed and planned job as pending, or answers a dry
// run with where it would go now.
func (ik *intake) submit(req *api.SubmitJobRequest, source string, spec *jobspec.Spec, plan *api.JobPlan, types []*api.JobTypePlan) (*api.SubmitJobResponse, error) {
	now := ik.m.now()
	if key := req.GetIdempotencyKey(); len(key) > 128 {
		return nil, fmt.Errorf("idempotency key of %d bytes: at most 128", len(key))
	}
	if key := req.GetIdempotencyKey(); key != "" && !req.GetDryRun() {
		if id, ok := ik.idem[key]; ok && ik.m.jobs[id] != nil {
			// A retry of a submit whose answer was lost: the job it
			// created, not a second one.
			return &api.SubmitJobResponse{Job: clone(ik.m.jobs[id].job)}, nil
		}
	}
	j := &api.Job{Name: spec.Name, Tenant: spec.Tenant, Priority: int32(spec.Priority), SpecYaml: req.GetSpecYaml(),
		SpecSource: source, Plan: plan, State: api.JobState_JOB_STATE_PENDING, SubmitUnixNano: now.UnixNano(),
		Hold: req.GetHold(), CheckpointDir: spec.Checkpoint.Dir, PendingReason: "waiting for the scheduler",
		FullGpus: plan.GPUs(), TypePlans: types}
	en := &entry{job: j, spec: spec}
	if req.GetDryRun() {
		return ik.dryRun(en), nil
	}
	if !j.GetHold() {
		snap := ik.m.placer.snapshot(now)
		j.Id = "new"
		r := ik.m.placer.request(en)
		if why, never := scheduler.NeverFits(&snap, &r); never {
			return nil, fmt.Errorf("job %s can never run on this cluster as built: %s; add nodes first, or submit with --hold to keep it waiting", spec.Name, why)
		}
	}
	id, err := ik.newID()
	if err != nil {
		return nil, err
	}
	j.Id = id
	if key := req.GetIdempotencyKey(); key != "" {
		j.IdempotencyKey = key
		remember(ik.m.pass, ik.idem, key)
		ik.idem[key] = id
	}
	j.EstimateSeconds, j.EstimateBasis = ik.m.placer.estimate(j, spec)
	if j.CheckpointDir == "" && ik.m.cfg.CheckpointRoot != "" {
		j.CheckpointDir = filepath.Join(ik.m.cfg.CheckpointRoot, id)
	}
	if j.Hold {
		j.PendingReason = fmt.Sprintf("held: place it with `gpuctl assign %s --nodes …` or let the scheduler with `gpuctl release %s`", id, id)
	}
	ik.m.jobs[id] = en
	ik.m.save(en)
	ik.m.log.Info("job submitted", "job", id, "name", j.Name, "gpus", spec.TotalGPUs(), "plan", shapeOf(j).String())
	ik.m.kick()
	return &api.SubmitJobResponse{Job: clone(j)}, nil
}

// newID returns a short unused job id.
func (ik *intake) newID() (string, error) {
	for range 16 {
		var b [3]byte
		if _, err := rand.Read(b[:]); err != nil {
			return "", fmt.Errorf("job id: %w", err)
		}
		id := "j-" + hex.EncodeToString(b[:])
		if _, taken := ik.m.jobs[id]; !taken {
			return id, nil
		}
	}
	return "", errors.New("job id: no free id after 16 tries")
}

// dryRun places the job on the cluster as it is now, without queueing it;
// pending_reason says why it would wait.
func (ik *intake) dryRun(en *entry) *api.SubmitJobResponse {
	j := en.job
	j.Id = "dry-run"
	snap := ik.m.placer.snapshot(ik.m.now())
	r := ik.m.placer.request(en)
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
		if why, never := scheduler.NeverFits(&snap, &r); never {
			j.PendingReason = why + ": it would be refused"
		} else {
			j.PendingReason = pe.Explain(&r)
		}
	default:
		j.PendingReason = err.Error()
	}
	return &api.SubmitJobResponse{Job: j, QueuedAhead: ahead}
}
