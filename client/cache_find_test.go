package client

import (
	"testing"

	"github.com/gpuctl/gpuctl/api"
)

// TestSnapshotJobIsFindJob: the console finds the job the server would
// (api.FindJob), and none where the server would say the name is
// ambiguous.
func TestSnapshotJobIsFindJob(t *testing.T) {
	run, done := api.JobState_JOB_STATE_RUNNING, api.JobState_JOB_STATE_SUCCEEDED
	sets := map[string][]*api.Job{
		"two live":   {{Id: "j-1", Name: "a", State: run}, {Id: "j-2", Name: "a", State: run}},
		"two ended":  {{Id: "j-1", Name: "a", State: done}, {Id: "j-2", Name: "a", State: done}},
		"one live":   {{Id: "j-1", Name: "a", State: done}, {Id: "j-2", Name: "a", State: run}},
		"name is id": {{Id: "j-1", Name: "a", State: run}, {Id: "a", Name: "b", State: done}},
	}
	for name, jobs := range sets {
		t.Run(name, func(t *testing.T) {
			s := Snapshot{Jobs: jobs}
			want, err := api.FindJob(jobs, "a")
			got := s.Job("a")
			if (err != nil) != (got == nil) || got.GetId() != want.GetId() {
				t.Errorf("console %q, server %q (%v)", got.GetId(), want.GetId(), err)
			}
		})
	}
}
