package main

import (
	"encoding/json"
	"fmt"
	"log/slog"
	"os"
	"os/signal"
	"path/filepath"
	"syscall"
	"time"

	"github.com/spf13/cobra"

	"github.com/gpuctl/gpuctl/bench/swarm"
)

func init() { subcommands = append(subcommands, newBenchCmd) }

func newBenchCmd() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "bench",
		Short: "Load generators that measure a real gpuctl serve",
	}
	cmd.AddCommand(newBenchSwarmCmd())
	return cmd
}

func newBenchSwarmCmd() *cobra.Command {
	var (
		o      swarm.Options
		output string
		keep   bool
	)
	cmd := &cobra.Command{
		Use:   "swarm",
		Short: "Open N real node sessions from one process and measure the server",
		Long: `Start gpuctl serve on a loopback port (or use a running one with --config and
--server-pid), join N nodes with one token, connect each over its own QUIC
connection (mutual TLS, nodemon's protocol; one UDP socket for all), and stream
heartbeats and telemetry (8 simulated GPUs and NCCL call records a batch) at 1 Hz.
Reports the server's CPU (utime+stime from /proc over the window, in cores) and
RSS, per 1,000 nodes; GPU samples sent and visible per second; the time from a
sample leaving its node to a client's watch delivering it; and the round trip of
a command to a node and back, with heartbeats alone and with telemetry flowing.

Raise the open files limit (ulimit -n) for large swarms: each node keeps a few
streams but shares the one socket.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if output != "table" && output != "json" {
				return fmt.Errorf("-o %s: use table or json", output)
			}
			if o.Config == "" {
				exe, err := os.Executable()
				if err != nil {
					return err
				}
				o.Gpuctl = exe
			}
			if o.Dir == "" {
				dir, err := os.MkdirTemp("", "gpuctl-swarm-")
				if err != nil {
					return err
				}
				if !keep {
					defer os.RemoveAll(dir)
				}
				o.Dir = dir
			} else if err := os.MkdirAll(o.Dir, 0o755); err != nil {
				return err
			}
			logf, err := os.OpenFile(filepath.Join(o.Dir, "swarm.log"), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
			if err != nil {
				return err
			}
			defer logf.Close()
			o.Log = slog.New(slog.NewTextHandler(logf, &slog.HandlerOptions{Level: slog.LevelWarn}))
			ctx, stop := signal.NotifyContext(cmd.Context(), syscall.SIGINT, syscall.SIGTERM)
			defer stop()
			rep, err := swarm.Run(ctx, o)
			if err != nil {
				return err
			}
			if output == "json" {
				enc := json.NewEncoder(cmd.OutOrStdout())
				enc.SetIndent("", "  ")
				return enc.Encode(swarm.Document(rep))
			}
			return rep.WriteTable(cmd.OutOrStdout())
		},
	}
	f := cmd.Flags()
	f.IntVar(&o.Nodes, "nodes", 100, "node sessions to open")
	f.IntVar(&o.GPUs, "gpus", 8, "GPUs per node")
	f.IntVar(&o.Collectives, "collectives", 8, "NCCL call records per telemetry batch")
	f.DurationVar(&o.Interval, "interval", time.Second, "heartbeat period")
	f.DurationVar(&o.BatchInterval, "batch-interval", 0, "telemetry period (default --interval; shorter saturates the server with telemetry)")
	f.DurationVar(&o.Quiet, "quiet", 5*time.Second, "command round trips measured with heartbeats alone, before telemetry")
	f.DurationVar(&o.Warmup, "warmup", 5*time.Second, "telemetry before the measurement window")
	f.DurationVar(&o.Duration, "duration", 20*time.Second, "measurement window")
	f.StringVar(&o.Config, "config", "", "admin client config of a running server (with --server-pid); default: start one")
	f.IntVar(&o.ServerPID, "server-pid", 0, "pid of the running server whose CPU and memory are measured")
	f.StringVar(&o.Dir, "dir", "", "work dir for the server's state and node identities (default: a temporary dir)")
	f.BoolVar(&keep, "keep", false, "keep the temporary work dir (serve.log, swarm.log)")
	f.StringVar(&o.Store, "store", swarm.StoreBolt, "the started server's store: bbolt, or etcd (a one-member etcd run by the swarm)")
	f.BoolVar(&o.Failover, "failover", false, "after the measurement, kill the server, start another on its state, and time every node's reconnect")
	f.Uint64Var(&o.Seed, "seed", 1, "seed of the nodes' phases and figures")
	f.StringVarP(&output, "output", "o", "table", "output format: table or json")
	return cmd
}
