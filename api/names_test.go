package api

import "testing"

// TestJobStateEnded is the one rule of which states are over; every part
// of gpuctl (the job owner's lifecycle, metrics, the client's name lookup,
// `gpuctl jobs`' default listing) asks JobState.Ended. A state added to the
// schema fails here until it is decided.
func TestJobStateEnded(t *testing.T) {
	want := map[JobState]bool{
		JobState_JOB_STATE_UNSPECIFIED: false,
		JobState_JOB_STATE_PENDING:     false,
		JobState_JOB_STATE_RUNNING:     false,
		JobState_JOB_STATE_RECOVERING:  false,
		JobState_JOB_STATE_SUCCEEDED:   true,
		JobState_JOB_STATE_FAILED:      true,
		JobState_JOB_STATE_CANCELLED:   true,
	}
	for v, name := range JobState_name {
		s := JobState(v)
		ended, ok := want[s]
		if !ok {
			t.Errorf("%s: not decided here: is a job in it over?", name)
			continue
		}
		if s.Ended() != ended {
			t.Errorf("%s: Ended() = %v, want %v", name, s.Ended(), ended)
		}
	}
}
