package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"os/signal"
	"path/filepath"
	"syscall"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"
	"golang.org/x/term"

	"github.com/gpuctl/gpuctl/client"
	"github.com/gpuctl/gpuctl/logging"
	"github.com/gpuctl/gpuctl/transport"
	"github.com/gpuctl/gpuctl/tui"
)

func init() { subcommands = append(subcommands, newUICmd) }

// consoleFlags are the console's options, on `gpuctl`, `gpuctl ui` and
// `gpuctl demo`.
type consoleFlags struct {
	config   string
	readonly bool
	logFile  string
	start    string
}

func (f *consoleFlags) add(fs *pflag.FlagSet, withConfig bool) {
	if withConfig {
		fs.StringVar(&f.config, "config", "", "client config file (default $GPUCTL_CONFIG, then ~/.config/gpuctl/config.yaml)")
	}
	fs.BoolVar(&f.readonly, "readonly", false, "hide every action: look, change nothing")
	fs.StringVar(&f.logFile, "log-file", "", "console log file (default ~/.cache/gpuctl/console.log; the console never logs to the terminal)")
	fs.StringVar(&f.start, "view", "overview", "first view: overview, nodes, jobs, stalls, events, observe, plan")
}

func newUICmd() *cobra.Command {
	var f consoleFlags
	cmd := &cobra.Command{
		Use:   "ui",
		Short: "Open the operator console (the default when gpuctl runs without a subcommand)",
		Args:  cobra.NoArgs,
		RunE:  func(cmd *cobra.Command, _ []string) error { return runConsole(cmd.Context(), f, "") },
	}
	f.add(cmd.Flags(), true)
	return cmd
}

// runConsole opens the console against the server the config names (or
// configPath when set, as gpuctl demo does).
func runConsole(ctx context.Context, f consoleFlags, configPath string) error {
	if !term.IsTerminal(int(os.Stdout.Fd())) {
		return errors.New("the console needs a terminal; use the scripted commands (gpuctl nodes, jobs, …) in pipes and scripts")
	}
	path := configPath
	if path == "" {
		p, err := client.ConfigPath(f.config)
		if err != nil {
			return err
		}
		path = p
	}
	if _, _, err := transport.LoadClientConfig(path); err != nil {
		if errors.Is(err, os.ErrNotExist) {
			return fmt.Errorf("client config %s not found: pass --config, set $%s, or try `gpuctl demo`", path, client.EnvConfig)
		}
		return err
	}
	logFile := f.logFile
	if logFile == "" {
		dir, err := client.CacheDir()
		if err != nil {
			// No home: the log still goes somewhere private.
			dir = filepath.Join(os.TempDir(), "gpuctl")
			if err := os.MkdirAll(dir, 0o700); err != nil {
				return fmt.Errorf("console log dir: %w", err)
			}
		}
		logFile = filepath.Join(dir, "console.log")
	}
	log, closer, err := logging.New("info", logFile)
	if err != nil {
		return err
	}
	defer closer.Close()
	ctx, stop := signal.NotifyContext(ctx, syscall.SIGTERM)
	defer stop()
	for {
		err := followCluster(ctx, f, path, log)
		var sw tui.SwitchContext
		if !errors.As(err, &sw) {
			return err
		}
		// The choice lasts for this console; the file's current_context
		// stays (gpuctl config use-context changes that).
		previous := os.Getenv(transport.EnvContext)
		if err := os.Setenv(transport.EnvContext, sw.Name); err != nil {
			return fmt.Errorf("follow context %q: %w", sw.Name, err)
		}
		log.Info("console follows another context", "from", previous, "to", sw.Name)
	}
}

// followCluster runs the console on the cluster the client config (and
// $GPUCTL_CONTEXT) names until the operator quits or picks another.
func followCluster(ctx context.Context, f consoleFlags, path string, log *slog.Logger) error {
	_, id, err := transport.LoadClientConfig(path)
	if err != nil {
		return err
	}
	list, current, err := transport.Contexts(path)
	if err != nil {
		return err
	}
	cl, err := client.Dial(ctx, path)
	if err != nil {
		if current != "" {
			return fmt.Errorf("context %q: %w (gpuctl --context NAME opens the console on another)", current, err)
		}
		return err
	}
	defer cl.Close()
	log.Info("console start", "server", path, "context", current, "user", id.Name, "role", string(id.Role), "readonly", f.readonly)
	return tui.Run(ctx, cl, tui.Options{Role: id.Role, User: id.Name, ReadOnly: f.readonly, Start: f.start, Log: log,
		Contexts: list, Cluster: current})
}
