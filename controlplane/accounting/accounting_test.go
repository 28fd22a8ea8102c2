package accounting

import (
	"math"
	"testing"
	"time"

	"github.com/gpuctl/gpuctl/api"
	"github.com/gpuctl/gpuctl/scheduler"
)

// TestClusterGPUMTBF: the cluster's failures move the estimate off the
// prior: restarts and jobs that failed after running count, over the
// GPU-seconds jobs attained and are running now.
func TestClusterGPUMTBF(t *testing.T) {
	now := time.Unix(1_800_000_000, 0)
	prior := float64(scheduler.PriorGPUMTBFSeconds)
	running := &api.Job{State: api.JobState_JOB_STATE_RUNNING, Attempt: 1, StartUnixNano: now.Add(-100 * time.Second).UnixNano(),
		Placement: []*api.JobNode{{Node: "n0", Ranks: []*api.JobRank{{Rank: 0}, {Rank: 1}}}}}
	cases := []struct {
		name string
		jobs []*api.Job
		want float64
	}{
		{"no history", nil, prior},
		{"a pending job", []*api.Job{{State: api.JobState_JOB_STATE_PENDING}}, prior},
		{"3 restarts over 1e6 GPU-s", []*api.Job{{State: api.JobState_JOB_STATE_PENDING, Restarts: 3, AttainedGpuSeconds: 1e6}}, (prior + 1e6) / 4},
		{"a job that failed after running", []*api.Job{{State: api.JobState_JOB_STATE_FAILED, Attempt: 1, AttainedGpuSeconds: 50}}, (prior + 50) / 2},
		{"a job refused before it ran", []*api.Job{{State: api.JobState_JOB_STATE_FAILED}}, prior},
		{"running time counts", []*api.Job{running}, prior + 200},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			if got := GPUMTBF(c.jobs, now); math.Abs(got-c.want) > 1e-6 {
				t.Errorf("GPUMTBF = %g, want %g", got, c.want)
			}
		})
	}
}
