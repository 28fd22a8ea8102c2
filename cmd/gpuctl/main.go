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
	root := &cobra.Command{
		Use:           "gpuctl",
		Short:         "Console for GPU training clusters: observe, place, recover",
		SilenceUsage:  true,
		SilenceErrors: true,
	}
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
