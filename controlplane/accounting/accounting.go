// Package accounting keeps a running job's counters from what its nodes
// report: its step and latest complete checkpoint, useful time and goodput,
// the energy of its GPUs, its pace per step, and the checkpoint interval
// the cluster's failure rate advises. It changes only the counter fields
// of the job it is handed; the job owner calls it once per pass.
package accounting

import (
	"math"
	"slices"
	"strconv"
	"time"

	"google.golang.org/protobuf/proto"

	"github.com/gpuctl/gpuctl/api"
	"github.com/gpuctl/gpuctl/scheduler"
	"github.com/gpuctl/gpuctl/scheduler/carbon"
)

// Progress is what the counters need between passes for one job.
type Progress struct {
	at     time.Time
	step   int64
	energy map[string]uint64
	// useful seconds and steps of the current attempt, to charge lost
	// steps at the attempt's own pace and to calibrate the cost model.
	AttemptUseful float64
	AttemptSteps  int64
	// CheckpointAt is the last checkpoint (or request for one), for jobs
	// whose checkpoints the server paces.
	CheckpointAt time.Time
}

// NewProgress returns a fresh tracker.
func NewProgress() *Progress { return &Progress{energy: map[string]uint64{}} }

// Pause forgets the pacing state while a job does not run (its next
// attempt starts a new interval), keeping the attempt counters.
func (p *Progress) Pause() { p.energy, p.at = map[string]uint64{}, time.Time{} }

// Restart starts the attempt counters over at step.
func (p *Progress) Restart(step int64) { p.step, p.AttemptUseful, p.AttemptSteps = step, 0, 0 }

// Pace is the measured seconds per step of the current attempt, and
// whether enough steps ran to trust it.
func (p *Progress) Pace(minSteps int64) (float64, bool) {
	if p.AttemptSteps < minSteps || p.AttemptSteps == 0 {
		return 0, false
	}
	return p.AttemptUseful / float64(p.AttemptSteps), true
}

// Inputs are the reports one pass brings about a running job.
type Inputs struct {
	// Ranks are the job's live ranks as their nodes report them.
	Ranks []*api.RankStatus
	// Nodes are the statuses of the job's nodes, by name.
	Nodes map[string]*api.NodeStatus
	// GPUMTBF is the cluster's per-GPU MTBF estimate, in seconds.
	GPUMTBF float64
	// Intensity gives each node's carbon-intensity curve by its labels;
	// nil when the server has none.
	Intensity *carbon.Intensities
}

// Update folds one pass into j's counters and reports whether any changed.
// A checkpoint every rank reports (each prints `checkpoint step=N`) is
// complete; the step is the highest any rank reached; useful time is wall
// time in which the job advanced (a job whose ranks report no steps counts
// its running time); energy is the deltas of its GPUs' NVML energy counters,
// and its emissions that energy at its node's mean carbon intensity since
// the last pass.
func (p *Progress) Update(j *api.Job, in Inputs, now time.Time) bool {
	changed := false
	since := p.at
	var step, ckpt int64 = 0, -1
	seen := 0
	for _, r := range in.Ranks {
		if r.GetAttempt() != 0 && r.GetAttempt() != j.GetAttempt() {
			continue
		}
		seen++
		step = max(step, r.GetStep())
		if ckpt < 0 || r.GetLastCheckpointStep() < ckpt {
			ckpt = r.GetLastCheckpointStep()
		}
	}
	gpus := countGPUs(j)
	if seen >= gpus && ckpt > j.GetLastCheckpointStep() {
		j.LastCheckpointStep, changed = ckpt, true
	}
	if step > j.GetStep() {
		j.Step, changed = step, true
	}
	if !p.at.IsZero() {
		dt := now.Sub(p.at).Seconds()
		switch {
		case seen == 0 && j.GetStep() == 0:
			j.UsefulSeconds += dt
			changed = true
		case j.GetStep() > p.step && !j.GetStalled():
			j.UsefulSeconds += dt
			p.AttemptUseful += dt
			p.AttemptSteps += j.GetStep() - p.step
			changed = true
		}
	}
	p.at, p.step = now, j.GetStep()
	var energy, grams float64
	unknown := false // some energy ran where no curve applies
	for _, jn := range j.GetPlacement() {
		n := in.Nodes[jn.GetNode()]
		curve := in.Intensity.Curve(n.GetRegistration().GetLabels())
		for _, g := range n.GetGpus() {
			if !slices.Contains(jn.GetGpus(), g.GetInfo().GetIndex()) || g.GetLast() == nil {
				continue
			}
			key := jn.GetNode() + "/" + strconv.Itoa(int(g.GetInfo().GetIndex()))
			cur := g.GetLast().GetEnergyMj()
			if prev, ok := p.energy[key]; ok && cur > prev {
				joules := float64(cur-prev) / 1000
				energy += joules
				if curve == nil {
					unknown = true
				} else {
					grams += joules / 3.6e6 * curve.Mean(since.Unix(), now.Unix())
				}
			}
			p.energy[key] = cur
		}
	}
	if energy > 0 {
		// Emissions are known only while all of the job's energy is.
		switch {
		case unknown:
			j.Co2EGrams = nil
		case j.Co2EGrams != nil || j.GetEnergyJoules() == 0:
			j.Co2EGrams = proto.Float64(j.GetCo2EGrams() + grams)
		}
		j.EnergyJoules += energy
		changed = true
	}
	if first := j.GetFirstStartUnixNano(); first > 0 {
		if wall := now.Sub(time.Unix(0, first)).Seconds(); wall > 0 {
			if g := min(j.GetUsefulSeconds()/wall, 1); g != j.GetGoodput() {
				j.Goodput, changed = g, true
			}
		}
	}
	adv := scheduler.YoungDaly(j.GetCheckpointSeconds(), in.GPUMTBF/float64(max(gpus, 1)))
	if math.Abs(adv-j.GetAdvisedCheckpointIntervalSeconds()) > 0.5 {
		j.AdvisedCheckpointIntervalSeconds, changed = adv, true
	}
	if n := len(j.GetAttempts()); n > 0 {
		a := j.Attempts[n-1]
		if a.GetEndUnixNano() == 0 {
			a.LastStep = max(a.GetLastStep(), j.GetStep())
			a.GpuSeconds = now.Sub(time.Unix(0, a.GetStartUnixNano())).Seconds() * float64(a.GetGpus())
			a.EnergyJoules += energy
		}
	}
	return changed
}

// DueCheckpoint reports whether a job whose checkpoints the server paces
// should be asked for one now: every is the advised interval (or the job's
// default before one is measured), counted from the attempt's start or the
// last checkpoint.
func (p *Progress) DueCheckpoint(j *api.Job, every time.Duration, now time.Time) bool {
	if every <= 0 {
		return false
	}
	if p.CheckpointAt.IsZero() {
		p.CheckpointAt = time.Unix(0, j.GetStartUnixNano())
	}
	if now.Sub(p.CheckpointAt) < every {
		return false
	}
	p.CheckpointAt = now
	return true
}

// GPUMTBF estimates the cluster's per-GPU MTBF from its jobs: the failures
// they had (restarts, and attempts that ended failed) over the GPU-seconds
// they ran.
func GPUMTBF(jobs []*api.Job, now time.Time) float64 {
	failures := 0
	exposure := 0.0
	for _, j := range jobs {
		failures += int(j.GetRestarts())
		if j.GetState() == api.JobState_JOB_STATE_FAILED && j.GetAttempt() > 0 {
			failures++
		}
		exposure += j.GetAttainedGpuSeconds()
		if j.GetState() == api.JobState_JOB_STATE_RUNNING && j.GetStartUnixNano() > 0 {
			exposure += now.Sub(time.Unix(0, j.GetStartUnixNano())).Seconds() * float64(countGPUs(j))
		}
	}
	return scheduler.GPUMTBF(failures, exposure)
}

func countGPUs(j *api.Job) int {
	n := 0
	for _, jn := range j.GetPlacement() {
		n += len(jn.GetRanks())
	}
	return n
}
