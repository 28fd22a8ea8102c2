package jobs

import (
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/gpuctl/gpuctl/api"
	"github.com/gpuctl/gpuctl/scheduler"
)

// stopper stops running jobs for the owner, whatever the stop is for (a
// cancel, a preemption, a move, a recovery): checkpoint first where it
// may, SIGTERM, SIGKILL past the grace, then the job's next phase once its
// ranks are gone. It also keeps the moves not yet begun, which run one at
// a time. The jobs and the current step are the owner's, reached through
// m. It runs on the owner's goroutine only.
type stopper struct {
	m *Manager
	// moves are the moves not yet begun.
	moves []scheduler.Move
}

// preemptGrace is how long a preempted job may take to checkpoint.
func (sp *stopper) preemptGrace() time.Duration {
	if p, ok := sp.m.cfg.Policy.(scheduler.Preemptor); ok && p.Grace() > 0 {
		return time.Duration(p.Grace()) * time.Second
	}
	return sp.m.cfg.MoveGrace
}

// drive drives every stopping job: SIGTERM once its checkpoint landed (or
// its grace ran out), SIGKILL if ranks outlive KillAfter, and the next
// phase once every rank is gone.
func (sp *stopper) drive(nodes []*api.NodeStatus, now time.Time) {
	for _, en := range sp.m.sorted() {
		j := en.job
		if j.GetStopping() == api.JobStop_JOB_STOP_NONE {
			continue
		}
		if liveRanks(j) == 0 {
			if j.GetStopping() == api.JobStop_JOB_STOP_MOVE && len(sp.m.fence.unfenced(en, now)) > 0 {
				// The move relaunches at once: not while a lost node may
				// still run the old attempt.
				continue
			}
			sp.finishStop(en, now)
			continue
		}
		changed := false
		if j.GetTermSentUnixNano() == 0 {
			term := true
			switch j.GetStopping() {
			case api.JobStop_JOB_STOP_PREEMPT, api.JobStop_JOB_STOP_MOVE:
				grace := sp.m.cfg.MoveGrace
				if j.GetStopping() == api.JobStop_JOB_STOP_PREEMPT {
					grace = sp.preemptGrace()
				}
				// The nodes report each checkpoint that lands; the server
				// need not see the checkpoint dir itself.
				term = j.GetLastCheckpointStep() > j.GetStopCheckpointStep() || now.Sub(time.Unix(0, j.GetStopSinceUnixNano())) >= grace
			}
			if term {
				en.killSent = false
				j.TermSentUnixNano = now.UnixNano()
				sp.m.launcher.signal(j, "SIGTERM")
				changed = true
			}
		} else if grace := sp.killAfter(j); now.Sub(time.Unix(0, j.GetTermSentUnixNano())) >= grace {
			if en.killSent {
				// SIGKILL cannot be ignored: a rank still counted live a
				// grace after it is one its node no longer has (its exit
				// was lost with a restarted nodemon).
				sp.giveUpRanks(en, nodes)
			} else {
				sp.m.log.Warn("ranks outlived SIGTERM; killing", "job", j.GetId(), "live", liveRanks(j))
				sp.m.launcher.signal(j, "SIGKILL")
				en.killSent = true
			}
			j.TermSentUnixNano = now.UnixNano()
			changed = true
		}
		if changed {
			sp.m.save(en)
		}
	}
}

// killAfter is how long a stopping job's ranks have after SIGTERM.
func (sp *stopper) killAfter(j *api.Job) time.Duration {
	if j.GetState() == api.JobState_JOB_STATE_RECOVERING {
		return sp.m.cfg.RecoveryKillAfter
	}
	return sp.m.cfg.KillAfter
}

// giveUpRanks marks exited the ranks a SIGKILL and a grace did not account
// for. A rank on a connected node that is still counted live then is one
// its nodemon no longer knows (the exit was lost when it restarted).
func (sp *stopper) giveUpRanks(en *entry, nodes []*api.NodeStatus) {
	j := en.job
	connected := map[string]bool{}
	for _, n := range nodes {
		connected[n.GetRegistration().GetName()] = n.GetConnected()
	}
	var gone []string
	for _, jn := range j.GetPlacement() {
		if !connected[jn.GetNode()] {
			// Its ranks may still run there: they count gone only with
			// the node (lostNodes).
			continue
		}
		for _, r := range jn.GetRanks() {
			if !r.GetExited() {
				r.Exited, r.ExitCode, r.Signal = true, -1, "unaccounted after SIGKILL"
				gone = append(gone, fmt.Sprintf("%s rank %d (pid %d)", jn.GetNode(), r.GetRank(), r.GetPid()))
			}
		}
	}
	sp.m.log.Warn("ranks unaccounted for a grace after SIGKILL; counting them gone", "job", j.GetId(), "ranks", gone)
}

// finishStop moves a job whose ranks are all gone to its next phase.
func (sp *stopper) finishStop(en *entry, now time.Time) {
	j := en.job
	from := phaseOf(j)
	en.killSent = false
	stop := j.GetStopping()
	defer sp.m.check(from, EvStopped, j)
	sp.m.save(en)
	endAttempt(j, now, j.GetReason())
	if stop == api.JobStop_JOB_STOP_MOVE {
		target := j.GetMoveTarget()
		shape := shapeOf(j)
		if n := countRanks(target); n > 0 && shape.Size() != n {
			// A resize: the target's data-parallel size is the new one.
			shape.DP = n / max(shape.TP*shape.PP, 1)
		}
		pl := placementOf(target, shape)
		why := sp.targetBusy(j.GetId(), &pl, now)
		if why == "" {
			sp.addAttained(j, now)
			sp.m.placer.start(en, pl, now, "")
			return
		}
		j.Reason = "move target no longer free (" + why + "); back in the queue, resumes from its checkpoint"
	}
	j.Stopping, j.TermSentUnixNano, j.StopSinceUnixNano = api.JobStop_JOB_STOP_NONE, 0, 0
	if sp.m.rec.recs[j.GetId()] == nil {
		// A recovering job keeps its reservation once its ranks are gone:
		// its surviving GPUs are its own until it decides, or another
		// recovery would take them and count its node as failed.
		j.MoveTarget = nil
	}
	switch stop {
	case api.JobStop_JOB_STOP_PREEMPT:
		sp.requeue(en, now)
		j.Preemptions++
	case api.JobStop_JOB_STOP_MOVE:
		sp.requeue(en, now)
	}
}

func countRanks(nodes []*api.JobNode) int {
	n := 0
	for _, jn := range nodes {
		n += len(jn.GetRanks())
	}
	return n
}

func (sp *stopper) addAttained(j *api.Job, now time.Time) {
	if j.GetStartUnixNano() > 0 {
		j.AttainedGpuSeconds += now.Sub(time.Unix(0, j.GetStartUnixNano())).Seconds() * float64(jobGPUs(j))
	}
}

// requeue puts a stopped job back in the queue; it resumes from its
// checkpoint when it starts again.
func (sp *stopper) requeue(en *entry, now time.Time) {
	j := en.job
	sp.addAttained(j, now)
	j.State = api.JobState_JOB_STATE_PENDING
	j.Placement = nil
	j.StartUnixNano = 0
	j.PendingReason = "waiting for the scheduler"
	sp.m.kick()
}

// targetBusy says why a placement's GPUs cannot take job id now, or "".
func (sp *stopper) targetBusy(id string, pl *scheduler.Placement, now time.Time) string {
	snap := sp.m.placer.snapshot(now)
	nodes := map[string]*scheduler.Node{}
	for i := range snap.Nodes {
		nodes[snap.Nodes[i].Name] = &snap.Nodes[i]
	}
	for _, s := range pl.Ranks {
		n := nodes[s.Node]
		if n == nil || n.State != scheduler.NodeReady {
			return "node " + s.Node + " is not ready"
		}
		for _, g := range n.GPUs {
			if g.Index != s.GPU {
				continue
			}
			if !g.Healthy {
				return fmt.Sprintf("GPU %d of %s is unhealthy", s.GPU, s.Node)
			}
			if g.Job != "" && g.Job != id {
				return fmt.Sprintf("GPU %d of %s is taken by %s", s.GPU, s.Node, g.Job)
			}
		}
	}
	return ""
}

// beginMoves begins the next queued move once none is in flight:
// checkpoint (SIGUSR1) now, SIGTERM when it lands, relaunch when all
// ranks are gone.
func (sp *stopper) beginMoves(now time.Time) {
	for _, en := range sp.m.jobs {
		if en.job.GetStopping() == api.JobStop_JOB_STOP_MOVE {
			return
		}
	}
	for len(sp.moves) > 0 {
		mv := sp.moves[0]
		sp.moves = sp.moves[1:]
		en := sp.m.jobs[mv.Job]
		if en == nil || may(en.job, EvMove) != nil {
			continue
		}
		j := en.job
		cur := placementOf(j.GetPlacement(), shapeOf(j))
		if !slices.Equal(cur.Ranks, mv.From.Ranks) {
			sp.m.log.Info("move skipped: the job moved since it was planned", "job", j.GetId())
			continue
		}
		sp.startMove(en, mv.To, "moving to "+strings.Join(mv.To.Nodes(), ",")+" (rebalance): checkpointing", now)
		return
	}
}

// startMove stops a running job by checkpoint to relaunch it on to.
func (sp *stopper) startMove(en *entry, to scheduler.Placement, reason string, now time.Time) {
	j := en.job
	from := phaseOf(j)
	j.Stopping = api.JobStop_JOB_STOP_MOVE
	j.MoveTarget = jobNodes(&to)
	j.StopSinceUnixNano, j.TermSentUnixNano = now.UnixNano(), 0
	j.StopCheckpointStep = j.GetLastCheckpointStep()
	j.Reason = reason
	sp.m.check(from, EvMove, j)
	sp.m.save(en)
	sp.m.launcher.signal(j, "SIGUSR1")
}

// preempt begins stopping a job the scheduler preempts: checkpoint first
// when it checkpoints, then SIGTERM (stops), then back to the queue once
// its ranks are gone.
func (sp *stopper) preempt(en *entry, d scheduler.Preempt, now time.Time) bool {
	j := en.job
	if may(j, EvPreempt) != nil {
		return false
	}
	from := phaseOf(j)
	j.Stopping = api.JobStop_JOB_STOP_PREEMPT
	j.StopSinceUnixNano, j.TermSentUnixNano = now.UnixNano(), 0
	j.StopCheckpointStep = j.GetLastCheckpointStep()
	j.Reason = fmt.Sprintf("preempted for %s: %s", d.For, d.Reason)
	sig := "SIGUSR1"
	if !d.CheckpointFirst {
		sig = "SIGTERM"
		j.TermSentUnixNano = now.UnixNano()
	}
	sp.m.check(from, EvPreempt, j)
	sp.m.save(en)
	sp.m.log.Info("preempting job", "job", j.GetId(), "for", d.For, "signal", sig)
	sp.m.launcher.signal(j, sig)
	return true
}
