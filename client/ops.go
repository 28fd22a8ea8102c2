package client

import (
	"context"
	"fmt"

	"github.com/gpuctl/gpuctl/api"
)

// ListStalls lists the NCCL stalls declared now; job (an id or a name)
// narrows the list, "" lists every job's.
func (c *Client) ListStalls(ctx context.Context, job string) ([]*api.Stall, error) {
	r, err := c.ListFindings(ctx, job)
	return r.GetStalls(), err
}

// ListFindings lists the NCCL stalls declared now and the fail-slow
// findings standing now; job (an id or a name) narrows the lists.
func (c *Client) ListFindings(ctx context.Context, job string) (*api.ListStallsResponse, error) {
	r, err := c.do(ctx, &api.ClientRequest{Body: &api.ClientRequest_ListStalls{ListStalls: &api.ListStallsRequest{Job: job}}})
	if err != nil {
		return nil, err
	}
	return r.GetListStalls(), nil
}

// QuietSlow acknowledges a job's standing fail-slow findings (ForNs 0) or
// silences its findings for a while, narrowed to a rank or node when
// the request names one.
func (c *Client) QuietSlow(ctx context.Context, req *api.QuietSlowRequest) (*api.QuietSlowResponse, error) {
	r, err := c.do(ctx, &api.ClientRequest{Body: &api.ClientRequest_QuietSlow{QuietSlow: req}})
	if err != nil {
		return nil, err
	}
	return r.GetQuietSlow(), nil
}

// Cordon applies action (cordon, uncordon or drain) to node with reason,
// and returns the node's new status and, for a drain, its jobs' fate.
func (c *Client) Cordon(ctx context.Context, node, action, reason string) (*api.CordonResponse, error) {
	r, err := c.do(ctx, &api.ClientRequest{Body: &api.ClientRequest_Cordon{Cordon: &api.CordonRequest{Node: node, Action: action, Reason: reason}}})
	if err != nil {
		return nil, err
	}
	return r.GetCordon(), nil
}

// Logs streams a rank's log to fn: what is there, then with req.Follow
// what the rank writes next, until the job ends, ctx ends or fn returns
// an error.
func (c *Client) Logs(ctx context.Context, req *api.LogsRequest, fn func(*api.LogsChunk) error) error {
	err := c.stream(ctx, &api.ClientRequest{Body: &api.ClientRequest_Logs{Logs: req}}, func(r *api.ClientResponse) error {
		return fn(r.GetLogs())
	})
	if ctx.Err() != nil {
		return nil
	}
	if err != nil {
		return fmt.Errorf("logs: %w", err)
	}
	return nil
}

// Version asks the server which release and protocol it runs.
func (c *Client) Version(ctx context.Context) (*api.VersionResponse, error) {
	r, err := c.do(ctx, &api.ClientRequest{Body: &api.ClientRequest_Version{Version: &api.VersionRequest{}}})
	if err != nil {
		return nil, err
	}
	return r.GetVersion(), nil
}

// Status asks which server leads the control plane and how its store is.
func (c *Client) Status(ctx context.Context) (*api.StatusResponse, error) {
	r, err := c.do(ctx, &api.ClientRequest{Body: &api.ClientRequest_Status{Status: &api.StatusRequest{}}})
	if err != nil {
		return nil, err
	}
	return r.GetStatus(), nil
}
