package client

import (
	"context"
	"strings"
	"testing"

	"github.com/gpuctl/gpuctl/api"
)

// TestSnapshotTransportAnswersAsTheServer: a listing by name shows every
// run of it (api.MatchJobs), and stalls of an ambiguous name are refused
// as the server refuses them (api.FindJob).
func TestSnapshotTransportAnswersAsTheServer(t *testing.T) {
	run := api.JobState_JOB_STATE_RUNNING
	snap := Snapshot{Jobs: []*api.Job{{Id: "j-1", Name: "a", State: run}, {Id: "j-2", Name: "a", State: run}, {Id: "j-3", Name: "b", State: run}},
		Stalls: []*api.Stall{{Job: "j-3"}}}
	c := New(SnapshotTransport(snap, nil))
	ctx := context.Background()

	var listed *api.ListJobsResponse
	err := c.Transport().Call(ctx, &api.ClientRequest{Body: &api.ClientRequest_ListJobs{ListJobs: &api.ListJobsRequest{Job: "a"}}},
		func(r *api.ClientResponse) error { listed = r.GetListJobs(); return nil })
	if err != nil || len(listed.GetJobs()) != 2 {
		t.Fatalf("jobs named a: %v, %v", listed, err)
	}
	for key, want := range map[string]string{"a": "name one by id", "b": "", "c": `unknown job "c"`} {
		var resp *api.ClientResponse
		err := c.Transport().Call(ctx, &api.ClientRequest{Body: &api.ClientRequest_ListStalls{ListStalls: &api.ListStallsRequest{Job: key}}},
			func(r *api.ClientResponse) error { resp = r; return nil })
		if err != nil {
			t.Fatal(err)
		}
		_, findErr := api.FindJob(snap.Jobs, key)
		if (findErr == nil) != (resp.GetError() == "") || !strings.Contains(resp.GetError(), want) {
			t.Errorf("stalls of %q: %q, FindJob says %v", key, resp.GetError(), findErr)
		}
		if key == "b" && len(resp.GetListStalls().GetStalls()) != 1 {
			t.Errorf("stalls of b: %v", resp.GetListStalls())
		}
	}
}
