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
