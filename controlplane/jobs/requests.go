package jobs

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"

	"google.golang.org/protobuf/proto"

	"github.com/gpuctl/gpuctl/api"
	"github.com/gpuctl/gpuctl/jobspec"
	"github.com/gpuctl/gpuctl/scheduler"
)

// The requests clients make of jobs. Each runs on the owner through do,
// and answers once what it changed is stored.

// clone copies a job out of the owner.
func clone(j *api.Job) *api.Job { return proto.Clone(j).(*api.Job) }

// List returns the committed jobs matching key (id or name; "" = all),
// oldest first, without involving the owner. A key that matches no job is
// an error.
func (m *Manager) List(key string) ([]*api.Job, error) {
	v := m.View()
	if key == "" {
		return v.Jobs, nil
	}
	out := api.MatchJobs(v.Jobs, key)
	if len(out) == 0 {
		return nil, fmt.Errorf("unknown job %q: `gpuctl jobs` lists them", key)
	}
	return out, nil
}

// Lookup returns the committed job named by id or name.
func (m *Manager) Lookup(key string) (*api.Job, error) { return m.View().Find(key) }

// Submit parses and plans a job, then either shows where it would go now
// (dry run) or stores it as pending before answering. role is the
// submitter's (viewer, operator, admin): it decides which accounts the job
// may run as.
func (m *Manager) Submit(ctx context.Context, req *api.SubmitJobRequest, role string) (*api.SubmitJobResponse, error) {
	source := api.CleanText(req.GetSource(), 256)
	if source == "" {
		source = "job"
	}
	spec, err := jobspec.Parse(source, []byte(req.GetSpecYaml()))
	if err != nil {
		return nil, err
	}
	if !req.GetDryRun() {
		if err := jobspec.CheckRunAs(spec, role, m.cfg.RunAs); err != nil {
			return nil, fmt.Errorf("%s: %w", source, err)
		}
	}
	plan, types, err := plansFor(spec)
	if err != nil {
		return nil, err
	}
	v, err := m.do(ctx, func() (any, error) { return m.intake.submit(req, source, spec, plan, types) })
	if err != nil {
		return nil, err
	}
	return v.(*api.SubmitJobResponse), nil
}

// jobAnswer runs a request that answers with a job.
func (m *Manager) jobAnswer(ctx context.Context, fn func() (*api.Job, error)) (*api.Job, error) {
	v, err := m.do(ctx, func() (any, error) {
		j, err := fn()
		if j == nil {
			return nil, err
		}
		return j, err
	})
	if j, ok := v.(*api.Job); ok {
		return j, err
	}
	return nil, err
}

// Cancel ends a job: a queued one at once, a running one by SIGTERM to its
// ranks (SIGKILL after the grace); its GPUs stay held until they are gone.
func (m *Manager) Cancel(ctx context.Context, key, who string) (*api.Job, error) {
	return m.jobAnswer(ctx, func() (*api.Job, error) {
		en, err := m.findEntry(key)
		if err != nil {
			return nil, err
		}
		j := en.job
		if err := may(j, EvCancel); err != nil {
			return nil, fmt.Errorf("%w (%s)", err, j.GetReason())
		}
		from := phaseOf(j)
		now := m.now()
		if j.GetState() == api.JobState_JOB_STATE_RUNNING {
			m.stops.addAttained(j, now)
		}
		j.State = api.JobState_JOB_STATE_CANCELLED
		j.EndUnixNano = now.UnixNano()
		j.Reason = "cancelled by " + who
		j.PendingReason, j.MoveTarget = "", nil
		m.stops.moves = slices.DeleteFunc(m.stops.moves, func(mv scheduler.Move) bool { return mv.Job == j.GetId() })
		m.fence.sweepSuperseded(j)
		if live := liveRanks(j); live > 0 {
			j.Stopping = api.JobStop_JOB_STOP_CANCEL
			j.StopSinceUnixNano, j.TermSentUnixNano = now.UnixNano(), 0
			m.log.Info("stopping cancelled job's ranks", "job", j.GetId(), "live", live)
		} else {
			j.Stopping = api.JobStop_JOB_STOP_NONE
			endAttempt(j, now, j.Reason)
		}
		m.check(from, EvCancel, j)
		m.save(en)
		m.log.Info("job cancelled", "job", j.GetId(), "by", who)
		m.kick()
		return clone(j), nil
	})
}

// Release lets a held job be scheduled.
func (m *Manager) Release(ctx context.Context, key string) (*api.Job, error) {
	return m.jobAnswer(ctx, func() (*api.Job, error) {
		en, err := m.findEntry(key)
		if err != nil {
			return nil, err
		}
		j := en.job
		if j.GetState() != api.JobState_JOB_STATE_PENDING || !j.GetHold() {
			return nil, fmt.Errorf("job %s is %s and not held: only a held pending job can be released", j.GetId(), phaseOf(j))
		}
		snap := m.placer.snapshot(m.now())
		r := m.placer.request(en)
		if why, never := scheduler.NeverFits(&snap, &r); never {
			return nil, fmt.Errorf("job %s can never run on this cluster as built: %s; it stays held", j.GetId(), why)
		}
		j.Hold = false
		j.PendingReason = "waiting for the scheduler"
		m.save(en)
		m.kick()
		return clone(j), nil
	})
}

// Assign starts a pending job on exactly the named nodes; the answer waits
// for the nodes to acknowledge the launch.
func (m *Manager) Assign(ctx context.Context, key string, nodes []string) (*api.Job, error) {
	v, err := m.do(ctx, func() (any, error) {
		en, err := m.findEntry(key)
		if err != nil {
			return nil, err
		}
		j := en.job
		switch {
		case j.GetState() == api.JobState_JOB_STATE_RUNNING:
			var on []string
			for _, jn := range j.GetPlacement() {
				on = append(on, jn.GetNode())
			}
			return nil, fmt.Errorf("job %s is running on %s: checkpoint-restart it first (`gpuctl rebalance --apply` moves running jobs that checkpoint)", j.GetId(), strings.Join(on, ","))
		case j.GetState() != api.JobState_JOB_STATE_PENDING:
			return nil, fmt.Errorf("job %s is %s; only a pending job can be assigned", j.GetId(), stateName(j.GetState()))
		case en.spec == nil:
			return nil, fmt.Errorf("job %s has no usable job file", j.GetId())
		}
		now := m.now()
		snap := m.placer.snapshot(now)
		r := m.placer.request(en)
		pl, err := scheduler.AssignExact(&snap, &r, nodes)
		if err != nil {
			var pe *scheduler.PlacementError
			if errors.As(err, &pe) {
				return nil, pe.AssignError(&r, nodes)
			}
			return nil, err
		}
		if !m.placer.start(en, pl, now, "") {
			return nil, fmt.Errorf("assign %s: could not record the placement; see the server log", j.GetId())
		}
		m.kick()
		return deferred{key: launchKey{job: j.GetId(), attempt: j.GetAttempt()}}, nil
	})
	if j, ok := v.(*api.Job); ok {
		return j, err
	}
	return nil, err
}

// Rebalance plans moves of running, checkpointing jobs that pack the
// cluster tighter; with apply they run one by one: checkpoint, stop,
// relaunch on the new GPUs resuming from the checkpoint.
func (m *Manager) Rebalance(ctx context.Context, req *api.RebalanceRequest) (*api.RebalanceResponse, error) {
	v, err := m.do(ctx, func() (any, error) {
		maxMoves := int(req.GetMaxMoves())
		if maxMoves <= 0 {
			maxMoves = m.cfg.MaxMoves
		}
		if req.GetApply() {
			busy := len(m.stops.moves) > 0
			for _, en := range m.jobs {
				if en.job.GetStopping() == api.JobStop_JOB_STOP_MOVE {
					busy = true
				}
			}
			if busy {
				return nil, errors.New("a rebalance is already moving jobs; wait until `gpuctl jobs` shows none moving, then plan again")
			}
		}
		snap := m.placer.snapshot(m.now())
		plan := scheduler.Rebalance(&snap, maxMoves)
		out := &api.RebalanceResponse{Before: packingOf(plan.Before), After: packingOf(plan.After)}
		for _, mv := range plan.Moves {
			out.Moves = append(out.Moves, &api.RebalanceMove{Job: mv.Job, From: jobNodes(&mv.From), To: jobNodes(&mv.To),
				Before: packingOf(mv.Before), After: packingOf(mv.After)})
		}
		if !req.GetApply() || len(plan.Moves) == 0 {
			return out, nil
		}
		m.stops.moves = plan.Moves
		out.Applied = true
		m.log.Info("rebalance started", "moves", len(plan.Moves), "cost_before", plan.Before.Cost(), "cost_after", plan.After.Cost())
		m.kick()
		return out, nil
	})
	if err != nil {
		return nil, err
	}
	return v.(*api.RebalanceResponse), nil
}

func packingOf(p scheduler.Packing) *api.Packing {
	return &api.Packing{FragmentedNodes: int32(p.FragmentedNodes), ExtraSwitches: int32(p.ExtraSwitches),
		ExtraRacks: int32(p.ExtraRacks), Cost: p.Cost()}
}

// Checkpoint asks every rank of a running job to checkpoint now (SIGUSR1).
func (m *Manager) Checkpoint(ctx context.Context, key string) (*api.Job, error) {
	return m.jobAnswer(ctx, func() (*api.Job, error) {
		en, err := m.findEntry(key)
		if err != nil {
			return nil, err
		}
		j := en.job
		if !active(j) {
			return nil, fmt.Errorf("job %s is %s: only a running job can checkpoint", j.GetId(), phaseOf(j))
		}
		if j.GetCheckpointDir() == "" {
			return nil, fmt.Errorf("job %s has no checkpoint dir: set checkpoint.dir in its job file", j.GetId())
		}
		m.prog.of(j.GetId()).CheckpointAt = m.now()
		m.raise(&api.Event{Kind: api.EventKind_EVENT_KIND_CHECKPOINT, Job: j.GetId(), Message: "checkpoint requested (SIGUSR1 to every rank)", Step: j.GetStep()})
		m.launcher.signal(j, "SIGUSR1")
		return clone(j), nil
	})
}

// Restart restarts a running job (or a failed one) from a checkpoint,
// optionally avoiding nodes: the same recovery a failure gets, without the
// max_restarts bound. A restart the scheduler cannot place is refused
// before any rank is touched.
func (m *Manager) Restart(ctx context.Context, key, from string, exclude []string, who string) (*api.Job, error) {
	return m.jobAnswer(ctx, func() (*api.Job, error) {
		en, err := m.findEntry(key)
		if err != nil {
			return nil, err
		}
		j := en.job
		resume := int64(-1)
		switch from {
		case "", "latest":
		default:
			n, err := strconv.ParseInt(from, 10, 64)
			if err != nil || n < 0 {
				return nil, fmt.Errorf("--from-checkpoint %q: give latest or a step number", from)
			}
			if n > 0 && !slices.Contains(j.GetCheckpointSteps(), n) {
				return nil, fmt.Errorf("--from-checkpoint %d: no checkpoint of step %d was reported for job %s (reported: %s)", n, n, j.GetId(), stepList(j.GetCheckpointSteps()))
			}
			resume = n
		}
		known := map[string]bool{}
		for _, n := range m.cfg.Nodes.Nodes() {
			known[n.GetRegistration().GetName()] = true
		}
		for _, n := range exclude {
			if !known[n] {
				return nil, fmt.Errorf("--exclude %s: unknown node: `gpuctl nodes` lists them", n)
			}
		}
		if en.spec == nil {
			return nil, fmt.Errorf("job %s has no usable job file", j.GetId())
		}
		if err := may(j, EvRestart); err != nil {
			return nil, err
		}
		if j.GetState() == api.JobState_JOB_STATE_FAILED && len(j.GetPlacement()) == 0 {
			return nil, fmt.Errorf("job %s failed before it ever ran: fix its job file and submit it again", j.GetId())
		}
		now := m.now()
		snap := m.placer.snapshot(now)
		req := m.rec.request(en, scheduler.Failure{Kind: scheduler.FailManual})
		req.Failure.Exclude = append(req.Failure.Exclude, exclude...)
		if d := scheduler.Recover(&snap, &req); d.Action == scheduler.GiveUp {
			return nil, fmt.Errorf("restart %s refused, the job is left as it is: %s", j.GetId(), d.Reason)
		}
		reason := "restart requested by " + who
		if len(exclude) > 0 {
			reason += " excluding " + strings.Join(exclude, ",")
		}
		if j.GetState() == api.JobState_JOB_STATE_FAILED {
			j.EndUnixNano = 0
		}
		m.rec.fail(en, scheduler.Failure{Kind: scheduler.FailManual, Exclude: exclude}, reason, now)
		if rec := m.rec.recs[j.GetId()]; rec != nil {
			rec.resume = resume
		}
		out := clone(j)
		if out.GetState() == api.JobState_JOB_STATE_FAILED {
			return out, fmt.Errorf("job %s: %s", out.GetId(), out.GetReason())
		}
		return out, nil
	})
}

func stepList(steps []int64) string {
	if len(steps) == 0 {
		return "none yet"
	}
	s := make([]string, len(steps))
	for i, n := range steps {
		s[i] = strconv.FormatInt(n, 10)
	}
	return strings.Join(s, ", ")
}

// Drain queues a move off node for every running job there that can be
// moved (it checkpoints and fits elsewhere), and says for each job with
// live ranks on the node what becomes of it. The node must already be
// draining. The moves run one at a time like a rebalance: checkpoint,
// stop, relaunch resuming from it.
func (m *Manager) Drain(ctx context.Context, node string) ([]*api.DrainedJob, error) {
	v, err := m.do(ctx, func() (any, error) {
		snap := m.placer.snapshot(m.now())
		queued := map[string][]string{}
		for i := range m.stops.moves {
			queued[m.stops.moves[i].Job] = m.stops.moves[i].To.Nodes()
		}
		var cands []scheduler.DrainJob
		for _, en := range m.sorted() {
			j := en.job
			if !liveOn(j, node) {
				continue
			}
			c := scheduler.DrainJob{Placement: placementOf(j.GetPlacement(), shapeOf(j)),
				Checkpoints: en.spec != nil && en.spec.Checkpoint.Dir != ""}
			if en.spec != nil {
				c.Request = m.placer.request(en)
			} else {
				c.Request = scheduler.JobRequest{ID: j.GetId()}
			}
			switch {
			case j.GetStopping() == api.JobStop_JOB_STOP_MOVE:
				for _, jn := range j.GetMoveTarget() {
					c.MovingTo = append(c.MovingTo, jn.GetNode())
				}
				if c.MovingTo == nil {
					c.MovingTo = []string{}
				}
			case !active(j):
				c.Stopping = "job " + phaseOf(j).String()
			case queued[j.GetId()] != nil:
				c.MovingTo = queued[j.GetId()]
			}
			cands = append(cands, c)
		}
		var out []*api.DrainedJob
		for _, o := range scheduler.PlanDrain(&snap, node, m.stops.moves, cands) {
			d := &api.DrainedJob{Job: o.Job, To: o.To, Reason: o.Reason, Moving: o.Reason == ""}
			if o.Move != nil {
				m.stops.moves = append(m.stops.moves, *o.Move)
				m.log.Info("drain: moving job", "node", node, "job", o.Job, "to", o.To)
			}
			out = append(out, d)
		}
		m.kick()
		return out, nil
	})
	if err != nil {
		return nil, err
	}
	return v.([]*api.DrainedJob), nil
}

// Kick asks for a scheduling pass soon (a node uncordoned, say).
func (m *Manager) Kick() {
	m.in.post(msgCall{fn: func() (any, error) { m.kick(); return nil, nil }, reply: make(chan reply, 1)})
}
