package scheduler

import (
	"errors"
	"testing"
)

func TestPlacementReason(t *testing.T) {
	cases := []struct {
		name string
		pe   PlacementError
		req  JobRequest
		want string
	}{
		{"nodes form", PlacementError{GPUs: 16, Group: 8, Counts: map[Reason]int{ReasonDown: 3, ReasonCordoned: 1}},
			JobRequest{GPUsPerNode: 8}, "needs 16 GPUs on 2 nodes of 8; 3 nodes down, 1 node cordoned"},
		{"groups", PlacementError{GPUs: 32, Group: 8, Passing: 2, FitGroups: 2, Counts: map[Reason]int{ReasonAllocated: 2, ReasonTopology: 2}},
			JobRequest{}, "needs 32 GPUs in groups of 8 inside one node; 2 nodes busy; the 2 nodes that pass have room for 2 of 4 groups"},
		{"single GPUs", PlacementError{GPUs: 32, Group: 1, Passing: 1, FitGroups: 8, Counts: map[Reason]int{ReasonTopology: 1}},
			JobRequest{}, "needs 32 GPUs; the 1 node that passes has 8 free GPUs"},
		{"empty cluster", PlacementError{GPUs: 2, Group: 1, Counts: map[Reason]int{}},
			JobRequest{}, "needs 2 GPUs; no nodes have registered"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			if got := c.pe.Explain(&c.req); got != c.want {
				t.Errorf("got  %q\nwant %q", got, c.want)
			}
		})
	}
}

// TestPendingReasonCountsFreeGPUs places a job that does not fit on a
// node whose GPUs are partly used and partly unhealthy: the reason counts
// only the GPUs free and healthy.
func TestPendingReasonCountsFreeGPUs(t *testing.T) {
	gpus := make([]GPU, 8)
	for i := range gpus {
		gpus[i] = GPU{Index: i, Healthy: true}
	}
	for _, i := range []int{0, 1, 2, 3} {
		gpus[i].Job = "j-other"
	}
	gpus[4].Healthy = false
	snap := Snapshot{Nodes: []Node{{Name: "n0", State: NodeReady, GPUs: gpus}}}
	r := JobRequest{ID: "j-new", Shape: Shape{TP: 1, PP: 1, DP: 6}}
	_, err := Place(&snap, &r)
	var pe *PlacementError
	if !errors.As(err, &pe) {
		t.Fatalf("Place: %v, want a PlacementError", err)
	}
	if got, want := pe.Explain(&r), "needs 6 GPUs; the 1 node that passes has 3 free GPUs"; got != want {
		t.Fatalf("reason %q, want %q (8 GPUs, 4 used, 1 unhealthy)", got, want)
	}
}
