package client

import (
	"testing"

	"github.com/gpuctl/gpuctl/api"
)

// TestSnapshotJobPrefersWhatIsNotEnded: a name shared by an ended job and
// another means the other when it has not ended, by api.JobState.Ended,
// for every state it can be in.
func TestSnapshotJobPrefersWhatIsNotEnded(t *testing.T) {
	for v, name := range api.JobState_name {
		old := api.JobState(v)
		t.Run(name, func(t *testing.T) {
			s := Snapshot{Jobs: []*api.Job{
				{Id: "j-1", Name: "train", State: api.JobState_JOB_STATE_SUCCEEDED},
				{Id: "j-2", Name: "train", State: old},
			}}
			got := s.Job("train").GetId()
			want := "" // two ended runs of one name: ambiguous
			if !old.Ended() {
				want = "j-2"
			}
			if got != want {
				t.Errorf("job named train with j-2 %s and j-1 succeeded: %s, want %s", name, got, want)
			}
		})
	}
}
