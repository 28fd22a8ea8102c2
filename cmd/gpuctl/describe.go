package main

import (
	"context"
	"fmt"
	"io"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/gpuctl/gpuctl/api"
	"github.com/gpuctl/gpuctl/client"
	"github.com/gpuctl/gpuctl/views"
)

func init() { subcommands = append(subcommands, newDescribeCmd) }

func newDescribeCmd() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "describe node|job|gpu NAME",
		Short: "Every fact of a node, job or GPU, with its placement, history and recent events",
		Long: `describe shows one object the way kubectl describe and scontrol show do:
every fact the server knows, where it runs, its history (a job's attempts, as
sacct lists them; a GPU's retained samples) and its recent events. A GPU is
named NODE/INDEX (node-00/3) or by its UUID.`,
	}
	for _, kind := range []string{"node", "job", "gpu"} {
		cmd.AddCommand(newDescribeKindCmd(kind))
	}
	return cmd
}

func newDescribeKindCmd(kind string) *cobra.Command {
	var config, output string
	use := map[string]string{"node": "node NAME", "job": "job ID|NAME", "gpu": "gpu NODE/INDEX|UUID"}
	cmd := &cobra.Command{
		Use:   use[kind],
		Short: "Describe a " + kind,
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			f, err := views.ParseFormat(output)
			if err != nil || f == views.JSON {
				return fmt.Errorf("unknown output %q: use table or wide (for JSON, use gpuctl %ss -o json)", output, kind)
			}
			o := views.Options{Format: f, Width: terminalWidth(cmd.OutOrStdout()), Now: time.Now()}
			return withClient(cmd, config, func(c *client.Client) error {
				ctx, w := cmd.Context(), cmd.OutOrStdout()
				switch kind {
				case "node":
					return describeNode(ctx, c, w, o, args[0])
				case "job":
					return describeJob(ctx, c, w, o, args[0])
				}
				return describeGPU(ctx, c, w, o, args[0])
			})
		},
	}
	addConfigFlag(cmd, &config)
	cmd.Flags().StringVarP(&output, "output", "o", "table", "table, or wide for untruncated tables")
	return cmd
}

func describeNode(ctx context.Context, c *client.Client, w io.Writer, o views.Options, name string) error {
	nodes, err := c.Nodes(ctx)
	if err != nil {
		return err
	}
	sel, err := views.SelectNodes(nodes, []string{name})
	if err != nil {
		return err
	}
	jobs, err := c.Jobs(ctx, "")
	if err != nil {
		return err
	}
	evs, err := c.Events(ctx, &api.ListEventsRequest{Node: name, Limit: 50})
	if err != nil {
		return err
	}
	return views.DescribeNode(w, o, sel[0], jobs, evs)
}

func describeJob(ctx context.Context, c *client.Client, w io.Writer, o views.Options, key string) error {
	jobs, err := c.Jobs(ctx, "")
	if err != nil {
		return err
	}
	sel, err := views.JobFilter{Names: []string{key}}.Apply(jobs, o.Now)
	if err != nil {
		return err
	}
	if len(sel) > 1 {
		ids := make([]string, len(sel))
		for i, j := range sel {
			ids[i] = j.GetId()
		}
		return fmt.Errorf("%d jobs are named %q: describe one by id (%s)", len(sel), key, strings.Join(ids, ", "))
	}
	j := sel[0]
	stalls, err := c.ListStalls(ctx, j.GetId())
	if err != nil {
		return err
	}
	evs, err := c.Events(ctx, &api.ListEventsRequest{})
	if err != nil {
		return err
	}
	if evs, err = jobEvents(ctx, c, j.GetId(), evs); err != nil {
		return err
	}
	return views.DescribeJob(w, o, j, stalls, evs)
}

func describeGPU(ctx context.Context, c *client.Client, w io.Writer, o views.Options, name string) error {
	nodes, err := c.Nodes(ctx)
	if err != nil {
		return err
	}
	var node *api.NodeStatus
	var gpu *api.GPUStatus
	nodeName, index, byIndex := views.ParseGPUName(name)
	for _, n := range nodes {
		for _, g := range n.GetGpus() {
			if byIndex && n.GetRegistration().GetName() == nodeName && int(g.GetInfo().GetIndex()) == index ||
				!byIndex && strings.EqualFold(g.GetInfo().GetUuid(), name) {
				node, gpu = n, g
			}
		}
	}
	if gpu == nil {
		if byIndex {
			sel, err := views.SelectNodes(nodes, []string{nodeName})
			if err != nil {
				return err
			}
			var idx []string
			for _, g := range sel[0].GetGpus() {
				idx = append(idx, strconv.Itoa(int(g.GetInfo().GetIndex())))
			}
			sort.Strings(idx)
			return fmt.Errorf("%s has no GPU %d: its GPUs are %s", nodeName, index, strings.Join(idx, ","))
		}
		return fmt.Errorf("no GPU %q: name one NODE/INDEX (node-00/3) or by UUID; `gpuctl gpus -o wide` lists them", name)
	}
	nn := node.GetRegistration().GetName()
	history, err := c.GPUHistory(ctx, nn, int(gpu.GetInfo().GetIndex()))
	if err != nil {
		return err
	}
	jobs, err := c.Jobs(ctx, "")
	if err != nil {
		return err
	}
	evs, err := c.Events(ctx, &api.ListEventsRequest{Node: nn, Limit: 0})
	if err != nil {
		return err
	}
	return views.DescribeGPU(w, o, node, gpu, history, jobs, evs)
}
