package scheduler

import (
	"errors"
	"slices"
)

// DrainJob is a job with live ranks on a node being drained.
type DrainJob struct {
	Request JobRequest
	// Placement is where it runs now.
	Placement Placement
	// MovingTo is set when a move of the job is already under way or
	// queued: the nodes it goes to.
	MovingTo []string
	// Stopping says why its ranks are being stopped, when they are (a
	// cancel, a failure): such a job is not moved.
	Stopping string
	// Checkpoints is set when the job names a checkpoint dir: only such a
	// job can move without losing its progress.
	Checkpoints bool
}

// DrainOutcome is what becomes of one job on a drained node.
type DrainOutcome struct {
	Job string
	// Move is set when the drain queues a move of the job (checkpoint,
	// stop, relaunch on Move.To).
	Move *Move
	// To is where the job goes, when it moves (newly or already).
	To []string
	// Reason says why the job stays on the node, when it does.
	Reason string
}

// PlanDrain decides, for each job on node (in the order given), whether it
// moves off it and where: a job already moving keeps going, a job being
// stopped or one that cannot checkpoint stays (with why), the others are
// assigned GPUs on the other nodes. Targets of queued moves and of moves
// planned here are held so that no two land on the same GPUs.
func PlanDrain(s *Snapshot, node string, queued []Move, jobs []DrainJob) []DrainOutcome {
	view := *s
	view.Nodes = make([]Node, len(s.Nodes))
	for i, n := range s.Nodes {
		n.GPUs = slices.Clone(n.GPUs)
		view.Nodes[i] = n
	}
	hold := func(job string, pl *Placement) {
		for _, sl := range pl.Ranks {
			for i := range view.Nodes {
				if view.Nodes[i].Name != sl.Node {
					continue
				}
				for k := range view.Nodes[i].GPUs {
					if g := &view.Nodes[i].GPUs[k]; g.Index == sl.GPU && g.Job == "" {
						g.Job = job
					}
				}
			}
		}
	}
	for i := range queued {
		hold(queued[i].Job, &queued[i].To)
	}
	var others []string
	for _, n := range view.Nodes {
		if n.Name != node {
			others = append(others, n.Name)
		}
	}
	var out []DrainOutcome
	for _, j := range jobs {
		o := DrainOutcome{Job: j.Request.ID}
		switch {
		case j.MovingTo != nil:
			o.To = j.MovingTo
		case j.Stopping != "":
			o.Reason = "its ranks are being stopped (" + j.Stopping + ")"
		case !j.Checkpoints:
			o.Reason = "it names no checkpoint dir, so a move would lose its progress: cancel it, or wait for it to end"
		case len(others) == 0:
			o.Reason = "no other node to move it to"
		default:
			r := j.Request
			pl, err := Assign(&view, &r, others)
			if err != nil {
				var pe *PlacementError
				if errors.As(err, &pe) {
					o.Reason = "no room elsewhere: " + pe.Explain(&r)
				} else {
					o.Reason = "cannot plan a move: " + err.Error()
				}
				break
			}
			hold(r.ID, &pl)
			o.Move = &Move{Job: r.ID, From: j.Placement, To: pl}
			o.To = pl.Nodes()
		}
		out = append(out, o)
	}
	return out
}
