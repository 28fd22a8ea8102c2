package client

import (
	"context"
	"fmt"

	"github.com/gpuctl/gpuctl/api"
)

// SnapshotTransport answers the list requests a watch covers (nodes, jobs,
// stalls) from snap as the server would, and passes every other request
// to next: a command refreshed from a watch reads no more than it would
// from the server.
func SnapshotTransport(snap Snapshot, next Transport) Transport {
	return &snapshotTransport{snap: snap, next: next}
}

type snapshotTransport struct {
	snap Snapshot
	next Transport
}

func (t *snapshotTransport) Close() error { return nil }

func (t *snapshotTransport) Call(ctx context.Context, req *api.ClientRequest, fn func(*api.ClientResponse) error) error {
	unknownJob := func(key string) error {
		return fn(&api.ClientResponse{Error: fmt.Sprintf("unknown job %q: `gpuctl jobs` lists them", key)})
	}
	switch b := req.Body.(type) {
	case *api.ClientRequest_ListNodes:
		return fn(&api.ClientResponse{Body: &api.ClientResponse_ListNodes{ListNodes: &api.ListNodesResponse{Nodes: t.snap.Nodes}}})
	case *api.ClientRequest_ListJobs:
		key, jobs := b.ListJobs.GetJob(), t.snap.Jobs
		if key != "" {
			if jobs = api.MatchJobs(t.snap.Jobs, key); len(jobs) == 0 {
				return unknownJob(key)
			}
		}
		return fn(&api.ClientResponse{Body: &api.ClientResponse_ListJobs{ListJobs: &api.ListJobsResponse{Jobs: jobs}}})
	case *api.ClientRequest_ListStalls:
		stalls := t.snap.Stalls
		if key := b.ListStalls.GetJob(); key != "" {
			j, err := api.FindJob(t.snap.Jobs, key)
			if err != nil {
				return fn(&api.ClientResponse{Error: err.Error()})
			}
			stalls = nil
			for _, s := range t.snap.Stalls {
				if s.GetJob() == j.GetId() {
					stalls = append(stalls, s)
				}
			}
		}
		return fn(&api.ClientResponse{Body: &api.ClientResponse_ListStalls{ListStalls: &api.ListStallsResponse{Stalls: stalls}}})
	}
	return t.next.Call(ctx, req, fn)
}
