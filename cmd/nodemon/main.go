// Command nodemon is gpuctl's agent on every GPU host: it samples NVML,
// traces NCCL calls and flows with eBPF, streams them to gpuctl serve over
// QUIC, and launches and signals the job's ranks on its host.
package main

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/signal"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"github.com/spf13/cobra"
	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"

	"github.com/gpuctl/gpuctl/agent"
	"github.com/gpuctl/gpuctl/agent/deviceplugin"
	"github.com/gpuctl/gpuctl/logging"
	"github.com/gpuctl/gpuctl/workload"
)

func main() {
	if err := newRootCmd().Execute(); err != nil {
		fmt.Fprintln(os.Stderr, "nodemon:", err)
		os.Exit(1)
	}
}

func newRootCmd() *cobra.Command { return rootCmd(runNodemon) }

// options are nodemon's flags.
type options struct {
	cfg                agent.Config
	token, tokenFile   string
	sim, ebpf, metrics string
	scope, profiler    string
	labels             []string
	logLevel, logFile  string
	devicePluginDir    string
}

// rootCmd is nodemon's command with its flags bound, running run.
func rootCmd(run func(o *options) error) *cobra.Command {
	o := &options{}
	cmd := &cobra.Command{
		Use:           "nodemon --server ADDR[,ADDR...] [--token TOKEN] [--sim dgx-h100]",
		Short:         "gpuctl's node agent: GPU telemetry, NCCL tracing and rank execution",
		SilenceUsage:  true,
		SilenceErrors: true,
		Args:          cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			var err error
			if o.cfg.Token, err = readToken(o.token, o.tokenFile, cmd.InOrStdin()); err != nil {
				return err
			}
			return run(o)
		},
	}
	cfg := &o.cfg
	f := cmd.Flags()
	f.StringVar(&cfg.Server, "server", "", "UDP address of gpuctl serve (host:port); for a highly available control plane, every server's,\ncomma-separated (a:7443,b:7443,c:7443): nodemon finds the leader and follows it")
	f.StringVar(&o.token, "token", "", "join token from `gpuctl token create` (first start only); - reads it from stdin.\nPrefer --token-file or -: a token on the command line shows in ps")
	f.StringVar(&o.tokenFile, "token-file", "", "read the join token from this file (first start only)")
	f.StringVar(&cfg.Name, "name", "", "node name (default: host name)")
	f.StringVar(&cfg.DataDir, "data-dir", "/var/lib/nodemon", "where the node identity and rank logs are kept")
	f.StringVar(&o.sim, "sim", "", "simulate the GPUs of a host: dgx-h100, dgx-a100 or dgx-h200 (default: real NVML)")
	f.DurationVar(&cfg.Interval, "interval", time.Second, "GPU sampling interval")
	f.DurationVar(&cfg.Heartbeat, "heartbeat", time.Second, "heartbeat interval; the server marks the node down after two missed")
	f.StringSliceVar(&o.labels, "label", nil, "topology label KEY=VALUE (repeatable), e.g. --label rack=r1 --label switch=s1")
	f.StringVar(&o.ebpf, "ebpf", "auto", "eBPF tracing: auto (use where the kernel allows), required, or off")
	f.StringVar(&o.profiler, "nccl-profiler", "auto", "gpuctl's NCCL profiler plugin, which reports when each collective's work completes on the GPU (NCCL 2.25+):\na path, auto (libnccl-profiler-gpuctl.so beside nodemon, if there), or off; given to ranks as NCCL_PROFILER_PLUGIN unless they set their own")
	f.StringVar(&o.scope, "trace-scope", "host", "trace every NCCL process on the host, or only the ranks nodemon launched for this node (node; for hosts shared by several nodemons)")
	f.StringVar(&o.metrics, "metrics-addr", "", "serve Prometheus metrics on this TCP address, e.g. 127.0.0.1:9400")
	f.StringVar(&o.logLevel, "log-level", "info", "debug, info, warn or error")
	f.StringVar(&o.logFile, "log-file", "", "log to this file instead of stderr")
	f.Int64Var(&cfg.LogMaxBytes, "rank-log-max-bytes", agent.DefaultLogMaxBytes, "rotate a rank's log past this size")
	f.IntVar(&cfg.LogKeep, "rank-log-keep", agent.DefaultLogKeep, "rotated files kept of each rank's log")
	f.StringVar(&cfg.CgroupRoot, "cgroup-root", agent.DefaultCgroupRoot, "cgroup v2 mount where each job's ranks get a cgroup (gpuctl/<job>/rank-<R>), or off")
	f.StringVar(&cfg.PeerListen, "peer-listen", "", "UDP host:port where other nodes ask this one to vouch for their ranks while no server answers (default: all addresses, on the port used last time or a free one); off: none, and ranks here stop when no server answers for a lease")
	f.StringVar(&cfg.PeerAdvertise, "peer-advertise", "", "the host:port other nodes dial for --peer-listen (default: its host, or this host's address toward the server)")
	f.StringVar(&cfg.SlurmNode, "slurm-node", "", "this node's Slurm name (usually --name): report the Slurm tasks on it (SLURMD_NODENAME) as ranks, for gpuctl serve --executor slurm and plain sbatch jobs")
	f.StringVar(&cfg.KubeNode, "kube-node", "", "this node's Kubernetes Node name (usually --name): report the ranks of gpuctl's pods on it as this node's, for gpuctl serve --executor kubernetes")
	f.StringVar(&o.devicePluginDir, "device-plugin-dir", "", "serve kubelet's device plugin API for this host's GPUs as "+deviceplugin.ResourceName+" in this directory\n(kubelet's is "+pluginapi.DevicePluginPath+"); default: off")
	f.BoolVar(&cfg.AllowRootRanks, "allow-root-ranks", false, "let ranks run as root (a job that names no user while nodemon runs as root, or names root); refused without it")
	cmd.AddCommand(newShimCmd(), newSlurmTaskCmd(), newKubeTaskCmd())
	return cmd
}

// runNodemon opens the probes and runs the agent until SIGINT or SIGTERM.
func runNodemon(o *options) error {
	log, closer, err := logging.New(o.logLevel, o.logFile)
	if err != nil {
		return err
	}
	defer closer.Close()
	cfg := o.cfg
	cfg.Log = log
	if cfg.Labels, err = parseLabels(o.labels); err != nil {
		return err
	}
	mode := agent.EBPFMode(o.ebpf)
	switch mode {
	case agent.EBPFAuto, agent.EBPFRequired, agent.EBPFOff:
	default:
		return fmt.Errorf("--ebpf %q: use auto, required or off", o.ebpf)
	}
	if cfg.Name == "" {
		cfg.Name, _ = os.Hostname()
	}
	if o.scope != "host" && o.scope != "node" {
		return fmt.Errorf("--trace-scope %q: use host or node", o.scope)
	}
	popts := agent.ProbeOptions{Node: cfg.Name, Sim: o.sim, EBPF: mode, OnlyLaunched: o.scope == "node"}
	if o.sim != "" {
		// Simulated GPUs are busy while the ranks report kernel time, so
		// a rank waiting on its "kernel" need not spin a CPU.
		popts.SimKernelDir = filepath.Join(cfg.DataDir, "sim-kernels")
	}
	if popts.NCCLProfiler, err = profilerPath(o.profiler); err != nil {
		return err
	}
	probes, err := agent.OpenProbes(popts, log)
	if err != nil {
		return err
	}
	defer probes.Close()
	var plugin *deviceplugin.Plugin
	if o.devicePluginDir != "" {
		if plugin, err = devicePlugin(o.devicePluginDir, probes, log); err != nil {
			return err
		}
		cfg.OnEvent = plugin.Observe
	}
	a, err := agent.New(cfg, probes)
	if err != nil {
		return err
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	pluginErr := make(chan error, 1)
	if plugin != nil {
		go func() {
			err := plugin.Run(ctx)
			if err != nil {
				// No kubelet can use these GPUs: nodemon ends rather than
				// run as if it served them.
				stop()
			}
			pluginErr <- err
		}()
	}
	if o.metrics != "" {
		// Bound before the agent runs, so a taken port is an error at
		// start rather than a log line nobody reads.
		ln, err := net.Listen("tcp", o.metrics)
		if err != nil {
			return fmt.Errorf("--metrics-addr: %w", err)
		}
		srv := &http.Server{Handler: a.MetricsHandler(), ReadHeaderTimeout: 5 * time.Second}
		go func() {
			if err := srv.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
				log.Error("metrics endpoint", "addr", o.metrics, "err", err)
			}
		}()
		defer srv.Close()
		log.Info("serving Prometheus metrics", "addr", ln.Addr().String())
	}
	err = a.Run(ctx)
	if plugin != nil {
		stop()
		if perr := <-pluginErr; perr != nil {
			return fmt.Errorf("--device-plugin-dir: %w", perr)
		}
	}
	return err
}

// devicePlugin makes the kubelet device plugin of the probes' GPUs.
func devicePlugin(dir string, probes *agent.Probes, log *slog.Logger) (*deviceplugin.Plugin, error) {
	infos, err := probes.GPUs()
	if err != nil {
		return nil, fmt.Errorf("--device-plugin-dir: list the GPUs: %w", err)
	}
	root := "/"
	if probes.Simulated() {
		root = ""
	}
	gpus, shared := deviceplugin.GPUsOf(infos, root)
	p, err := deviceplugin.New(deviceplugin.Config{Dir: dir, GPUs: gpus, Shared: shared, Log: log})
	if err != nil {
		return nil, fmt.Errorf("--device-plugin-dir: %w", err)
	}
	return p, nil
}

// newShimCmd is the process nodemon runs each rank under (see
// agent.RunShim); it is not meant to be run by hand.
func newShimCmd() *cobra.Command {
	return &cobra.Command{
		Use:                agent.ShimCommand + " --log FILE --status FILE -- COMMAND [ARG...]",
		Short:              "run one rank: copy its output into a rotating log and record its exit status (nodemon runs this)",
		Hidden:             true,
		DisableFlagParsing: true,
		SilenceUsage:       true,
		SilenceErrors:      true,
		RunE: func(cmd *cobra.Command, args []string) error {
			if code := agent.RunShim(args, os.Stderr); code != 0 {
				os.Exit(code)
			}
			return nil
		},
	}
}

// newSlurmTaskCmd is what Slurm runs as each task of a job gpuctl
// submitted (agent.RunSlurmTask).
func newSlurmTaskCmd() *cobra.Command {
	return &cobra.Command{
		Use:                agent.SlurmTaskCommand + " [--run-dir DIR] -- COMMAND [ARG...]",
		Short:              "run one rank of a Slurm job gpuctl submitted, with gpuctl's rank environment (srun runs this)",
		Hidden:             true,
		DisableFlagParsing: true,
		SilenceUsage:       true,
		SilenceErrors:      true,
		RunE: func(cmd *cobra.Command, args []string) error {
			os.Exit(agent.RunSlurmTask(args, os.Stderr))
			return nil
		},
	}
}

// newKubeTaskCmd is what each pod of a job gpuctl runs on Kubernetes
// starts (agent.RunKubeTask).
func newKubeTaskCmd() *cobra.Command {
	return &cobra.Command{
		Use:                agent.KubeTaskCommand + " -- COMMAND [ARG...]",
		Short:              "run one rank of a job gpuctl runs on Kubernetes, with gpuctl's rank environment (its pod runs this)",
		Hidden:             true,
		DisableFlagParsing: true,
		SilenceUsage:       true,
		SilenceErrors:      true,
		RunE: func(cmd *cobra.Command, args []string) error {
			os.Exit(agent.RunKubeTask(args, os.Stderr))
			return nil
		},
	}
}

func parseLabels(in []string) (map[string]string, error) {
	out := map[string]string{}
	for _, l := range in {
		k, v, ok := strings.Cut(l, "=")
		if !ok || k == "" {
			return nil, fmt.Errorf("--label %q: want KEY=VALUE", l)
		}
		out[k] = v
	}
	return out, nil
}

// readToken returns the join token from --token (the token, or - for
// stdin) or --token-file, whichever is given; surrounding space (a
// trailing newline from echo or a file) is dropped.
func readToken(token, file string, stdin io.Reader) (string, error) {
	if token != "" && file != "" {
		return "", errors.New("--token and --token-file both give the join token: pass one")
	}
	var data []byte
	switch {
	case file != "":
		var err error
		if data, err = os.ReadFile(file); err != nil {
			return "", fmt.Errorf("--token-file: %w", err)
		}
	case token == "-":
		// A token is one line; stop there, so a pipe left open cannot hang.
		line, err := bufio.NewReader(io.LimitReader(stdin, 4096)).ReadString('\n')
		if err != nil && !errors.Is(err, io.EOF) {
			return "", fmt.Errorf("--token -: read stdin: %w", err)
		}
		data = []byte(line)
	default:
		return token, nil
	}
	t := strings.TrimSpace(string(data))
	if t == "" {
		src := "stdin"
		if file != "" {
			src = file
		}
		return "", fmt.Errorf("join token: %s is empty: put the output of `gpuctl token create` there", src)
	}
	return t, nil
}

// profilerPath resolves --nccl-profiler: "" for off, the plugin beside
// nodemon's executable for auto (none there is no error: tracing keeps to
// the calls), else the path given, which must exist.
func profilerPath(flag string) (string, error) {
	switch flag {
	case "off", "":
		return "", nil
	case "auto":
		exe, err := os.Executable()
		if err != nil {
			return "", nil
		}
		p := filepath.Join(filepath.Dir(exe), workload.ProfilerName)
		if _, err := os.Stat(p); err != nil {
			return "", nil
		}
		return p, nil
	}
	p, err := filepath.Abs(flag)
	if err == nil {
		_, err = os.Stat(p)
	}
	if err != nil {
		return "", fmt.Errorf("--nccl-profiler %s: %w (give the path of %s, built by `make workload`, or off)", flag, err, workload.ProfilerName)
	}
	return p, nil
}
