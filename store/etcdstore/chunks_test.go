package etcdstore

import (
	"fmt"
	"strings"
	"testing"

	"github.com/gpuctl/gpuctl/api"
	"github.com/gpuctl/gpuctl/internal/etcdtest"
	"github.com/gpuctl/gpuctl/store"
)

// TestBatchesPastMaxTxnOps: an etcd that takes 4 ops a transaction still
// stores a 10-job Update in order, and a node's 10 events exactly once
// with the right seq; a record over the request limit is refused.
func TestBatchesPastMaxTxnOps(t *testing.T) {
	c := etcdtest.Start(t, 1)
	s := openFenced(t, c.Client(t), Options{MaxTxnOps: 4, MaxTxnBytes: 64 << 10})
	must(t, s.Update(func(tx store.Tx) error {
		for i := range 10 {
			if err := tx.PutJob(&api.Job{Id: fmt.Sprint("j-", i)}); err != nil {
				return err
			}
		}
		return nil
	}))
	if jobs, err := s.Jobs(); err != nil || len(jobs) != 10 {
		t.Fatalf("jobs = %d, %v", len(jobs), err)
	}
	var evs []*api.Event
	for seq := uint64(1); seq <= 10; seq++ {
		evs = append(evs, &api.Event{Seq: seq, Node: "n1", TimeUnixNano: int64(seq)})
	}
	if top, err := s.AppendNodeEvents("n1", evs); err != nil || top != 10 {
		t.Fatalf("AppendNodeEvents = %d, %v", top, err)
	}
	if top, err := s.AppendNodeEvents("n1", evs[5:]); err != nil || top != 10 {
		t.Fatalf("resend = %d, %v", top, err)
	}
	if got, err := s.Events(store.EventFilter{}); err != nil || len(got) != 10 {
		t.Fatalf("events = %d, %v", len(got), err)
	}
	err := s.PutJob(&api.Job{Id: "j-huge", SpecYaml: strings.Repeat("x", 70<<10)})
	if err == nil || !strings.Contains(err.Error(), "max-request-bytes") {
		t.Fatalf("a record over the request limit: %v", err)
	}
}

// TestSplitBatchRetryStoresEventsOnce: a batch split in several
// transactions whose second fails has stored its first; the job owner
// retries the step with the same events, which land once, not twice.
func TestSplitBatchRetryStoresEventsOnce(t *testing.T) {
	c := etcdtest.Start(t, 1)
	// Chunks of 4 writes; records up to 4 MiB pass the store's own check
	// and are refused by etcd (1.5 MiB a request), failing the second
	// transaction after the first committed.
	s := openFenced(t, c.Client(t), Options{MaxTxnOps: 4, MaxTxnBytes: 4 << 20})
	var evs []*api.Event
	for i := range 4 {
		evs = append(evs, &api.Event{TimeUnixNano: int64(100 + i), Message: fmt.Sprint("event ", i)})
	}
	job := &api.Job{Id: "j-1", SpecYaml: strings.Repeat("x", 2<<20)}
	step := func(tx store.Tx) error {
		for _, e := range evs {
			if err := tx.AppendEvent(e); err != nil {
				return err
			}
		}
		return tx.PutJob(job)
	}
	err := s.Update(step)
	if err == nil || !strings.Contains(err.Error(), "committed 1 of 2") {
		t.Fatalf("the oversized second transaction: %v, want it refused after the first committed", err)
	}
	if got, _ := s.Events(store.EventFilter{}); len(got) != 4 {
		t.Fatalf("after the partial commit %d events, want the first transaction's 4", len(got))
	}
	job.SpecYaml = "small"
	must(t, s.Update(step))
	got, err := s.Events(store.EventFilter{})
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != 4 {
		t.Fatalf("after the retry %d events, want 4 (each once)", len(got))
	}
	if j, err := s.Job("j-1"); err != nil || j.GetSpecYaml() != "small" {
		t.Fatalf("job after the retry: %v, %v", j, err)
	}
}
