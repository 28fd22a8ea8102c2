package jobs

import (
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/gpuctl/gpuctl/api"
	"github.com/gpuctl/gpuctl/jobspec"
	"github.com/gpuctl/gpuctl/scheduler"
)

// Elastic jobs: a job with restart_policy shrink and elastic.data_parallel
// sizes runs at a smaller data-parallel size when a failure leaves no spare,
// keeping its global batch by running more micro-batches per replica, and
// grows back to its full size at its next checkpoint once healthy nodes
// return. Each change of size is an event with its reason.

// fullDP is the data-parallel size the job was submitted with.
func (pc *placer) fullDP(en *entry) int {
	j := en.job
	tp, pp := max(int(j.GetPlan().GetTp()), 1), max(int(j.GetPlan().GetPp()), 1)
	if full := int(j.GetFullGpus()); full > 0 {
		return full / (tp * pp)
	}
	return int(j.GetPlan().GetDp())
}

// resize sets the plan's data-parallel size for the next attempt, keeping
// the global batch (micro-batches per replica scale inversely), and raises
// an elastic event when the size changes.
func (pc *placer) resize(en *entry, dp int) {
	j := en.job
	cur := int(j.GetPlan().GetDp())
	if cur == dp || j.GetPlan() == nil {
		return
	}
	tp, pp := max(int(j.GetPlan().GetTp()), 1), max(int(j.GetPlan().GetPp()), 1)
	what := "shrinks"
	if dp > cur {
		what = "grows"
	}
	msg := fmt.Sprintf("%s from data-parallel %d to %d (%d → %d GPUs)", what, cur, dp, cur*tp*pp, dp*tp*pp)
	if nmb := int(j.GetPlan().GetNumMicroBatches()); nmb > 0 && cur > 0 {
		total := nmb * cur
		next := (total + dp - 1) / dp
		j.Plan.NumMicroBatches = int32(next)
		if next*dp == total {
			msg += fmt.Sprintf("; global batch kept with %d micro-batches per replica (was %d)", next, nmb)
		} else {
			msg += fmt.Sprintf("; %d micro-batches per replica (was %d), so the global batch moves from %d to %d micro-batches", next, nmb, total, next*dp)
		}
	}
	j.Plan.Dp = int32(dp)
	if en.resizeWhy != "" {
		msg += ": " + en.resizeWhy
		en.resizeWhy = ""
	}
	pc.m.log.Info("elastic resize", "job", j.GetId(), "from_dp", cur, "to_dp", dp)
	pc.m.raise(&api.Event{Kind: api.EventKind_EVENT_KIND_ELASTIC, Severity: api.Severity_SEVERITY_WARNING, Job: j.GetId(), Message: msg,
		Attrs: map[string]string{"from_dp": fmt.Sprint(cur), "to_dp": fmt.Sprint(dp)}})
}

// elastic reports whether en may change its data-parallel size.
func elastic(en *entry) bool {
	return en.spec != nil && en.spec.RestartPolicy == jobspec.Shrink && en.spec.Elastic != nil && len(en.spec.Elastic.DataParallel) > 0
}

// growBack starts moving every shrunk elastic job back to the largest
// allowed size up to its full one that fits now: checkpoint, stop,
// relaunch at that size resuming from the checkpoint. One move at a time,
// like rebalance moves.
func (pc *placer) growBack(now time.Time) {
	if len(pc.m.stops.moves) > 0 {
		return
	}
	for _, en := range pc.m.jobs {
		if en.job.GetStopping() == api.JobStop_JOB_STOP_MOVE {
			return
		}
	}
	var snap *scheduler.Snapshot
	for _, en := range pc.m.sorted() {
		j := en.job
		if !elastic(en) || !active(j) {
			continue
		}
		cur, full := int(j.GetPlan().GetDp()), pc.fullDP(en)
		if cur >= full {
			continue
		}
		if snap == nil {
			s := pc.snapshot(now)
			snap = &s
		}
		sizes := append(slices.Clone(en.spec.Elastic.DataParallel), full)
		slices.Sort(sizes)
		slices.Reverse(sizes)
		r := pc.request(en)
		for _, dp := range sizes {
			if dp <= cur || dp > full {
				continue
			}
			pl, ok := scheduler.Grow(snap, &r, dp)
			if !ok {
				continue
			}
			why := fmt.Sprintf("growing back from data-parallel %d to %d on %s at the next checkpoint", cur, dp, strings.Join(pl.Nodes(), ","))
			en.resizeWhy = fmt.Sprintf("room on %s again", strings.Join(pl.Nodes(), ","))
			pc.m.stops.startMove(en, pl, why, now)
			pc.m.raise(&api.Event{Kind: api.EventKind_EVENT_KIND_ELASTIC, Job: j.GetId(),
				Message: fmt.Sprintf("room for data-parallel %d again (%s): checkpointing to grow back", dp, strings.Join(pl.Nodes(), ","))})
			return
		}
	}
}
