package jobs

import (
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/gpuctl/gpuctl/api"
	"github.com/gpuctl/gpuctl/scheduler"
)

// nodeWatch applies what the nodes report to the owner's jobs: a node
// lost or back, its ranks started and exited, its checkpoints. It keeps
// nothing of its own: what it learns goes on the jobs, which are the
// owner's, reached through m. It runs on the owner's goroutine only.
type nodeWatch struct{ m *Manager }

// apply applies one persisted node event: rank starts and exits move
// jobs along, checkpoints are counted, GPU faults fail jobs over.
func (nw *nodeWatch) apply(e *api.Event) {
	switch e.GetKind() {
	case api.EventKind_EVENT_KIND_JOB:
		nw.rankStarted(e)
	case api.EventKind_EVENT_KIND_PROCESS_EXIT:
		nw.rankExited(e)
	case api.EventKind_EVENT_KIND_CHECKPOINT:
		nw.checkpointed(e)
	case api.EventKind_EVENT_KIND_XID, api.EventKind_EVENT_KIND_ECC, api.EventKind_EVENT_KIND_GPU_LOST:
		nw.m.rec.gpuFault(e)
	}
}

func (nw *nodeWatch) rankStarted(e *api.Event) {
	if e.GetPid() == 0 || nw.m.gangs.event(e) {
		return
	}
	en := nw.m.jobs[e.GetJob()]
	if en == nil {
		return
	}
	r := findRank(en.job, e.GetNode(), e.GetRank())
	if r == nil || r.GetExited() || r.GetPid() != 0 {
		return
	}
	r.Pid = e.GetPid()
	nw.m.save(en)
}

// rankExited records an exit of the current attempt; an exit whose pid is
// not the one recorded belongs to an earlier attempt and is ignored.
func (nw *nodeWatch) rankExited(e *api.Event) {
	if nw.m.gangs.event(e) {
		return
	}
	en := nw.m.jobs[e.GetJob()]
	if en == nil {
		return
	}
	j := en.job
	r := findRank(j, e.GetNode(), e.GetRank())
	if r == nil || r.GetExited() || r.GetPid() != e.GetPid() {
		return
	}
	r.Exited, r.ExitCode, r.Signal = true, e.GetExitCode(), e.GetSignal()
	// The exit carries the last step the rank printed, fresher than the
	// last rank status: it bounds the steps a restart loses.
	if e.GetStep() > j.GetStep() {
		j.Step = e.GetStep()
	}
	if rec := nw.m.rec.recs[j.GetId()]; rec != nil && e.GetStep() > rec.stepAt {
		rec.stepAt = e.GetStep()
	}
	nw.m.save(en)
	nw.m.kick()
	if !active(j) {
		return
	}
	now := nw.m.now()
	switch {
	case e.GetExitCode() != 0 || e.GetSignal() != "":
		nw.m.rec.fail(en, scheduler.Failure{Kind: scheduler.FailRankExit},
			fmt.Sprintf("rank %d on %s (pid %d) %s", e.GetRank(), e.GetNode(), e.GetPid(), describeExit(e.GetExitCode(), e.GetSignal())), now)
	case liveRanks(j) == 0:
		from := phaseOf(j)
		j.State = api.JobState_JOB_STATE_SUCCEEDED
		j.EndUnixNano = now.UnixNano()
		j.Reason = fmt.Sprintf("all %d ranks exited with code 0", jobGPUs(j))
		endAttempt(j, now, j.Reason)
		nw.m.check(from, EvSucceed, j)
		nw.m.log.Info("job succeeded", "job", j.GetId(), "attempt", j.GetAttempt())
	}
}

func describeExit(code int32, signal string) string {
	if signal != "" {
		return "was killed by " + signal
	}
	return fmt.Sprintf("exited with code %d", code)
}

// down marks the ranks on a lost node gone and fails their jobs.
func (nw *nodeWatch) down(node, why string, now time.Time) {
	for _, v := range nw.m.gangs.byID {
		if r := v.ranks[node]; r != nil && !r.exited {
			r.exited, r.code, r.err = true, -1, "node went down ("+why+")"
		}
	}
	for _, en := range nw.m.sorted() {
		j := en.job
		hit := false
		for _, jn := range j.GetPlacement() {
			if jn.GetNode() != node {
				continue
			}
			for _, r := range jn.GetRanks() {
				if !r.GetExited() {
					r.Exited, r.ExitCode, r.Signal = true, -1, lostRank
					hit = true
				}
			}
		}
		if !hit {
			continue
		}
		nw.m.fence.awaitFence(en, node, now)
		nw.m.save(en)
		if active(j) || phaseOf(j) == Recovering {
			nw.m.rec.fail(en, scheduler.Failure{Kind: scheduler.FailNodeDown, Nodes: []string{node}},
				fmt.Sprintf("node %s went down (%s)", node, why), now)
		}
	}
}

// up applies a node's (re)registration: what may be left of ranks
// given up when it went down is killed (their jobs have moved on, and its
// GPUs must not run two jobs), and a live rank of ours it no longer runs
// is gone (its exit was lost with a restarted nodemon).
func (nw *nodeWatch) up(node string, reg *api.NodeRegistration) {
	nw.m.fence.onReturn(node, reg.GetRunning())
	var leftovers []string
	for _, en := range nw.m.sorted() {
		for _, jn := range en.job.GetPlacement() {
			if jn.GetNode() != node {
				continue
			}
			for _, r := range jn.GetRanks() {
				if r.GetSignal() == lostRank && !slices.Contains(leftovers, en.job.GetId()) {
					leftovers = append(leftovers, en.job.GetId())
				}
			}
		}
	}
	for _, id := range leftovers {
		nw.m.log.Info("killing ranks left from before the node went down", "job", id, "node", node)
		nw.m.launcher.signalAttempt(id, nw.m.jobs[id].job.GetAttempt(), []string{node}, "SIGKILL")
	}
	nw.m.kick()
	if len(reg.GetRunning()) == 0 {
		// Nothing reported (or a nodemon that does not report): exits of
		// ranks it had arrive as events, and a stop that finds no rank
		// gives it up after SIGKILL (stops).
		return
	}
	running := map[uint32]bool{}
	for _, r := range reg.GetRunning() {
		running[r.GetPid()] = true
	}
	now := nw.m.now()
	for _, en := range nw.m.sorted() {
		j := en.job
		var gone []string
		for _, jn := range j.GetPlacement() {
			if jn.GetNode() != node {
				continue
			}
			for _, r := range jn.GetRanks() {
				if r.GetExited() || r.GetPid() == 0 || running[r.GetPid()] {
					continue
				}
				r.Exited, r.ExitCode, r.Signal = true, -1, "gone after reconnect"
				gone = append(gone, fmt.Sprintf("rank %d (pid %d)", r.GetRank(), r.GetPid()))
			}
		}
		if len(gone) == 0 {
			continue
		}
		nw.m.save(en)
		if active(j) {
			nw.m.rec.fail(en, scheduler.Failure{Kind: scheduler.FailRankExit},
				fmt.Sprintf("%s on %s no longer running when the node reconnected", strings.Join(gone, ", "), node), now)
		}
	}
}

// checkpointSteps bounds the reported checkpoint steps a job keeps.
const checkpointSteps = 16

// checkpointed records a checkpoint the nodes reported: rank 0's node
// reports each one whose `latest` marker landed, which makes it complete.
// The server trusts these reports; it need not see the checkpoint dir.
func (nw *nodeWatch) checkpointed(e *api.Event) {
	en := nw.m.jobs[e.GetJob()]
	if en == nil {
		return
	}
	j := en.job
	if r := findRank(j, e.GetNode(), e.GetRank()); r == nil || (e.GetPid() != 0 && r.GetPid() != 0 && r.GetPid() != e.GetPid()) {
		return
	}
	if e.GetSeconds() > 0 {
		n := float64(j.GetCheckpoints())
		j.CheckpointSeconds = (j.GetCheckpointSeconds()*n + e.GetSeconds()) / (n + 1)
		j.Checkpoints++
	}
	nw.m.prog.of(j.GetId()).CheckpointAt = nw.m.now()
	nw.checkpointComplete(j, e.GetStep())
	nw.m.save(en)
}

// checkpointComplete records step as the job's latest complete
// checkpoint, if it is newer.
func (nw *nodeWatch) checkpointComplete(j *api.Job, step int64) {
	if step <= j.GetLastCheckpointStep() {
		return
	}
	j.LastCheckpointStep = step
	if !slices.Contains(j.CheckpointSteps, step) {
		j.CheckpointSteps = append(j.CheckpointSteps, step)
		if n := len(j.CheckpointSteps); n > checkpointSteps {
			j.CheckpointSteps = slices.Clone(j.CheckpointSteps[n-checkpointSteps:])
		}
	}
	// A stop waiting for this checkpoint can proceed now.
	nw.m.kick()
}

// rewind makes step the job's latest checkpoint when an attempt resumes
// from an earlier one (gpuctl restart --from-checkpoint): the run goes on
// from there and writes its later checkpoints anew, so the ones reported
// after step belong to the abandoned run and no longer count.
func rewind(j *api.Job, step int64) {
	if step >= j.GetLastCheckpointStep() {
		return
	}
	j.LastCheckpointStep = step
	j.CheckpointSteps = slices.DeleteFunc(j.CheckpointSteps, func(s int64) bool { return s > step })
}
