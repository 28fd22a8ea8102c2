// Package client is the gpuctl side of the client API: it dials gpuctl
// serve with the operator's certificate and makes requests.
package client

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"time"

	"github.com/gpuctl/gpuctl/api"
	"github.com/gpuctl/gpuctl/transport"
)

// EnvConfig names the environment variable holding the config file path.
const EnvConfig = "GPUCTL_CONFIG"

// requestTimeout bounds a single request and its answer.
const requestTimeout = 15 * time.Second

// Client is a connection to gpuctl serve.
type Client struct {
	conn *transport.Conn
}

// ConfigPath picks the client config: the flag, else $GPUCTL_CONFIG, else
// ~/.config/gpuctl/config.yaml.
func ConfigPath(flag string) (string, error) {
	if flag != "" {
		return flag, nil
	}
	if p := os.Getenv(EnvConfig); p != "" {
		return p, nil
	}
	home, err := os.UserHomeDir()
	if err != nil {
		return "", fmt.Errorf("no --config, no $%s and no home directory: %w", EnvConfig, err)
	}
	return filepath.Join(home, ".config", "gpuctl", "config.yaml"), nil
}

// Dial connects with the config at path.
func Dial(ctx context.Context, path string) (*Client, error) {
	cfg, id, err := transport.LoadClientConfig(path)
	if err != nil {
		if errors.Is(err, os.ErrNotExist) {
			return nil, fmt.Errorf("client config %s not found: pass --config, set $%s, or copy admin.yaml from gpuctl serve's --data-dir", path, EnvConfig)
		}
		return nil, fmt.Errorf("load client config %s: %w", path, err)
	}
	dctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	conn, err := transport.DialClient(dctx, cfg.Server, id)
	if err != nil {
		return nil, fmt.Errorf("connect to gpuctl serve at %s: %w", cfg.Server, err)
	}
	return &Client{conn: conn}, nil
}

// Close closes the connection.
func (c *Client) Close() error { return c.conn.Close() }

// do sends one request and returns its single answer.
func (c *Client) do(ctx context.Context, req *api.ClientRequest) (*api.ClientResponse, error) {
	ctx, cancel := context.WithTimeout(ctx, requestTimeout)
	defer cancel()
	st, err := c.conn.OpenStream(ctx, transport.StreamRequest)
	if err != nil {
		return nil, fmt.Errorf("open request stream: %w", err)
	}
	defer st.CloseWrite()
	if dl, ok := ctx.Deadline(); ok {
		st.SetDeadline(dl)
	}
	if err := st.Send(req); err != nil {
		return nil, fmt.Errorf("send request: %w", err)
	}
	var resp api.ClientResponse
	if err := st.Recv(&resp); err != nil {
		return nil, fmt.Errorf("read answer: %w", err)
	}
	if resp.GetError() != "" {
		return nil, errors.New(resp.GetError())
	}
	return &resp, nil
}

// Nodes lists every node with its GPUs' latest samples.
func (c *Client) Nodes(ctx context.Context) ([]*api.NodeStatus, error) {
	r, err := c.do(ctx, &api.ClientRequest{Body: &api.ClientRequest_ListNodes{ListNodes: &api.ListNodesRequest{}}})
	if err != nil {
		return nil, err
	}
	return r.GetListNodes().GetNodes(), nil
}

// Events lists events, oldest first.
func (c *Client) Events(ctx context.Context, req *api.ListEventsRequest) ([]*api.Event, error) {
	r, err := c.do(ctx, &api.ClientRequest{Body: &api.ClientRequest_ListEvents{ListEvents: req}})
	if err != nil {
		return nil, err
	}
	return r.GetListEvents().GetEvents(), nil
}

// Collectives lists per-rank NCCL call aggregates.
func (c *Client) Collectives(ctx context.Context, job, node string) ([]*api.CollectiveStat, error) {
	r, err := c.do(ctx, &api.ClientRequest{Body: &api.ClientRequest_ListCollectives{ListCollectives: &api.ListCollectivesRequest{Job: job, Node: node}}})
	if err != nil {
		return nil, err
	}
	return r.GetListCollectives().GetCollectives(), nil
}

// GPUHistory returns a GPU's retained samples.
func (c *Client) GPUHistory(ctx context.Context, node string, gpu int) ([]*api.GPUSample, error) {
	r, err := c.do(ctx, &api.ClientRequest{Body: &api.ClientRequest_GpuHistory{GpuHistory: &api.GPUHistoryRequest{Node: node, GpuIndex: int32(gpu)}}})
	if err != nil {
		return nil, err
	}
	return r.GetGpuHistory().GetSamples(), nil
}

// CreateToken makes a join token valid for ttl.
func (c *Client) CreateToken(ctx context.Context, ttl time.Duration) (string, time.Time, error) {
	r, err := c.do(ctx, &api.ClientRequest{Body: &api.ClientRequest_CreateToken{CreateToken: &api.CreateTokenRequest{TtlSeconds: int64(ttl / time.Second)}}})
	if err != nil {
		return "", time.Time{}, err
	}
	return r.GetCreateToken().GetToken(), time.Unix(0, r.GetCreateToken().GetExpiresUnixNano()), nil
}

// InjectFault asks a simulated node to inject a GPU fault.
func (c *Client) InjectFault(ctx context.Context, node string, f *api.InjectFault) error {
	_, err := c.do(ctx, &api.ClientRequest{Body: &api.ClientRequest_InjectFault{InjectFault: &api.InjectFaultRequest{Node: node, Fault: f}}})
	return err
}

// Observe streams traced calls and flows to fn until the server ends a
// non-following request, ctx ends, or fn returns an error.
func (c *Client) Observe(ctx context.Context, req *api.ObserveRequest, fn func(*api.ObserveBatch) error) error {
	octx, cancel := context.WithCancel(ctx)
	defer cancel()
	st, err := c.conn.OpenStream(octx, transport.StreamRequest)
	if err != nil {
		return fmt.Errorf("open observe stream: %w", err)
	}
	defer st.CloseWrite()
	if err := st.Send(&api.ClientRequest{Body: &api.ClientRequest_Observe{Observe: req}}); err != nil {
		return fmt.Errorf("send observe request: %w", err)
	}
	stop := context.AfterFunc(octx, func() { st.Cancel(0) })
	defer stop()
	for {
		var resp api.ClientResponse
		if err := st.Recv(&resp); err != nil {
			if ctx.Err() != nil {
				return nil
			}
			if errors.Is(err, io.EOF) {
				return nil
			}
			return fmt.Errorf("observe: %w", err)
		}
		if resp.GetError() != "" {
			return errors.New(resp.GetError())
		}
		b := resp.GetObserve()
		if err := fn(b); err != nil {
			return err
		}
		if b.GetEnd() {
			return nil
		}
	}
}
