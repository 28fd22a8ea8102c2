package jobs

import (
	"testing"

	"github.com/gpuctl/gpuctl/api"
	predictor "github.com/gpuctl/gpuctl/scheduler/predict"
)

// TestLearnedRuntimeOrdersSJF: jobs whose files give no runtime get one
// from the runtime model, shown with where it came from, and SJF starts
// the one predicted shorter first though it was submitted later; a job
// file's own estimate is kept as the file's.
func TestLearnedRuntimeOrdersSJF(t *testing.T) {
	var past []predictor.Record
	for range 3 {
		past = append(past, predictor.Record{Features: predictor.Features{Tenant: "pretrain", GPUs: 12, Hour: -1}, Runtime: 10 * 3600},
			predictor.Record{Features: predictor.Features{Tenant: "evals", GPUs: 12, Hour: -1}, Runtime: 600})
	}
	h := newHarness(t, "sjf", threeNodes()...)
	h.runtimes = predictor.Train(past, 3)
	h.restart("sjf")
	blocker := h.submit(ringSpec("blocker", 3, 4, "estimated_runtime: 1h\n"), false)
	h.reconcile()
	h.started(blocker)
	long := h.submit(ringSpec("long", 3, 4, "tenant: pretrain\n"), false)
	short := h.submit(ringSpec("short", 3, 4, "tenant: evals\n"), false)
	for _, tc := range []struct {
		id      string
		seconds int64
		basis   string
	}{{blocker, 3600, "job file"}, {long, 36000, "learned: tenant+gpus, 3 jobs"}, {short, 600, "learned: tenant+gpus, 3 jobs"}} {
		if j := h.job(tc.id); j.GetEstimateSeconds() != tc.seconds || j.GetEstimateBasis() != tc.basis {
			t.Errorf("job %s: estimate %d s (%q), want %d s (%q)", j.GetName(), j.GetEstimateSeconds(), j.GetEstimateBasis(), tc.seconds, tc.basis)
		}
	}
	h.exitAll(blocker, 0)
	h.reconcile()
	if got := h.job(short).GetState(); got != api.JobState_JOB_STATE_RUNNING {
		t.Errorf("the job predicted shorter is %s, want it started first", got)
	}
	if got := h.job(long).GetState(); got != api.JobState_JOB_STATE_PENDING {
		t.Errorf("the job predicted longer is %s, want it waiting", got)
	}
}
