package simulate

import (
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"slices"

	"github.com/gpuctl/gpuctl/scheduler"
)

// FailureConfig is one long synchronous training run on a simulated
// cluster whose nodes and GPUs fail at random. Times are seconds.
type FailureConfig struct {
	// JobNodes × GPUsPerNode is the job; Spares more nodes stand by as hot
	// spares for recovery to swap in.
	JobNodes, GPUsPerNode, Spares int
	// Work is the failure-free training time of the run.
	Work float64
	// CheckpointInterval is work between checkpoints; each takes
	// CheckpointTime. A failure loses the work since the last completed
	// checkpoint.
	CheckpointInterval, CheckpointTime float64
	// Detect is failure to restart; Restart is the restart itself
	// (scheduling, NCCL init, reading the checkpoint). A failure during
	// detection or restart starts both over.
	Detect, Restart float64
	// MTBF is the job's mean time between interruptions; they arrive as a
	// Poisson process and strike a node of the job chosen at random.
	MTBF float64
	// GPUFaultShare of the interruptions are one GPU failing (the node is
	// swapped out for its repair), the rest a whole node going down.
	GPUFaultShare float64
	// Repair is how long a failed node takes to come back healthy, as a
	// free node the next recovery can use.
	Repair float64
	// Seed makes the failure sequence reproducible.
	Seed uint64
}

// FailureResult is what a failure simulation measured.
type FailureResult struct {
	// WallSeconds is the run's effective training time: first start to the
	// last step.
	WallSeconds float64 `json:"effective_seconds"`
	WorkSeconds float64 `json:"work_seconds"`
	// Goodput is Work over WallSeconds.
	Goodput float64 `json:"goodput"`
	// Interruptions and their kinds; DuringRecovery struck while the job
	// was already detecting or restarting.
	Interruptions  int `json:"interruptions"`
	NodeFailures   int `json:"node_failures"`
	GPUFailures    int `json:"gpu_failures"`
	DuringRecovery int `json:"during_recovery"`
	// Checkpoints completed, and the time spent writing checkpoints
	// (those a failure cut short included).
	Checkpoints       int     `json:"checkpoints"`
	CheckpointSeconds float64 `json:"checkpoint_seconds"`
	// LostWorkSeconds is training done and thrown away by failures.
	LostWorkSeconds float64 `json:"lost_work_seconds"`
	// RecoverySeconds is time spent detecting, waiting for a node and
	// restarting; SpareWaitSeconds the waiting part.
	RecoverySeconds  float64 `json:"recovery_seconds"`
	SpareWaitSeconds float64 `json:"spare_wait_seconds"`
	// Replacements counts nodes swapped in by recovery, and the actions
	// scheduler.Recover chose, by name.
	Replacements int            `json:"replacements"`
	Actions      map[string]int `json:"recovery_actions"`
}

// failJob is the simulated job's id in the snapshot.
const failJob = "train"

// maxFailuresBetweenCheckpoints ends a run that no longer makes progress.
const maxFailuresBetweenCheckpoints = 1000

// RunFailures replays the run: training advances segment by segment and
// checkpoints at every interval; each interruption loses the current
// segment, the failed node is marked down (or its GPU unhealthy) and sent
// for repair, and scheduler.Recover — the decision the control plane
// takes — swaps in a spare or, with none free, the run waits for a repair.
// Everything is a pure function of cfg.
func RunFailures(cfg FailureConfig) (FailureResult, error) {
	switch {
	case cfg.JobNodes < 1 || cfg.GPUsPerNode < 1 || cfg.Spares < 0:
		return FailureResult{}, fmt.Errorf("simulate failures: %d job nodes of %d GPUs and %d spares: need at least one node of one GPU", cfg.JobNodes, cfg.GPUsPerNode, cfg.Spares)
	case cfg.Work <= 0 || math.IsNaN(cfg.Work) || math.IsInf(cfg.Work, 0):
		return FailureResult{}, errors.New("simulate failures: the run needs a positive amount of work")
	case cfg.MTBF <= 0:
		return FailureResult{}, errors.New("simulate failures: MTBF must be positive (e.g. 3h)")
	case cfg.CheckpointInterval <= 0:
		return FailureResult{}, errors.New("simulate failures: checkpoint interval must be positive")
	case cfg.CheckpointTime < 0 || cfg.Detect < 0 || cfg.Restart < 0 || cfg.Repair < 0:
		return FailureResult{}, errors.New("simulate failures: checkpoint, detection, restart and repair times must not be negative")
	case cfg.GPUFaultShare < 0 || cfg.GPUFaultShare > 1:
		return FailureResult{}, fmt.Errorf("simulate failures: GPU fault share %g is not between 0 and 1", cfg.GPUFaultShare)
	}
	f := newFailureSim(cfg)
	return f.run()
}

// failureSim is the run's mutable world.
type failureSim struct {
	cfg    FailureConfig
	rng    *rand.Rand
	snap   scheduler.Snapshot
	nodeIx map[string]int
	place  scheduler.Placement
	req    scheduler.JobRequest
	// repairs are nodes in repair and when each comes back.
	repairs []repair
	res     FailureResult
}

type repair struct {
	node string
	at   float64
}

func newFailureSim(cfg FailureConfig) *failureSim {
	f := &failureSim{cfg: cfg, rng: rand.New(rand.NewPCG(cfg.Seed, cfg.Seed^0x9e3779b97f4a7c15)), nodeIx: map[string]int{}}
	f.snap.Nodes = NewCluster(cfg.JobNodes+cfg.Spares, cfg.GPUsPerNode, 32, 4)
	f.snap.Spares = scheduler.SparesPolicy{Count: cfg.Spares}
	for i, n := range f.snap.Nodes {
		f.nodeIx[n.Name] = i
	}
	gpus := cfg.JobNodes * cfg.GPUsPerNode
	f.req = scheduler.JobRequest{ID: failJob, GPUs: gpus, GPUsPerNode: cfg.GPUsPerNode, Checkpoint: true}
	f.place = scheduler.Placement{Job: failJob, Shape: scheduler.Shape{TP: 1, PP: 1, DP: gpus}, Ranks: make([]scheduler.Slot, 0, gpus)}
	for i := range cfg.JobNodes {
		n := &f.snap.Nodes[i]
		for g := range n.GPUs {
			n.GPUs[g].Job = failJob
			f.place.Ranks = append(f.place.Ranks, scheduler.Slot{Node: n.Name, GPU: g})
		}
	}
	f.res.Actions = map[string]int{}
	f.res.WorkSeconds = cfg.Work
	return f
}

// phases of the run.
const (
	phaseRun = iota
	phaseCheckpoint
	phaseRecover
)

func (f *failureSim) run() (FailureResult, error) {
	cfg := f.cfg
	var now, saved, seg, left float64
	sinceCheckpoint := 0 // interruptions at the last checkpoint
	phase := phaseRun
	next := f.rng.ExpFloat64() * cfg.MTBF
	for {
		switch phase {
		case phaseRun:
			dt := math.Min(cfg.CheckpointInterval-seg, cfg.Work-saved-seg)
			if now+dt <= next {
				now += dt
				seg += dt
				if saved+seg >= cfg.Work {
					f.res.WallSeconds = now
					f.res.Goodput = cfg.Work / now
					return f.res, nil
				}
				phase, left = phaseCheckpoint, cfg.CheckpointTime
				continue
			}
			seg += next - now
		case phaseCheckpoint:
			if now+left <= next {
				now += left
				saved += seg
				seg = 0
				f.res.Checkpoints++
				sinceCheckpoint = f.res.Interruptions
				f.res.CheckpointSeconds += left
				phase = phaseRun
				continue
			}
			// The unfinished checkpoint's time is spent for nothing.
			f.res.CheckpointSeconds += next - now
		case phaseRecover:
			if now+left <= next {
				now += left
				f.res.RecoverySeconds += left
				phase = phaseRun
				continue
			}
			f.res.RecoverySeconds += next - now
			f.res.DuringRecovery++
		}
		if f.res.Interruptions-sinceCheckpoint > maxFailuresBetweenCheckpoints {
			return f.res, fmt.Errorf("simulate failures: %d interruptions without a checkpoint after %.0f of %.0f h of work: failures outpace repairs; add spares or shorten repairs",
				maxFailuresBetweenCheckpoints, saved/3600, cfg.Work/3600)
		}
		// An interruption at next: the segment's work is lost.
		now = next
		f.res.LostWorkSeconds += seg
		seg = 0
		wait, err := f.fail(now)
		if err != nil {
			return f.res, err
		}
		f.res.SpareWaitSeconds += wait
		phase, left = phaseRecover, cfg.Detect+wait+cfg.Restart
		next = now + f.rng.ExpFloat64()*cfg.MTBF
	}
}

// fail strikes a random node of the job at time now and recovers: it
// returns how long the restart must wait for a node.
func (f *failureSim) fail(now float64) (float64, error) {
	f.res.Interruptions++
	nodes := f.place.Nodes()
	victim := nodes[f.rng.IntN(len(nodes))]
	n := &f.snap.Nodes[f.nodeIx[victim]]
	kind := scheduler.FailNodeDown
	if f.rng.Float64() < f.cfg.GPUFaultShare {
		kind = scheduler.FailGPUFault
		n.GPUs[f.rng.IntN(len(n.GPUs))].Healthy = false
		f.res.GPUFailures++
	} else {
		n.State = scheduler.NodeDown
		f.res.NodeFailures++
	}
	f.repairs = append(f.repairs, repair{node: victim, at: now + f.cfg.Repair})
	f.repaired(now)

	var wait float64
	failed := []string{victim}
	for {
		rec := scheduler.Recover(&f.snap, &scheduler.RecoverRequest{
			Job: f.req, Placement: f.place, Policy: scheduler.RestartReplace, MaxRestarts: math.MaxInt32,
			Failure: scheduler.Failure{Kind: kind, Nodes: failed},
		})
		if rec.Action != scheduler.GiveUp {
			f.res.Actions[rec.Action.String()]++
			f.res.Replacements += len(rec.Added)
			f.apply(rec.Placement)
			return wait, nil
		}
		// No free node: wait for the next repair.
		if len(f.repairs) == 0 {
			return wait, fmt.Errorf("simulate failures: no node can replace %s and none is in repair: %s", victim, rec.Reason)
		}
		first := slices.MinFunc(f.repairs, func(a, b repair) int { return cmpFloat(a.at, b.at) })
		wait = math.Max(wait, first.at-now)
		f.repaired(first.at)
		// The failed node may be the one back: then the job restarts where
		// it was.
		if v := &f.snap.Nodes[f.nodeIx[victim]]; v.State == scheduler.NodeReady && !hasUnhealthy(v) {
			kind, failed = scheduler.FailRankExit, nil
		}
	}
}

// repaired returns every node whose repair is done by t to service.
func (f *failureSim) repaired(t float64) {
	keep := f.repairs[:0]
	for _, r := range f.repairs {
		if r.at > t {
			keep = append(keep, r)
			continue
		}
		n := &f.snap.Nodes[f.nodeIx[r.node]]
		n.State = scheduler.NodeReady
		for g := range n.GPUs {
			n.GPUs[g].Healthy = true
		}
	}
	f.repairs = keep
}

// apply moves the job to its new placement.
func (f *failureSim) apply(p scheduler.Placement) {
	for _, sl := range f.place.Ranks {
		f.snap.Nodes[f.nodeIx[sl.Node]].GPUs[sl.GPU].Job = ""
	}
	for _, sl := range p.Ranks {
		f.snap.Nodes[f.nodeIx[sl.Node]].GPUs[sl.GPU].Job = failJob
	}
	f.place = p
}

func hasUnhealthy(n *scheduler.Node) bool {
	for _, g := range n.GPUs {
		if !g.Healthy {
			return true
		}
	}
	return false
}

func cmpFloat(a, b float64) int {
	switch {
	case a < b:
		return -1
	case a > b:
		return 1
	}
	return 0
}
