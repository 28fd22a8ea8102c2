package jobs

import (
	"testing"

	"github.com/gpuctl/gpuctl/api"
)

// TestLifecycleTableIsTotal checks that every phase × event has exactly one
// of a transition or a reason for refusing it, and that the phase a record
// reads as round-trips for every phase.
func TestLifecycleTableIsTotal(t *testing.T) {
	for p := range numPhases {
		for e := range numEvents {
			c := Lifecycle[p][e]
			switch {
			case len(c.to) == 0 && c.refusal == "":
				t.Errorf("%s × %s: no entry", p, e)
			case len(c.to) > 0 && c.refusal != "":
				t.Errorf("%s × %s: both a transition and a refusal", p, e)
			}
			for _, q := range c.to {
				if q < 0 || q >= numPhases {
					t.Errorf("%s × %s: leads to %d, no phase", p, e, q)
				}
			}
		}
	}
	for _, end := range []Phase{Succeeded, Failed, Cancelled} {
		for e := range numEvents {
			if c := Lifecycle[end][e]; len(c.to) > 0 && !(end == Failed && e == EvRestart) {
				t.Errorf("%s is an end, but %s leads to %v", end, e, c.to)
			}
		}
	}
	records := map[Phase]*api.Job{
		Pending:    {State: api.JobState_JOB_STATE_PENDING},
		Running:    {State: api.JobState_JOB_STATE_RUNNING},
		Preempting: {State: api.JobState_JOB_STATE_RUNNING, Stopping: api.JobStop_JOB_STOP_PREEMPT},
		Moving:     {State: api.JobState_JOB_STATE_RUNNING, Stopping: api.JobStop_JOB_STOP_MOVE},
		Recovering: {State: api.JobState_JOB_STATE_RECOVERING, Stopping: api.JobStop_JOB_STOP_FAILED},
		Cancelling: {State: api.JobState_JOB_STATE_CANCELLED, Stopping: api.JobStop_JOB_STOP_CANCEL},
		Failing:    {State: api.JobState_JOB_STATE_FAILED, Stopping: api.JobStop_JOB_STOP_FAILED},
		Succeeded:  {State: api.JobState_JOB_STATE_SUCCEEDED},
		Failed:     {State: api.JobState_JOB_STATE_FAILED},
		Cancelled:  {State: api.JobState_JOB_STATE_CANCELLED},
	}
	for p := range numPhases {
		j, ok := records[p]
		if !ok {
			t.Errorf("no record for phase %s", p)
			continue
		}
		if got := phaseOf(j); got != p {
			t.Errorf("record of %s reads as %s", p, got)
		}
	}
}
