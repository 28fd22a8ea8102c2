// Command gpuctl is the operator's console for GPU training clusters: the
// control plane (gpuctl serve), the embedded demo and the scripted views.
package main

import (
	"fmt"
	"os"

	"github.com/spf13/cobra"
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
	console.add(root.Flags(), true)
	for _, mk := range subcommands {
		root.AddCommand(mk())
	}
	return root
}

func main() {
	if err := newRootCmd().Execute(); err != nil {
		fmt.Fprintln(os.Stderr, "gpuctl:", err)
		os.Exit(1)
	}
}
