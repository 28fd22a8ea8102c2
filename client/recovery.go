package client

import (
	"context"

	"github.com/gpuctl/gpuctl/api"
)

// CheckpointJob asks every rank of a running job to checkpoint now
// (SIGUSR1) and returns the job as it stands.
func (c *Client) CheckpointJob(ctx context.Context, job string) (*api.Job, error) {
	r, err := c.do(ctx, &api.ClientRequest{Body: &api.ClientRequest_CheckpointJob{CheckpointJob: &api.CheckpointJobRequest{Job: job}}})
	if err != nil {
		return nil, err
	}
	return r.GetCheckpointJob().GetJob(), nil
}

// RestartJob restarts a running or failed job from a checkpoint ("latest"
// or "" for the latest complete one, else a step number), avoiding the
// excluded nodes. The job comes back recovering; `Jobs` follows it.
func (c *Client) RestartJob(ctx context.Context, job, fromCheckpoint string, exclude []string) (*api.Job, error) {
	r, err := c.do(ctx, &api.ClientRequest{Body: &api.ClientRequest_RestartJob{RestartJob: &api.RestartJobRequest{
		Job: job, FromCheckpoint: fromCheckpoint, Exclude: exclude}}})
	if err != nil {
		return nil, err
	}
	return r.GetRestartJob().GetJob(), nil
}
