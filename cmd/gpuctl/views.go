package main

import (
	"context"
	"fmt"
	"io"
	"os/signal"
	"syscall"
	"time"

	"github.com/spf13/cobra"

	"github.com/gpuctl/gpuctl/api"
	"github.com/gpuctl/gpuctl/client"
	"github.com/gpuctl/gpuctl/views"
)

func init() {
	subcommands = append(subcommands, newNodesCmd, newGPUsCmd, newEventsCmd, newCollectivesCmd)
}

// viewFlags are the flags every list view shares.
type viewFlags struct {
	config string
	output string
	watch  bool
	every  time.Duration
}

func (v *viewFlags) add(cmd *cobra.Command) {
	addConfigFlag(cmd, &v.config)
	cmd.Flags().StringVarP(&v.output, "output", "o", "table", "output format: table, wide or json")
	cmd.Flags().BoolVarP(&v.watch, "watch", "w", false, "refresh until interrupted")
	cmd.Flags().DurationVar(&v.every, "interval", 2*time.Second, "refresh interval with --watch")
}

func addConfigFlag(cmd *cobra.Command, p *string) {
	cmd.Flags().StringVar(p, "config", "", "client config file (default $GPUCTL_CONFIG, then ~/.config/gpuctl/config.yaml)")
}

// dial connects with the config named by flag, $GPUCTL_CONFIG or the default.
func dial(ctx context.Context, flag string) (*client.Client, error) {
	path, err := client.ConfigPath(flag)
	if err != nil {
		return nil, err
	}
	return client.Dial(ctx, path)
}

// withClient dials with the config named by config, $GPUCTL_CONFIG or the
// default, runs f with the connection and closes it.
func withClient(cmd *cobra.Command, config string, f func(c *client.Client) error) error {
	c, err := dial(cmd.Context(), config)
	if err != nil {
		return err
	}
	defer c.Close()
	return f(c)
}

// runView fetches and renders once, or repeatedly with --watch (clearing
// the screen between tables; one JSON document per refresh).
func (v *viewFlags) run(cmd *cobra.Command, render func(ctx context.Context, c *client.Client, w io.Writer, f views.Format) error) error {
	f, err := views.ParseFormat(v.output)
	if err != nil {
		return err
	}
	ctx, stop := signal.NotifyContext(cmd.Context(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	c, err := dial(ctx, v.config)
	if err != nil {
		return err
	}
	defer c.Close()
	w := cmd.OutOrStdout()
	if !v.watch {
		return render(ctx, c, w, f)
	}
	t := time.NewTicker(v.every)
	defer t.Stop()
	for {
		if f != views.JSON {
			fmt.Fprint(w, "\033[H\033[2J")
			fmt.Fprintf(w, "every %s  %s\n\n", v.every, time.Now().Format(time.TimeOnly))
		}
		if err := render(ctx, c, w, f); err != nil {
			return err
		}
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
		}
	}
}

func newNodesCmd() *cobra.Command {
	var v viewFlags
	cmd := &cobra.Command{
		Use:   "nodes",
		Short: "List nodes with their state and GPU summary",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			return v.run(cmd, func(ctx context.Context, c *client.Client, w io.Writer, f views.Format) error {
				nodes, err := c.Nodes(ctx)
				if err != nil {
					return err
				}
				return views.Nodes(w, f, nodes, time.Now())
			})
		},
	}
	v.add(cmd)
	return cmd
}

func newGPUsCmd() *cobra.Command {
	var v viewFlags
	var node string
	cmd := &cobra.Command{
		Use:   "gpus",
		Short: "List every GPU with its latest counters",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			return v.run(cmd, func(ctx context.Context, c *client.Client, w io.Writer, f views.Format) error {
				nodes, err := c.Nodes(ctx)
				if err != nil {
					return err
				}
				if node != "" {
					nodes, err = onlyNode(nodes, node)
					if err != nil {
						return err
					}
				}
				return views.GPUs(w, f, nodes)
			})
		},
	}
	v.add(cmd)
	cmd.Flags().StringVar(&node, "node", "", "only this node's GPUs")
	return cmd
}

func onlyNode(nodes []*api.NodeStatus, name string) ([]*api.NodeStatus, error) {
	for _, n := range nodes {
		if n.GetRegistration().GetName() == name {
			return []*api.NodeStatus{n}, nil
		}
	}
	return nil, fmt.Errorf("unknown node %q: `gpuctl nodes` lists the known ones", name)
}

func newEventsCmd() *cobra.Command {
	var (
		v     viewFlags
		node  string
		since time.Duration
		limit uint32
	)
	cmd := &cobra.Command{
		Use:   "events",
		Short: "List cluster events: XIDs, ECC, throttling, node up/down, rank exits",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			return v.run(cmd, func(ctx context.Context, c *client.Client, w io.Writer, f views.Format) error {
				req := &api.ListEventsRequest{Node: node, Limit: limit}
				if since > 0 {
					req.SinceUnixNano = time.Now().Add(-since).UnixNano()
				}
				evs, err := c.Events(ctx, req)
				if err != nil {
					return err
				}
				return views.Events(w, f, evs)
			})
		},
	}
	v.add(cmd)
	cmd.Flags().StringVar(&node, "node", "", "only this node's events")
	cmd.Flags().DurationVar(&since, "since", 0, "only events newer than this, e.g. 10m")
	cmd.Flags().Uint32Var(&limit, "limit", 200, "at most this many, newest kept (0 = all)")
	return cmd
}

func newCollectivesCmd() *cobra.Command {
	var (
		v         viewFlags
		job, node string
	)
	cmd := &cobra.Command{
		Use:   "collectives",
		Short: "NCCL calls per rank, communicator and op, as traced by eBPF",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			return v.run(cmd, func(ctx context.Context, c *client.Client, w io.Writer, f views.Format) error {
				cs, err := c.Collectives(ctx, job, node)
				if err != nil {
					return err
				}
				return views.Collectives(w, f, cs, time.Now())
			})
		},
	}
	v.add(cmd)
	cmd.Flags().StringVar(&job, "job", "", "only this job's ranks")
	cmd.Flags().StringVar(&node, "node", "", "only this node's ranks")
	return cmd
}
