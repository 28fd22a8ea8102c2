package jobs

import (
	"strings"
	"testing"
	"time"

	"github.com/gpuctl/gpuctl/api"
	"github.com/gpuctl/gpuctl/scheduler"
	"github.com/gpuctl/gpuctl/scheduler/carbon"
)

// A deferrable job waits, with why, for the cleaner hour; one that is not
// deferrable starts at once; at the hour the deferrable one starts.
func TestDeferrableJobWaitsForCleanerHour(t *testing.T) {
	nodes := threeNodes()
	for _, n := range nodes {
		n.Registration.Labels["site"] = "eu"
	}
	h := newHarness(t, "fifo", nodes...)
	// The harness's clock starts at 08:00 UTC; the curve dips at 12:00.
	in, err := carbon.Parse(strings.NewReader("site=eu"+strings.Repeat(" 400", 12)+" 100"+strings.Repeat(" 400", 11)), "test")
	if err != nil {
		t.Fatal(err)
	}
	h.m.cfg.Policy = scheduler.WithCarbon(scheduler.FIFO{}, in)
	late := h.submit(ringSpec("late", 1, 4, "estimated_runtime: 1h\ndeferrable: {until: 24h}\n"), false)
	now := h.submit(ringSpec("now", 1, 4, "estimated_runtime: 1h\n"), false)
	h.reconcile()
	if st := h.job(now).GetState(); st != api.JobState_JOB_STATE_RUNNING {
		t.Fatalf("a job that is not deferrable is %s", st)
	}
	j := h.job(late)
	if j.GetState() != api.JobState_JOB_STATE_PENDING || !strings.Contains(j.GetPendingReason(), "cleaner window at site=eu") ||
		!strings.Contains(j.GetPendingReason(), "T12:00:00Z") {
		t.Fatalf("deferrable job %s: %q", j.GetState(), j.GetPendingReason())
	}
	h.clock.add(4 * time.Hour)
	h.reconcile()
	if st := h.job(late).GetState(); st != api.JobState_JOB_STATE_RUNNING {
		t.Fatalf("at the cleaner hour the deferrable job is %s: %q", st, h.job(late).GetPendingReason())
	}
}
