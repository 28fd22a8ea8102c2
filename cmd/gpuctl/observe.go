package main

import (
	"time"

	"github.com/spf13/cobra"

	"github.com/gpuctl/gpuctl/api"
	"github.com/gpuctl/gpuctl/views"
)

func init() { subcommands = append(subcommands, newObserveCmd) }

func newObserveCmd() *cobra.Command {
	var (
		config, output, op   string
		node, job            string
		rank                 int32
		comm                 uint64
		minBytes             uint64
		slower               time.Duration
		since                sinceFlag
		last                 uint32
		follow, flows, calls bool
	)
	cmd := &cobra.Command{
		Use:   "observe",
		Short: "Stream NCCL calls and network flows live, Hubble-style",
		Long: `Stream traced NCCL calls and per-peer network flows. Without -f it prints
the most recent matching records (--last, default 100) and exits; with -f it
keeps following. Records an observer misses are never dropped silently: a
'lost' line says how many were dropped because this observer fell behind and
how many the nodes lost (eBPF ring buffer full).`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			f, err := views.ParseObserveFormat(output)
			if err != nil {
				return err
			}
			filter := &api.ObserveFilter{Node: node, Job: job, Comm: comm, MinBytes: minBytes,
				SlowerThanNs: int64(slower), Collectives: calls, Flows: flows}
			if cmd.Flags().Changed("rank") {
				filter.Rank, filter.HasRank = rank, true
			}
			if op != "" {
				if filter.Op, err = api.ParseNCCLOp(op); err != nil {
					return err
				}
			}
			req := &api.ObserveRequest{Filter: filter, Last: last, Follow: follow}
			if since.set {
				req.SinceUnixNano = since.at(time.Now()).UnixNano()
				if !cmd.Flags().Changed("last") {
					req.Last = 0
				}
			}
			ctx, c, done, err := dialInterruptible(cmd, config)
			if err != nil {
				return err
			}
			defer done()
			out := views.NewObserveWriter(cmd.OutOrStdout(), f)
			if err := c.Observe(ctx, req, out.Batch); err != nil {
				return err
			}
			if byServer, atNodes := out.Lost(); byServer+atNodes > 0 || !follow {
				return out.Summary()
			}
			return nil
		},
	}
	addConfigFlag(cmd, &config)
	fl := cmd.Flags()
	fl.StringVarP(&output, "output", "o", "compact", "output format: compact or json (one object per line)")
	fl.BoolVarP(&follow, "follow", "f", false, "keep streaming new records")
	fl.Uint32Var(&last, "last", 100, "start with the last N matching records (0 = none with -f, all retained without)")
	fl.Var(&since, "since", "start with records newer than this: a duration (30s, 1d) or an RFC 3339 time")
	fl.StringVar(&node, "node", "", "only this node")
	fl.StringVar(&job, "job", "", "only this job")
	fl.Int32Var(&rank, "rank", 0, "only this rank")
	fl.StringVar(&op, "op", "", "only this NCCL op: allreduce, allgather, reducescatter, broadcast, reduce, send, recv, …")
	fl.Uint64Var(&comm, "comm", 0, "only this communicator (as printed, e.g. 0x55d0c0a0)")
	fl.Uint64Var(&minBytes, "min-bytes", 0, "only calls or flows of at least this many bytes")
	fl.DurationVar(&slower, "slower-than", 0, "only calls that took longer than this, e.g. 5ms")
	fl.BoolVar(&calls, "calls", false, "only NCCL calls")
	fl.BoolVar(&flows, "flows", false, "only network flows")
	cmd.MarkFlagsMutuallyExclusive("calls", "flows")
	return cmd
}
