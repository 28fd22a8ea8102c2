// Command gpuctl is the operator's console for GPU training clusters: the
// control plane (gpuctl serve), the embedded demo and the scripted views.
package main

import (
	"fmt"
	"os"
	"runtime/pprof"
	"strconv"
	"strings"

	"github.com/spf13/cobra"

	"github.com/gpuctl/gpuctl/transport"
)

// subcommands collects the constructors of gpuctl's subcommands; each file
// of this package adds its own in init, so commands stay independent.
var subcommands []func() *cobra.Command

// newRootCmd is gpuctl with every subcommand, its flags fresh.
func newRootCmd() *cobra.Command {
	var console consoleFlags
	root := &cobra.Command{
		Use:   "gpuctl",
		Short: "Console for GPU training clusters: observe, place, recover",
		Long: `gpuctl without a subcommand opens the operator console against the server
of --config ($GPUCTL_CONFIG, ~/.config/gpuctl/config.yaml); the subcommands
are the same views and actions for scripts.`,
		Args:          cobra.NoArgs,
		SilenceUsage:  true,
		SilenceErrors: true,
		RunE:          func(cmd *cobra.Command, _ []string) error { return runConsole(cmd.Context(), console, "") },
	}
	var context string
	root.PersistentFlags().StringVar(&context, "context", "", "the client config's context (cluster) to use (default $GPUCTL_CONTEXT, then its current_context)")
	root.PersistentPreRun = func(*cobra.Command, []string) {
		// Every dial reads the context from the environment, so the flag
		// reaches them all, the console's included.
		if context != "" {
			os.Setenv(transport.EnvContext, context)
		}
	}
	console.add(root.Flags(), true)
	for _, mk := range subcommands {
		root.AddCommand(mk())
	}
	return root
}

func main() {
	stop := profileCPU(os.Getenv("GPUCTL_CPUPROFILE"))
	err := newRootCmd().Execute()
	stop()
	if err != nil {
		fmt.Fprintln(os.Stderr, "gpuctl:", err)
		os.Exit(1)
	}
}

// profileCPU writes a CPU profile of the whole run to path (go tool pprof
// reads it) when path is set: how to see where a loaded server's time
// goes. A %p in path is the process id, so that a command and the gpuctl
// processes it starts (bench swarm's server) write a file each. The
// profile is complete once the command returns (serve: on SIGINT or
// SIGTERM).
func profileCPU(path string) (stop func()) {
	if path == "" {
		return func() {}
	}
	path = strings.ReplaceAll(path, "%p", strconv.Itoa(os.Getpid()))
	f, err := os.Create(path)
	if err == nil {
		err = pprof.StartCPUProfile(f)
	}
	if err != nil {
		fmt.Fprintf(os.Stderr, "gpuctl: GPUCTL_CPUPROFILE=%s: %v (running without a profile)\n", path, err)
		return func() {}
	}
	return func() {
		pprof.StopCPUProfile()
		f.Close()
	}
}
