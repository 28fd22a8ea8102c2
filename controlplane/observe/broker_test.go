package observe

import (
	"testing"

	"github.com/gpuctl/gpuctl/api"
)

func TestObserveFilter(t *testing.T) {
	coll := func(node, job string, rank int32, op api.NCCLOp, bytes uint64, dur int64) *api.ObserveItem {
		return &api.ObserveItem{Node: node, Body: &api.ObserveItem_Collective{Collective: &api.CollectiveRecord{
			Job: job, Rank: rank, Op: op, Bytes: bytes, DurationNs: dur, Comm: 5}}}
	}
	flow := &api.ObserveItem{Node: "n1", Body: &api.ObserveItem_Flow{Flow: &api.NetFlowSample{Job: "j", Rank: 0, TxBytes: 10, RxBytes: 5}}}
	ar := api.NCCLOp_NCCL_OP_ALL_REDUCE
	tests := []struct {
		name string
		f    *api.ObserveFilter
		it   *api.ObserveItem
		want bool
	}{
		{"nil filter", nil, flow, true},
		{"node match", &api.ObserveFilter{Node: "n1"}, coll("n1", "j", 0, ar, 1, 1), true},
		{"node mismatch", &api.ObserveFilter{Node: "n2"}, coll("n1", "j", 0, ar, 1, 1), false},
		{"rank 0 set", &api.ObserveFilter{Rank: 0, HasRank: true}, coll("n1", "j", 1, ar, 1, 1), false},
		{"op mismatch", &api.ObserveFilter{Op: api.NCCLOp_NCCL_OP_SEND}, coll("n1", "j", 0, ar, 1, 1), false},
		{"op excludes flows", &api.ObserveFilter{Op: ar}, flow, false},
		{"min bytes", &api.ObserveFilter{MinBytes: 100}, coll("n1", "j", 0, ar, 99, 1), false},
		{"min bytes flow", &api.ObserveFilter{MinBytes: 15}, flow, true},
		{"slower than", &api.ObserveFilter{SlowerThanNs: 10}, coll("n1", "j", 0, ar, 1, 9), false},
		{"slower than ok", &api.ObserveFilter{SlowerThanNs: 10}, coll("n1", "j", 0, ar, 1, 10), true},
		{"flows only", &api.ObserveFilter{Flows: true}, coll("n1", "j", 0, ar, 1, 1), false},
		{"calls only", &api.ObserveFilter{Collectives: true}, flow, false},
		{"comm", &api.ObserveFilter{Comm: 6}, coll("n1", "j", 0, ar, 1, 1), false},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			if got := Matches(tc.f, tc.it); got != tc.want {
				t.Fatalf("matches = %v, want %v", got, tc.want)
			}
		})
	}
}

func TestBrokerCountsWhatASlowObserverMisses(t *testing.T) {
	b := NewBroker(10)
	sub, past := b.Subscribe(nil, 0, 0, true)
	if len(past) != 0 {
		t.Fatalf("history before any publish: %v", past)
	}
	items := make([]*api.ObserveItem, subscriberBuffer+5)
	for i := range items {
		items[i] = &api.ObserveItem{Node: "n", Body: &api.ObserveItem_Collective{Collective: &api.CollectiveRecord{Seq: uint64(i), StartUnixNano: int64(i)}}}
	}
	b.Publish(items, 3)
	if got := sub.Lost(); got != 5 {
		t.Fatalf("lost = %d, want 5", got)
	}
	_, last := b.Subscribe(nil, 3, 0, false)
	if len(last) != 3 || last[2].GetCollective().GetSeq() != uint64(len(items)-1) {
		t.Fatalf("--last 3 = %v", last)
	}
	_, since := b.Subscribe(nil, 0, int64(len(items)-2), false)
	if len(since) != 2 {
		t.Fatalf("--since = %d items, want 2", len(since))
	}
	if b.NodeLosses() != 3 {
		t.Fatalf("node losses = %d", b.NodeLosses())
	}
}
