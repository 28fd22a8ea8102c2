package jobs

import (
	"time"

	"github.com/gpuctl/gpuctl/api"
	"github.com/gpuctl/gpuctl/controlplane/accounting"
)

// progress is a job's counters between passes.
type progress = accounting.Progress

// progressTable keeps the running jobs' counters between passes and
// refreshes them from what the nodes report. The jobs are the owner's,
// reached through m. It runs on the owner's goroutine only.
type progressTable struct {
	m     *Manager
	byJob map[string]*progress
}

// of is job id's counters, made on first use.
func (pt *progressTable) of(id string) *progress {
	p := pt.byJob[id]
	if p == nil {
		p = accounting.NewProgress()
		pt.byJob[id] = p
	}
	return p
}

// update refreshes every running job's counters from what its nodes
// report, calibrates the cost model with its measured pace, and asks for a
// checkpoint (SIGUSR1) where the server paces a job's checkpoints.
func (pt *progressTable) update(all []*api.NodeStatus, now time.Time) {
	var (
		byName map[string]*api.NodeStatus
		ranks  map[string][]*api.RankStatus
	)
	jobs := make([]*api.Job, 0, len(pt.m.jobs))
	for _, en := range pt.m.jobs {
		jobs = append(jobs, en.job)
	}
	mtbf := accounting.GPUMTBF(jobs, now)
	for _, en := range pt.m.sorted() {
		j := en.job
		if j.GetState() != api.JobState_JOB_STATE_RUNNING {
			if p := pt.byJob[j.GetId()]; p != nil && j.GetState().Ended() {
				delete(pt.byJob, j.GetId())
			} else if p != nil {
				p.Pause()
			}
			continue
		}
		if byName == nil {
			byName = make(map[string]*api.NodeStatus, len(all))
			for _, n := range all {
				byName[n.GetRegistration().GetName()] = n
			}
			ranks = ranksByJob(pt.m.cfg.Nodes.Ranks(""))
		}
		p := pt.of(j.GetId())
		ckptBefore := j.GetLastCheckpointStep()
		changed := p.Update(j, accounting.Inputs{Ranks: ranks[j.GetId()], Nodes: byName, GPUMTBF: mtbf, Intensity: pt.m.cfg.Intensity}, now)
		if step := j.GetLastCheckpointStep(); step > ckptBefore {
			j.LastCheckpointStep = ckptBefore
			pt.m.nodes.checkpointComplete(j, step)
		}
		if pace, ok := p.Pace(minCalibrationSteps); ok && j.GetPlan() != nil {
			if before := j.GetPlan().GetMeasuredStepSeconds(); before == 0 || abs(pace-before) > 0.01*before {
				calibrate(en.spec, j.Plan, pace)
				changed = true
			}
		}
		if en.spec != nil && en.spec.Checkpoint.IntervalAuto && active(j) {
			every := time.Duration(j.GetAdvisedCheckpointIntervalSeconds() * float64(time.Second))
			if every <= 0 {
				every = en.spec.Checkpoint.Interval
			}
			if p.DueCheckpoint(j, every, now) {
				pt.m.log.Info("asking for a checkpoint at the advised interval", "job", j.GetId(), "every", every)
				pt.m.launcher.signal(j, "SIGUSR1")
			}
		}
		if changed {
			pt.m.save(en)
		}
	}
}

func abs(x float64) float64 {
	if x < 0 {
		return -x
	}
	return x
}

// endAttempt closes the job's current attempt record, once.
func endAttempt(j *api.Job, now time.Time, reason string) {
	n := len(j.GetAttempts())
	if n == 0 {
		return
	}
	a := j.Attempts[n-1]
	if a.GetEndUnixNano() != 0 {
		return
	}
	a.EndUnixNano = now.UnixNano()
	a.EndReason = reason
	a.LastStep = max(a.GetLastStep(), j.GetStep())
	a.GpuSeconds = now.Sub(time.Unix(0, a.GetStartUnixNano())).Seconds() * float64(a.GetGpus())
}
