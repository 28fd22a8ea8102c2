package client

import (
	"context"
	"errors"
	"time"

	"github.com/google/uuid"
	"google.golang.org/protobuf/proto"

	"github.com/gpuctl/gpuctl/api"
)

// SubmitJob submits a job file (YAML text); with req.DryRun it only shows
// the plan and where the job would be placed now.
//
// A submit carries an idempotency key (a fresh one unless req has one): when
// the answer is lost with the connection, the submit is sent again with the
// same key, and the server answers with the job the first try created
// rather than create a second.
func (c *Client) SubmitJob(ctx context.Context, req *api.SubmitJobRequest) (*api.SubmitJobResponse, error) {
	if req.GetIdempotencyKey() == "" && !req.GetDryRun() {
		req = proto.Clone(req).(*api.SubmitJobRequest)
		req.IdempotencyKey = uuid.NewString()
	}
	var err error
	for try := range submitTries {
		var r *api.ClientResponse
		r, err = c.do(ctx, &api.ClientRequest{Body: &api.ClientRequest_SubmitJob{SubmitJob: req}})
		if err == nil {
			return r.GetSubmitJob(), nil
		}
		var se *serverError
		if errors.As(err, &se) || ctx.Err() != nil || try == submitTries-1 {
			break
		}
		time.Sleep(time.Duration(try+1) * 200 * time.Millisecond)
	}
	return nil, err
}

// submitTries bounds how often a submit whose answer was lost is sent.
const submitTries = 3

// Jobs lists jobs, oldest first; job (an id or a name) narrows the list,
// "" lists all.
func (c *Client) Jobs(ctx context.Context, job string) ([]*api.Job, error) {
	r, err := c.do(ctx, &api.ClientRequest{Body: &api.ClientRequest_ListJobs{ListJobs: &api.ListJobsRequest{Job: job}}})
	if err != nil {
		return nil, err
	}
	return r.GetListJobs().GetJobs(), nil
}

// CancelJob cancels a job by id or name and returns it as it now stands.
func (c *Client) CancelJob(ctx context.Context, job string) (*api.Job, error) {
	r, err := c.do(ctx, &api.ClientRequest{Body: &api.ClientRequest_CancelJob{CancelJob: &api.CancelJobRequest{Job: job}}})
	if err != nil {
		return nil, err
	}
	return r.GetCancelJob().GetJob(), nil
}

// AssignJob starts a pending job on exactly the named nodes.
func (c *Client) AssignJob(ctx context.Context, job string, nodes []string) (*api.Job, error) {
	r, err := c.do(ctx, &api.ClientRequest{Body: &api.ClientRequest_AssignJob{AssignJob: &api.AssignJobRequest{Job: job, Nodes: nodes}}})
	if err != nil {
		return nil, err
	}
	return r.GetAssignJob().GetJob(), nil
}

// Rebalance returns the server's rebalance plan; with apply it also starts
// the moves (checkpoint, stop, relaunch, one job at a time).
func (c *Client) Rebalance(ctx context.Context, apply bool, maxMoves uint32) (*api.RebalanceResponse, error) {
	r, err := c.do(ctx, &api.ClientRequest{Body: &api.ClientRequest_Rebalance{Rebalance: &api.RebalanceRequest{Apply: apply, MaxMoves: maxMoves}}})
	if err != nil {
		return nil, err
	}
	return r.GetRebalance(), nil
}

// ReleaseJob hands a held job (submitted with hold) to the scheduler and
// returns it as it now stands.
func (c *Client) ReleaseJob(ctx context.Context, job string) (*api.Job, error) {
	r, err := c.do(ctx, &api.ClientRequest{Body: &api.ClientRequest_ReleaseJob{ReleaseJob: &api.ReleaseJobRequest{Job: job}}})
	if err != nil {
		return nil, err
	}
	return r.GetReleaseJob().GetJob(), nil
}
