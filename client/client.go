// Package client is the gpuctl side of the client API: it dials gpuctl
// serve with the operator's certificate and makes requests.
package client

import (
	"context"
	"errors"
	"fmt"
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

// Transport carries client requests to a server: a QUIC connection
// (Dial), or the server itself in-process (the console it serves over
// SSH), so every caller goes through the same requests and the same
// authorization.
type Transport interface {
	// Call sends req and hands each answer to fn until the server ends
	// the answer (one answer for most requests; observe, logs and watch
	// stream several), fn returns an error, or ctx ends. It returns
	// fn's error, or nil once the answer is complete.
	Call(ctx context.Context, req *api.ClientRequest, fn func(*api.ClientResponse) error) error
	Close() error
}

// Client makes gpuctl's requests over a Transport.
type Client struct {
	t Transport
}

// New returns a client over t.
func New(t Transport) *Client { return &Client{t: t} }

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

// Dial connects with the config at path: to the first of its servers
// that answers, starting with the one that last answered a command run
// with the same servers (remembered in CacheDir).
func Dial(ctx context.Context, path string) (*Client, error) {
	cfg, id, err := transport.LoadClientConfig(path)
	if err != nil {
		if _, serr := os.Stat(path); errors.Is(serr, os.ErrNotExist) {
			return nil, fmt.Errorf("client config %s not found: pass --config, set $%s, or copy admin.yaml from gpuctl serve's --data-dir", path, EnvConfig)
		}
		return nil, fmt.Errorf("load client config %s: %w", path, err)
	}
	return dialRemembering(ctx, cfg.Servers, id, openLastServer(cfg.Servers))
}

// DialIdentity connects to the server at addr (host:port, or every
// server of a highly available control plane, comma-separated) as id, for
// a caller that holds an identity rather than a config file (the SSH
// console's per-session clients).
func DialIdentity(ctx context.Context, addr string, id *transport.Identity) (*Client, error) {
	addrs, err := transport.ParseServers(addr)
	if err != nil {
		return nil, fmt.Errorf("connect to gpuctl serve: %w", err)
	}
	return DialServers(ctx, addrs, id)
}

// DialServers connects as id to the first of addrs (from
// transport.ParseServers) that answers; later requests follow the leader
// and move on when a server is lost (see quicTransport).
func DialServers(ctx context.Context, addrs []string, id *transport.Identity) (*Client, error) {
	return dialRemembering(ctx, addrs, id, nil)
}

// dialRemembering is DialServers starting with the server last remembers,
// and remembering the one that answers (last nil: none kept).
func dialRemembering(ctx context.Context, addrs []string, id *transport.Identity, last *lastServer) (*Client, error) {
	q := newQUICTransport(addrs, func(ctx context.Context, addr string) (*transport.Conn, error) {
		dctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		defer cancel()
		conn, err := transport.DialClient(dctx, addr, id)
		if err != nil {
			return nil, fmt.Errorf("connect to gpuctl serve at %s: %w", addr, err)
		}
		return conn, nil
	})
	q.remember(last)
	l, err := q.acquire(ctx)
	if err != nil {
		return nil, err
	}
	q.release(l)
	return New(q), nil
}

// Close closes the connection.
func (c *Client) Close() error { return c.t.Close() }

// errDone ends a Call once the one answer a request expects has come.
var errDone = errors.New("answer complete")

// do sends one request and returns its single answer.
func (c *Client) do(ctx context.Context, req *api.ClientRequest) (*api.ClientResponse, error) {
	ctx, cancel := context.WithTimeout(ctx, requestTimeout)
	defer cancel()
	var resp *api.ClientResponse
	err := c.t.Call(ctx, req, func(r *api.ClientResponse) error {
		resp = r
		return errDone
	})
	switch {
	case err != nil && !errors.Is(err, errDone):
		return nil, err
	case resp == nil:
		return nil, errors.New("the server closed the request without an answer")
	case resp.GetError() != "":
		return nil, &serverError{msg: resp.GetError()}
	}
	return resp, nil
}

// stream sends a request whose answer is a stream and hands every part
// to fn; an error answer ends it with that error.
func (c *Client) stream(ctx context.Context, req *api.ClientRequest, fn func(*api.ClientResponse) error) error {
	return c.t.Call(ctx, req, func(r *api.ClientResponse) error {
		if r.GetError() != "" {
			return errors.New(r.GetError())
		}
		return fn(r)
	})
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

// InjectFault asks a simulated node to inject a GPU fault.
func (c *Client) InjectFault(ctx context.Context, node string, f *api.InjectFault) error {
	_, err := c.do(ctx, &api.ClientRequest{Body: &api.ClientRequest_InjectFault{InjectFault: &api.InjectFaultRequest{Node: node, Fault: f}}})
	return err
}

// Observe streams traced calls and flows to fn until the server ends a
// non-following request, ctx ends, or fn returns an error.
func (c *Client) Observe(ctx context.Context, req *api.ObserveRequest, fn func(*api.ObserveBatch) error) error {
	err := c.stream(ctx, &api.ClientRequest{Body: &api.ClientRequest_Observe{Observe: req}}, func(r *api.ClientResponse) error {
		b := r.GetObserve()
		if err := fn(b); err != nil {
			return err
		}
		if b.GetEnd() {
			return errDone
		}
		return nil
	})
	if errors.Is(err, errDone) || ctx.Err() != nil {
		return nil
	}
	if err != nil {
		return fmt.Errorf("observe: %w", err)
	}
	return nil
}

// Transport is the transport the client makes its requests over.
func (c *Client) Transport() Transport { return c.t }
