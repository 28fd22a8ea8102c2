package costmodel

import "math"

// Goodput is a plan's prediction under failures: a synchronous job stops
// on every interruption, loses the work since its last checkpoint, waits
// for detection and a restart, and spends part of its running time
// writing checkpoints.
type Goodput struct {
	// MTBFSec is the mean time between the job's interruptions at the
	// plan's size.
	MTBFSec float64 `json:"mtbf_seconds"`
	// Fraction is the expected share of wall time that advances training.
	Fraction float64 `json:"fraction"`
	// LostSecPerFailure is the expected wall time one interruption costs:
	// work since the last checkpoint, detection and restart.
	LostSecPerFailure float64 `json:"lost_seconds_per_failure"`
	// EffectiveStepSec is the step time failures and checkpoints make.
	EffectiveStepSec float64 `json:"predicted_effective_step_seconds"`
	// EffectiveTrainSec is the run's wall time (with Training.TrainTokens),
	// and ExpectedFailures the interruptions over it.
	EffectiveTrainSec float64 `json:"predicted_effective_train_seconds,omitempty"`
	ExpectedFailures  float64 `json:"expected_failures,omitempty"`
}

// ExpectedWallTime is the expected wall time to finish work seconds of
// failure-free training that checkpoints every interval seconds of work
// (each checkpoint taking ckpt seconds), when interruptions arrive at
// random with mean mtbf and each costs restart seconds (detection and
// restart, itself interruptible) before work resumes from the last
// checkpoint. This is Daly's model ("A higher order estimate of the
// optimum checkpoint interval for restart dumps", FGCS 2006): each
// segment of interval+ckpt takes mtbf·e^{restart/mtbf}·(e^{(interval+ckpt)/mtbf} − 1)
// on average. Without failures (mtbf 0) it is work plus the checkpoints.
func ExpectedWallTime(work, interval, ckpt, restart, mtbf float64) float64 {
	if work <= 0 {
		return 0
	}
	if interval <= 0 {
		interval = work
	}
	segs := work / interval
	if mtbf <= 0 {
		return work + segs*ckpt
	}
	return segs * mtbf * math.Exp(restart/mtbf) * math.Expm1((interval+ckpt)/mtbf)
}

// YoungDalyInterval is Young's optimum checkpoint interval √(2·C·MTBF).
func YoungDalyInterval(ckpt, mtbf float64) float64 {
	if ckpt <= 0 || mtbf <= 0 {
		return 0
	}
	return math.Sqrt(2 * ckpt * mtbf)
}

// jobMTBF is the job's mean time between interruptions at gpus GPUs: the
// tunable as given, or scaled from the size it was measured at.
func (t Tunables) jobMTBF(gpus int) float64 {
	m := t.MTBF.Seconds()
	if m <= 0 || gpus <= 0 {
		return 0
	}
	if t.MTBFReferenceGPUs > 0 {
		m *= float64(t.MTBFReferenceGPUs) / float64(gpus)
	}
	return m
}

// checkpointAndGoodput fills the checkpoint, restart and goodput terms. A
// checkpoint is written by the nodes that hold distinct state (every node
// with a sharded optimizer, one replica's nodes without) at the storage's
// bandwidth or the nodes' own, whichever is smaller; a restart reads it
// back on every node.
func (c Config) checkpointAndGoodput(ev *Evaluation) {
	m, tu, p := c.Model, c.Tunables, ev.Plan
	gpn := c.Hardware.GPUsPerNode
	nodes := func(gpus int) float64 { return float64((gpus + gpn - 1) / gpn) }
	all := nodes(p.GPUs())
	writers := all
	if c.Training.ZeROStage == 0 {
		writers = nodes(p.TP * p.PP * p.cp())
	}
	bw := func(agg, n float64) float64 {
		if tu.CheckpointNodeBytesPerSec > 0 {
			return math.Min(agg, n*tu.CheckpointNodeBytesPerSec)
		}
		return agg
	}
	state := m.Params() * tu.CheckpointBytesPerParam
	if w := bw(tu.CheckpointWriteBytesPerSec, writers); w > 0 {
		ev.CheckpointSec = state / w
	}
	ev.StartupSec = tu.StartupWait.Seconds()
	if r := bw(tu.CheckpointReadBytesPerSec, all); r > 0 {
		ev.StartupSec += state / r
	}
	mtbf := tu.jobMTBF(p.GPUs())
	interval := tu.CheckpointInterval.Seconds()
	if interval <= 0 {
		interval = YoungDalyInterval(ev.CheckpointSec, mtbf)
	}
	ev.CheckpointIntervalSec = interval
	if interval > 0 {
		ev.CheckpointOverhead = ev.CheckpointSec / interval
	}
	if c.Training.TrainTokens > 0 {
		ev.TrainSeconds = c.Training.TrainTokens / ev.TokensPerSec
	}
	if mtbf <= 0 {
		return
	}
	restart := tu.DetectWait.Seconds() + ev.StartupSec
	// Per unit of work: the wall time of a long run, over its work.
	const unit = 1e6
	wall := ExpectedWallTime(unit, interval, ev.CheckpointSec, restart, mtbf)
	gp := &Goodput{MTBFSec: mtbf, Fraction: unit / wall}
	gp.EffectiveStepSec = ev.StepSeconds / gp.Fraction
	// What one interruption costs: the wall time beyond work and
	// checkpoints, spread over the expected interruptions.
	fails := wall / mtbf
	gp.LostSecPerFailure = (wall - unit - unit/interval*ev.CheckpointSec) / fails
	if ev.TrainSeconds > 0 {
		gp.EffectiveTrainSec = ev.TrainSeconds / gp.Fraction
		gp.ExpectedFailures = gp.EffectiveTrainSec / mtbf
	}
	ev.Goodput = gp
}
