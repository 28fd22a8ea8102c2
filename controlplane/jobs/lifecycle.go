package jobs

import (
	"fmt"

	"github.com/gpuctl/gpuctl/api"
)

// The job lifecycle, declared. A job's phase is its state together with
// what gpuctl is doing to its ranks; every change of phase goes through
// transition, which checks it against this table, so the table is the
// specification and its test drives every cell.

// Phase is where a job is in its lifecycle.
type Phase int

// Phases.
const (
	// Pending: queued, or held for `gpuctl assign`.
	Pending Phase = iota
	// Running: an attempt runs and nothing is stopping it.
	Running
	// Preempting: running, being checkpointed and stopped to go back to
	// the queue.
	Preempting
	// Moving: running, being checkpointed and stopped to relaunch on its
	// move target (rebalance, drain, elastic resize).
	Moving
	// Recovering: a failure was seen; survivors stop, nodes are chosen and
	// validated, the next attempt launches.
	Recovering
	// Cancelling: cancelled; its ranks are still being stopped.
	Cancelling
	// Failing: failed for good; the rest of its ranks are being stopped.
	Failing
	Succeeded
	Failed
	Cancelled
	numPhases
)

var phaseNames = [...]string{"pending", "running", "preempting", "moving", "recovering", "cancelling", "failing", "succeeded", "failed", "cancelled"}

func (p Phase) String() string {
	if p >= 0 && p < numPhases {
		return phaseNames[p]
	}
	return fmt.Sprintf("Phase(%d)", int(p))
}

// phaseOf reads a job's phase from its record.
func phaseOf(j *api.Job) Phase {
	switch j.GetState() {
	case api.JobState_JOB_STATE_PENDING:
		return Pending
	case api.JobState_JOB_STATE_RUNNING:
		switch j.GetStopping() {
		case api.JobStop_JOB_STOP_PREEMPT:
			return Preempting
		case api.JobStop_JOB_STOP_MOVE:
			return Moving
		}
		return Running
	case api.JobState_JOB_STATE_RECOVERING:
		return Recovering
	case api.JobState_JOB_STATE_SUCCEEDED:
		return Succeeded
	case api.JobState_JOB_STATE_CANCELLED:
		if j.GetStopping() != api.JobStop_JOB_STOP_NONE {
			return Cancelling
		}
		return Cancelled
	case api.JobState_JOB_STATE_FAILED:
		if j.GetStopping() != api.JobStop_JOB_STOP_NONE {
			return Failing
		}
		return Failed
	}
	return Pending
}

// active is the phase in which a job's ranks work undisturbed: the one
// in which a failure, a checkpoint request or a stall concerns it.
func active(j *api.Job) bool { return phaseOf(j) == Running }

// stateName is a job state as people and scripts read it.
func stateName(s api.JobState) string { return s.Short() }

// Event is what moves a job between phases.
type Event int

// Events.
const (
	// EvStart launches an attempt (scheduler, assign, recovery, move).
	EvStart Event = iota
	// EvSucceed: every rank of the attempt exited 0.
	EvSucceed
	// EvFail: a rank failed, its node or GPU failed, it stalled (auto),
	// or a node refused its launch; recovery decides what next.
	EvFail
	// EvGiveUp: the job breaks for good (policy, no room, bad file).
	EvGiveUp
	// EvCancel: an operator cancels it.
	EvCancel
	// EvPreempt: the scheduler stops it for a higher-ranked job.
	EvPreempt
	// EvMove: a rebalance, drain or resize moves it.
	EvMove
	// EvStopped: every rank of a stopping job is gone.
	EvStopped
	// EvRestart: an operator restarts it from a checkpoint.
	EvRestart
	numEvents
)

var eventNames = [...]string{"start", "succeed", "fail", "give up", "cancel", "preempt", "move", "stopped", "restart"}

func (e Event) String() string {
	if e >= 0 && e < numEvents {
		return eventNames[e]
	}
	return fmt.Sprintf("Event(%d)", int(e))
}

// cell is one entry of the table: the phases the event may lead to (two
// when it depends on whether live ranks remain), or why it is refused.
type cell struct {
	to      []Phase
	refusal string
}

func to(p ...Phase) cell           { return cell{to: p} }
func refuse(why string) cell       { return cell{refusal: why} }
func (c cell) allows(p Phase) bool { return contains(c.to, p) }

func contains(ps []Phase, p Phase) bool {
	for _, q := range ps {
		if q == p {
			return true
		}
	}
	return false
}

// Lifecycle is the transition table: phase × event → phases. It is total:
// every pair has an entry, a transition or the reason it is refused.
var Lifecycle = [numPhases][numEvents]cell{
	Pending: {
		EvStart: to(Running), EvSucceed: refuse("it has not started"), EvFail: refuse("it is not running"),
		EvGiveUp: to(Failed), EvCancel: to(Cancelled), EvPreempt: refuse("it is not running"),
		EvMove: refuse("it is not running: `gpuctl assign` places a pending job"), EvStopped: refuse("it has no ranks"),
		EvRestart: refuse("only a running or failed job can be restarted"),
	},
	Running: {
		EvStart: refuse("it is already running"), EvSucceed: to(Succeeded), EvFail: to(Recovering),
		EvGiveUp: to(Failing, Failed), EvCancel: to(Cancelling, Cancelled), EvPreempt: to(Preempting),
		EvMove: to(Moving), EvStopped: refuse("it is not being stopped"), EvRestart: to(Recovering),
	},
	Preempting: {
		EvStart: refuse("it is being preempted"), EvSucceed: refuse("it is being preempted: it goes back to the queue"), EvFail: refuse("it is being preempted: its ranks are stopping anyway"),
		EvGiveUp: to(Failing, Failed), EvCancel: to(Cancelling, Cancelled), EvPreempt: refuse("it is already being preempted"),
		EvMove: refuse("it is being preempted"), EvStopped: to(Pending), EvRestart: refuse("it is being preempted; restart it once that is done"),
	},
	Moving: {
		EvStart: to(Running), EvSucceed: refuse("it is being moved: it relaunches on its target"), EvFail: refuse("it is being moved: its ranks are stopping anyway"),
		EvGiveUp: to(Failing, Failed), EvCancel: to(Cancelling, Cancelled), EvPreempt: refuse("it is being moved"),
		EvMove: refuse("it is already being moved"), EvStopped: to(Running, Pending), EvRestart: refuse("it is being moved; restart it once that is done"),
	},
	Recovering: {
		EvStart: to(Running), EvSucceed: refuse("it is recovering"), EvFail: to(Recovering),
		EvGiveUp: to(Failing, Failed), EvCancel: to(Cancelling, Cancelled), EvPreempt: refuse("it is recovering"),
		EvMove: refuse("it is recovering"), EvStopped: to(Recovering), EvRestart: refuse("it is already recovering"),
	},
	Cancelling: {
		EvStart: refuse("it is cancelled"), EvSucceed: refuse("it is cancelled"), EvFail: refuse("it is cancelled"),
		EvGiveUp: refuse("it is cancelled"), EvCancel: refuse("it is already cancelled"), EvPreempt: refuse("it is cancelled"),
		EvMove: refuse("it is cancelled"), EvStopped: to(Cancelled), EvRestart: refuse("it is cancelled"),
	},
	Failing: {
		EvStart: refuse("it has failed"), EvSucceed: refuse("it has failed"), EvFail: refuse("it has failed"),
		EvGiveUp: refuse("it has already failed"), EvCancel: refuse("it has failed"), EvPreempt: refuse("it has failed"),
		EvMove: refuse("it has failed"), EvStopped: to(Failed), EvRestart: refuse("its ranks are still being stopped; restart it once that is done"),
	},
	Succeeded: endCells("succeeded", false),
	Failed:    endCells("failed", true),
	Cancelled: endCells("cancelled", false),
}

// endCells is a terminal phase's row: everything refused, but a failed
// job can be restarted by an operator.
func endCells(what string, restartable bool) [numEvents]cell {
	var row [numEvents]cell
	for e := range numEvents {
		row[e] = refuse("it has " + what)
	}
	row[EvCancel] = refuse("it already " + what)
	if restartable {
		row[EvRestart] = to(Recovering)
	}
	return row
}

// may reports whether ev is allowed in j's phase, and if not why, in words
// for an operator: "job j-1a2b3c is pending: it is not running".
func may(j *api.Job, ev Event) error {
	c := Lifecycle[phaseOf(j)][ev]
	if c.refusal != "" {
		return fmt.Errorf("job %s is %s: %s", j.GetId(), phaseOf(j), c.refusal)
	}
	return nil
}

// transitioned checks, after a handler changed j for ev, that the phase it
// reached is one the table allows from the phase it left.
func transitioned(from Phase, ev Event, j *api.Job) error {
	if got := phaseOf(j); !Lifecycle[from][ev].allows(got) {
		return fmt.Errorf("job %s: %s from %s reached %s, which the lifecycle does not allow", j.GetId(), ev, from, got)
	}
	return nil
}
