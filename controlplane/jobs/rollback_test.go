package jobs

import (
	"context"
	"errors"
	"runtime"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/gpuctl/gpuctl/api"
	"github.com/gpuctl/gpuctl/store"
)

// refusingStore is a real store whose writes can be made to fail, as a
// full disk or a lost etcd leadership would.
type refusingStore struct {
	store.Store
	refuse atomic.Bool
}

func (s *refusingStore) Update(fn func(store.Tx) error) error {
	if s.refuse.Load() {
		return errors.New("no space left on device")
	}
	return s.Store.Update(fn)
}

// TestFailedCommitRollsBackSideTables: a restart whose commit fails
// leaves nothing behind: the job runs on as it was, with no recovery in
// progress and no command sent, and the same restart once the store
// takes writes again starts the recovery.
func TestFailedCommitRollsBackSideTables(t *testing.T) {
	h := newHarness(t, "fifo", threeNodes()...)
	id := h.submit(ringSpec("ring", 1, 4, ""), false)
	h.reconcile()
	h.started(id)
	h.nodes.take()
	st := &refusingStore{Store: h.st}
	h.m.cfg.Store = st
	st.refuse.Store(true)
	// The request is handled alone, without the pass that follows it in
	// a step, to see the owner's memory as the rollback left it.
	done := make(chan error, 1)
	go func() {
		_, err := h.m.Restart(context.Background(), id, "", nil, "ops")
		done <- err
	}()
	for h.queued() == 0 {
		runtime.Gosched()
	}
	for _, msg := range h.m.in.drain() {
		h.m.handle(msg)
	}
	if err := <-done; err == nil || !strings.Contains(err.Error(), "could not store the change, nothing was done") {
		t.Fatalf("restart over a store refusing writes: %v", err)
	}
	if rec := h.m.rec.recs[id]; rec != nil {
		t.Errorf("after the failed restart a recovery is left in progress: %s", rec.reason)
	}
	h.settle()
	if j := h.job(id); j.GetState() != api.JobState_JOB_STATE_RUNNING {
		t.Errorf("after the failed restart the job is %s, want it running as before", j.GetState())
	}
	if got := h.nodes.take(); len(got) != 0 {
		t.Errorf("the failed restart sent %d commands", len(got))
	}
	st.refuse.Store(false)
	if _, err := h.restartJob(id, "", nil, "ops"); err != nil {
		t.Fatalf("restart once the store takes writes: %v", err)
	}
	if j := h.job(id); j.GetState() != api.JobState_JOB_STATE_RECOVERING && j.GetAttempt() < 2 {
		t.Errorf("after the restart the job is %s at attempt %d", j.GetState(), j.GetAttempt())
	}
}
