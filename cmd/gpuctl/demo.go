package main

import (
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/signal"
	"path/filepath"
	"strings"
	"syscall"

	"github.com/spf13/cobra"

	"github.com/gpuctl/gpuctl/demo"
)

func init() { subcommands = append(subcommands, newDemoCmd) }

func newDemoCmd() *cobra.Command {
	opts := demo.DefaultOptions()
	opts.MetricsBasePort = 9400
	var (
		headless bool
		dataDir  string
		console  consoleFlags
		sshf     sshConsoleFlags
	)
	cmd := &cobra.Command{
		Use:   "demo",
		Short: "Run a small real cluster on this machine: server, N nodemons with simulated GPUs, a ring-allreduce job",
		Long: `Run gpuctl's embedded default: a control plane and N nodemon processes with
simulated DGX H100 hosts on loopback, and the reference ring trainer spread over
two of them, so real QUIC, real processes, real TCP collectives and (as root)
real eBPF traces flow, and opens the console on it. With --headless it prints
one line

  gpuctl demo ready config=PATH

once every node has reported, then runs until SIGINT or SIGTERM; point other
gpuctl commands at it with --config PATH or GPUCTL_CONFIG=PATH.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			exe, err := os.Executable()
			if err != nil {
				return err
			}
			binDir := filepath.Dir(exe)
			if opts.Nodemon == "" {
				opts.Nodemon = filepath.Join(binDir, "nodemon")
			}
			if opts.Ringtrain == "" {
				opts.Ringtrain = filepath.Join(binDir, "..", "workload", "build", "ringtrain")
			}
			if dataDir == "" {
				if dataDir, err = os.MkdirTemp("", "gpuctl-demo-"); err != nil {
					return err
				}
				defer os.RemoveAll(dataDir)
			} else if err := os.MkdirAll(dataDir, 0o755); err != nil {
				return err
			}
			opts.DataDir = dataDir
			logf, err := os.OpenFile(filepath.Join(dataDir, "demo.log"), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
			if err != nil {
				return err
			}
			defer logf.Close()
			opts.Log = slog.New(slog.NewTextHandler(logf, nil))
			ctx, stop := signal.NotifyContext(cmd.Context(), syscall.SIGINT, syscall.SIGTERM)
			defer stop()
			if !headless {
				fmt.Fprintf(cmd.ErrOrStderr(), "starting %d nodes in %s …\n", opts.Nodes, dataDir)
			}
			c, err := demo.Start(ctx, opts)
			if err != nil {
				return err
			}
			defer c.Stop()
			if sshf.listen != "" {
				addr, err := startSSHConsole(ctx, sshf, c.Server, dataDir, opts.Log)
				if err != nil {
					return err
				}
				fmt.Fprintf(cmd.ErrOrStderr(), "gpuctl console over ssh on %s\n", addr)
			}
			fmt.Fprintf(cmd.OutOrStdout(), "gpuctl demo ready config=%s\n", c.Config)
			// On stderr, so the ready line stays the one line scripts read.
			writeMetricsHelp(cmd.ErrOrStderr(), c, filepath.Join(binDir, "..", "deploy"))
			if headless {
				<-ctx.Done()
				return nil
			}
			if console.logFile == "" {
				console.logFile = filepath.Join(dataDir, "console.log")
			}
			return runConsole(ctx, console, c.Config)
		},
	}
	f := cmd.Flags()
	f.IntVar(&opts.Nodes, "nodes", opts.Nodes, "number of nodemon processes")
	f.BoolVar(&headless, "headless", false, "print the ready line and run until interrupted, without the console")
	console.add(f, false)
	sshf.register(f, "also serve the console over SSH on this TCP address")
	f.StringVar(&dataDir, "data-dir", "", "keep the cluster's state here (default: a temporary dir removed at exit)")
	f.StringVar(&opts.Sim, "sim", opts.Sim, "simulated host profile: dgx-h100, dgx-a100 or dgx-h200")
	f.StringVar(&opts.EBPF, "ebpf", opts.EBPF, "nodemon eBPF mode: auto, required or off")
	f.DurationVar(&opts.Lease, "lease", opts.Lease, "the server's lease: a node cut off from it longer stops its ranks (gpuctl serve --lease)")
	f.StringVar(&opts.Nodemon, "nodemon", "", "nodemon binary (default: next to gpuctl)")
	f.StringVar(&opts.Ringtrain, "ringtrain", "", "ringtrain binary (default: ../workload/build/ringtrain from gpuctl)")
	f.IntVar(&opts.ComputeMS, "compute-ms", opts.ComputeMS, "ringtrain compute time per step")
	f.IntVar(&opts.MetricsBasePort, "metrics-base-port", opts.MetricsBasePort,
		"Prometheus endpoints on 127.0.0.1: the server on this port, node i on port+1+i (0: none)")
	return cmd
}

// writeMetricsHelp says where Prometheus scrapes the demo and how to point
// Grafana at the shipped dashboard in deploy.
func writeMetricsHelp(w io.Writer, c *demo.Cluster, deploy string) {
	if c.MetricsAddr == "" {
		return
	}
	if abs, err := filepath.Abs(deploy); err == nil {
		deploy = abs
	}
	nodes := make([]string, 0, len(c.NodeNames))
	for _, n := range c.NodeNames {
		nodes = append(nodes, c.NodeMetricsAddrs[n])
	}
	fmt.Fprintf(w, "Prometheus metrics (path /metrics):\n  gpuctl serve  %s\n  nodemon       %s\n", c.MetricsAddr, strings.Join(nodes, " "))
	if _, err := os.Stat(filepath.Join(deploy, "prometheus.yml")); err != nil {
		fmt.Fprintln(w, "Scrape them with the prometheus.yml and targets/ of gpuctl's deploy/ folder.")
		return
	}
	fmt.Fprintf(w, "Scrape them: prometheus --config.file=%s (its targets/*.json list these addresses for --nodes 4;\n"+
		"  edit them for other sizes or ports)\n", filepath.Join(deploy, "prometheus.yml"))
	fmt.Fprintf(w, "Grafana: import %s, or start Grafana with\n"+
		"  GPUCTL_DEPLOY=%s GF_PATHS_PROVISIONING=%s grafana-server\n",
		filepath.Join(deploy, "grafana", "gpuctl.json"), deploy, filepath.Join(deploy, "grafana", "provisioning"))
}
