package main

import (
	"context"
	"fmt"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"

	"github.com/spf13/cobra"
	corev1 "k8s.io/api/core/v1"

	"github.com/gpuctl/gpuctl/api"
	"github.com/gpuctl/gpuctl/controlplane"
	"github.com/gpuctl/gpuctl/controlplane/kube"
	"github.com/gpuctl/gpuctl/controlplane/metrics"
	"github.com/gpuctl/gpuctl/controlplane/nodes"
	"github.com/gpuctl/gpuctl/logging"
	"github.com/gpuctl/gpuctl/scheduler"
	"github.com/gpuctl/gpuctl/scheduler/predict"
	"github.com/gpuctl/gpuctl/store"
)

func init() { subcommands = append(subcommands, newServeCmd) }

func newServeCmd() *cobra.Command {
	var (
		cfg               controlplane.Config
		logLevel, logFile string
		validate          string
		metricsAddr       string
		sshf              sshConsoleFlags
		restore           string
		runAsDefault      string
		haf               haFlags
		slurmTask         string
		kubeTask          string
		kubePullPolicy    string
		runtimeModel      string
		policyWeights     string
	)
	cmd := &cobra.Command{
		Use:   "serve",
		Short: "Run the control plane: accept nodemons and clients over QUIC",
		Long: `Run the control plane. On first start it creates the cluster CA, a server
certificate and admin.yaml (a client config with an admin certificate) in
--data-dir. Make join tokens for nodes with 'gpuctl token create'.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			log, closer, err := logging.New(logLevel, logFile)
			if err != nil {
				return err
			}
			defer closer.Close()
			cfg.Log = log
			cfg.Commit = buildCommit()
			cfg.ValidateCommand = strings.Fields(validate)
			cfg.Slurm.Task = strings.Fields(slurmTask)
			cfg.Kube.Spec.Task = strings.Fields(kubeTask)
			cfg.Kube.Spec.PullPolicy = corev1.PullPolicy(kubePullPolicy)
			cfg.RunAs.DefaultUser, cfg.RunAs.DefaultGroup, _ = strings.Cut(runAsDefault, ":")
			if runtimeModel != "" {
				m, err := readRuntimeModel(runtimeModel)
				if err != nil {
					return fmt.Errorf("serve: --runtime-model: %w", err)
				}
				cfg.Jobs.Runtimes = m
			}
			if policyWeights != "" {
				w, err := readPolicyWeights(policyWeights)
				if err != nil {
					return fmt.Errorf("serve: --policy-weights: %w", err)
				}
				cfg.PolicyWeights = &w
			}
			if restore != "" && !haf.enabled() {
				if err := restoreState(cmd, cfg.DataDir, restore); err != nil {
					return err
				}
			}
			ctx, stop := signal.NotifyContext(cmd.Context(), syscall.SIGINT, syscall.SIGTERM)
			defer stop()
			if w := controlplane.AdvertiseWarning(ctx, cfg.Listen, cfg.AdvertiseAddr); w != "" {
				log.Warn("no advertised address names the listen address", "listen", cfg.Listen, "advertise", cfg.AdvertiseAddr)
				fmt.Fprintln(cmd.ErrOrStderr(), "gpuctl serve: warning: "+w)
			}
			// What a serving (or, with etcd, leading) server adds beside
			// its QUIC port: metrics and the SSH console.
			extras := func(ctx context.Context, srv *controlplane.Server) error {
				if metricsAddr != "" {
					mx := metrics.New(srv, metrics.Options{})
					srv.SetObserver(mx)
					addr, err := mx.Serve(ctx, metricsAddr, log)
					if err != nil {
						return fmt.Errorf("serve: --metrics-addr: %w", err)
					}
					fmt.Fprintf(cmd.OutOrStdout(), "Prometheus metrics on http://%s/metrics\n", addr)
				}
				if sshf.listen != "" {
					addr, err := startSSHConsole(ctx, sshf, srv, cfg.DataDir, log)
					if err != nil {
						return err
					}
					fmt.Fprintf(cmd.OutOrStdout(), "gpuctl console over ssh on %s (tcp)\n", addr)
				}
				return nil
			}
			if haf.enabled() {
				if restore != "" {
					return fmt.Errorf("serve: --restore restores a bbolt file; an etcd store is restored with etcdutl snapshot restore")
				}
				return serveHA(ctx, cmd.OutOrStdout(), cfg, haf, log, extras)
			}
			if err := haf.check(); err != nil {
				return err
			}
			srv, err := controlplane.New(cfg)
			if err != nil {
				return err
			}
			if err := srv.Listen(ctx); err != nil {
				return err
			}
			fmt.Fprintf(cmd.OutOrStdout(), "gpuctl serve listening on %s (udp); admin config %s\n",
				srv.Addr(), controlplane.AdminConfigPath(cfg.DataDir))
			if err := extras(ctx, srv); err != nil {
				return err
			}
			return srv.Serve(ctx)
		},
	}
	f := cmd.Flags()
	f.StringVar(&cfg.DataDir, "data-dir", "/var/lib/gpuctl", "where the CA, the store and admin.yaml live")
	f.StringVar(&cfg.Listen, "listen", ":7443", "UDP address to listen on")
	f.StringSliceVar(&cfg.ExtraNames, "server-name", nil, "extra DNS name or IP for the server certificate (repeatable)")
	f.StringVar(&cfg.AdvertiseAddr, "advertise", "", "server address written into admin.yaml (default: the bound address); with --store etcd,\nthis server's address first, then the others', comma-separated: nodes and clients are sent to it when it leads")
	f.StringVar(&metricsAddr, "metrics-addr", "", "serve the cluster's Prometheus metrics on this TCP address, e.g. 127.0.0.1:9400")
	f.StringVar(&cfg.Policy, "policy", scheduler.DefaultPolicy, "scheduling policy: "+strings.Join(scheduler.PolicyNames(), ", "))
	f.StringVar(&policyWeights, "policy-weights", "", "the weights of --policy learned (gpuctl simulate train --policy-out)")
	f.StringVar(&runtimeModel, "runtime-model", "", "a runtime model (gpuctl simulate train) that gives jobs whose file names no estimated_runtime\nan expected runtime for sjf and backfill")
	f.StringVar(&cfg.CarbonIntensity, "carbon-intensity", "", "carbon-intensity curves by node label, gCO2e/kWh by UTC hour (format: docs/scheduling.md)")
	f.StringVar(&cfg.Hetero, "hetero", "", "allocate GPU models to jobs allowing several (gpu_models) by their throughput on each: max-throughput or max-min-fair;\nempty: such a job takes whichever of its models places it best")
	f.BoolVar(&cfg.CarbonAware, "carbon-aware", false, "hold deferrable jobs for cleaner hours or sites before their deadline (needs --carbon-intensity)")
	f.StringVar(&validate, "validate-command", "", "short all-reduce that nodes new to a recovering job run first, one rank per node\n(e.g. \"ringtrain --steps 3 --compute-ms 0 --bytes 1M\"); empty: NVML health only")
	f.StringVar(&runAsDefault, "run-as-default", "", "USER[:GROUP] the ranks of a job that names no user run as")
	f.StringSliceVar(&cfg.RunAs.OperatorUsers, "run-as-users", nil, "accounts operators may name in a job's user: (comma-separated; * any but root); admins may name any")
	f.StringSliceVar(&cfg.RunAs.OperatorGroups, "run-as-groups", nil, "groups operators may name in a job's group:")
	f.BoolVar(&cfg.RunAs.AllowRoot, "run-as-allow-root", false, "let admins (never operators) have ranks run as root")
	f.BoolVar(&cfg.RunAs.NodemonUser, "run-as-nodemon-user", false, "let operators submit jobs that name no user, run as nodemon's own user (one trust domain only)")
	f.StringVar(&cfg.Jobs.CheckpointRoot, "checkpoint-root", "", "where jobs that name no checkpoint dir checkpoint, <root>/<job> (default <data-dir>/checkpoints; give jobs that run as a user a root they can write)")
	f.DurationVar(&cfg.Lease, "lease", controlplane.DefaultLease, "how long nodes' ranks run on without word from the server: a node cut off longer stops them,\nand a lost node's job is relaunched once they are confirmed gone or the lease has passed (negative: no lease)")
	f.DurationVar(&cfg.Suspect.For, "suspect-for", nodes.DefaultSuspectPolicy.For, "how long a node a recovery lost takes no queued work (a recovery may still take it once its validation passes there)")
	f.DurationVar(&cfg.Suspect.Window, "suspect-window", nodes.DefaultSuspectPolicy.Window, "losses of one node within this window count toward --suspect-cordon-at")
	f.IntVar(&cfg.Suspect.CordonAt, "suspect-cordon-at", nodes.DefaultSuspectPolicy.CordonAt, "the loss within --suspect-window that cordons a node until an operator uncordons it")
	slow := scheduler.DefaultSlowRule()
	f.DurationVar(&cfg.Jobs.SlowRule.Hold, "slow-hold", slow.Hold, "how long a fail-slow finding stands before a job with slow_recovery auto is restarted without the slow node")
	f.IntVar(&cfg.Jobs.SlowRule.Max, "slow-max", slow.Max, "automatic slow exclusions per job within --slow-window; past them findings only alert (0: never)")
	f.DurationVar(&cfg.Jobs.SlowRule.Window, "slow-window", slow.Window, "the window --slow-max counts in")
	f.DurationVar(&cfg.BackupEvery, "backup-every", store.DefaultBackupEvery, "how often the store is backed up into <data-dir>/backups (and once more at a clean shutdown)")
	f.IntVar(&cfg.BackupKeep, "backup-keep", store.DefaultBackupKeep, "backups kept, newest first")
	f.StringVar(&restore, "restore", "", "put this backup in place of <data-dir>/state.db before starting (the replaced file is kept aside)")
	f.StringVar(&logLevel, "log-level", "info", "debug, info, warn or error")
	f.StringVar(&logFile, "log-file", "", "log to this file instead of stderr")
	sshf.register(f, "serve the console over SSH on this TCP address, e.g. :2222 (host key in --data-dir)")
	haf.register(cmd)
	f.StringVar(&cfg.Executor, "executor", "nodemon", "what runs the jobs' ranks: nodemon, slurm (sbatch/scancel/squeue; nodemon --slurm-node on every node still traces them) or kubernetes (pods gpuctl binds; nodemon --kube-node on every node traces and checkpoints them)")
	f.StringVar(&cfg.Kube.Kubeconfig, "kubeconfig", "", "with --executor kubernetes: the cluster's kubeconfig file (default: the pod's service account, running in the cluster)")
	f.StringVar(&cfg.Kube.Spec.Namespace, "namespace", "default", "with --executor kubernetes: the namespace of the jobs' Jobs, Services and pods")
	f.StringVar(&cfg.Kube.Spec.Image, "kube-image", "", "with --executor kubernetes: the image the pods run, holding nodemon (for kube-task) and the jobs' programs")
	f.StringVar(&kubePullPolicy, "kube-pull-policy", "IfNotPresent", "with --executor kubernetes: the pods' imagePullPolicy (Always, IfNotPresent, Never)")
	f.StringVar(&kubeTask, "kube-task", "nodemon kube-task", "with --executor kubernetes: the command each pod starts, before -- and the job's command")
	f.StringVar(&cfg.Kube.Spec.RunDir, "kube-run-dir", api.DefaultKubeRunDir, "with --executor kubernetes: the host directory the pods keep rank logs and exit status in (mounted at the same path; nodemon reads it)")
	f.StringVar(&cfg.Kube.Spec.GPUResource, "kube-gpu-resource", kube.GPUResource, "with --executor kubernetes: the extended resource each pod asks for per GPU (\"\": none)")
	f.BoolVar(&cfg.Kube.Spec.HostNetwork, "kube-host-network", true, "with --executor kubernetes: run the pods in their node's network, where MASTER_ADDR (rank 0's node) reaches them")
	f.DurationVar(&cfg.Kube.StopGrace, "kube-stop-grace", 30*time.Second, "with --executor kubernetes: the pods' grace period at a stop")
	f.StringVar(&cfg.Slurm.Placement, "slurm-placement", "gpuctl", "with --executor slurm: gpuctl (its scheduler places, Slurm gets --nodelist) or slurm (Slurm picks the nodes)")
	f.StringVar(&slurmTask, "slurm-task", "nodemon slurm-task", "with --executor slurm: the command srun runs as each task (on the Slurm nodes), before -- and the job's command")
	f.StringVar(&cfg.Slurm.RunDir, "slurm-run-dir", "/tmp/gpuctl-slurm", "with --executor slurm: where the tasks keep rank logs and exit status, and Slurm the job output (on the Slurm nodes)")
	f.StringVar(&cfg.Slurm.Partition, "slurm-partition", "", "with --executor slurm: sbatch --partition (default: Slurm's default partition)")
	f.StringVar(&cfg.Slurm.CLI.Bin, "slurm-bin", "", "with --executor slurm: directory holding sbatch, squeue, … (default: PATH)")
	f.DurationVar(&cfg.Slurm.Poll, "slurm-poll", time.Second, "with --executor slurm: how often squeue and sinfo are read")
	return cmd
}

// restoreState puts a backup in place of the data dir's state file.
func restoreState(cmd *cobra.Command, dataDir, backup string) error {
	aside, err := store.Restore(backup, controlplane.StatePath(dataDir), time.Now())
	if err != nil {
		return fmt.Errorf("serve --restore: %w", err)
	}
	fmt.Fprintf(cmd.ErrOrStderr(), "restored %s from %s", controlplane.StatePath(dataDir), backup)
	if aside != "" {
		fmt.Fprintf(cmd.ErrOrStderr(), "; the file it replaced is %s", aside)
	}
	fmt.Fprintln(cmd.ErrOrStderr())
	return nil
}

// readRuntimeModel reads a model written by `gpuctl simulate train`.
func readRuntimeModel(path string) (*predict.Model, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	m, err := predict.Read(f)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	return m, nil
}

// readPolicyWeights reads weights written by `gpuctl simulate train
// --policy-out`.
func readPolicyWeights(path string) (scheduler.ScoreWeights, error) {
	f, err := os.Open(path)
	if err != nil {
		return scheduler.ScoreWeights{}, err
	}
	defer f.Close()
	w, err := scheduler.ReadWeights(f)
	if err != nil {
		return scheduler.ScoreWeights{}, fmt.Errorf("%s: %w", path, err)
	}
	return w, nil
}
