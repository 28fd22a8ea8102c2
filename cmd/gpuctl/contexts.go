package main

import (
	"fmt"
	"os"

	"github.com/spf13/cobra"

	"github.com/gpuctl/gpuctl/client"
	"github.com/gpuctl/gpuctl/transport"
	"github.com/gpuctl/gpuctl/views"
)

func init() { subcommands = append(subcommands, newConfigCmd) }

// newConfigCmd edits the client config's contexts, as kubectl config does.
func newConfigCmd() *cobra.Command {
	var config string
	cmd := &cobra.Command{
		Use:   "config",
		Short: "The client config's clusters: list them, pick one, add one",
		Long: `A client config may list several clusters as contexts (each a whole client
config with a name) and the one in use (current_context). Every command takes
--context NAME (or $GPUCTL_CONTEXT) to use another for that command.`,
		Args: cobra.NoArgs,
	}
	cmd.PersistentFlags().StringVar(&config, "config", "", "client config file (default $GPUCTL_CONFIG, then ~/.config/gpuctl/config.yaml)")
	path := func() (string, error) { return client.ConfigPath(config) }

	get := &cobra.Command{
		Use:   "get-contexts",
		Short: "List the contexts, the current one marked *",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			p, err := path()
			if err != nil {
				return err
			}
			list, current, err := transport.Contexts(p)
			if err != nil {
				return err
			}
			return views.Contexts(cmd.OutOrStdout(), p, list, current)
		},
	}
	use := &cobra.Command{
		Use:   "use-context NAME",
		Short: "Make NAME the context every command uses",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			p, err := path()
			if err != nil {
				return err
			}
			if err := transport.UseContext(p, args[0]); err != nil {
				return err
			}
			fmt.Fprintf(cmd.OutOrStdout(), "switched to context %q\n", args[0])
			if env := os.Getenv(transport.EnvContext); env != "" && env != args[0] {
				fmt.Fprintf(cmd.ErrOrStderr(), "note: $%s=%s still picks %q for commands run with it\n", transport.EnvContext, env, env)
			}
			return nil
		},
	}
	var from string
	add := &cobra.Command{
		Use:   "add-context NAME --from FILE",
		Short: "Add a cluster's client config (e.g. its admin.yaml) as context NAME",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			if from == "" {
				return fmt.Errorf("--from FILE is required: a client config of the cluster (gpuctl serve writes admin.yaml)")
			}
			p, err := path()
			if err != nil {
				return err
			}
			if err := transport.AddContext(p, args[0], from); err != nil {
				return err
			}
			fmt.Fprintf(cmd.OutOrStdout(), "added context %q to %s\n", args[0], p)
			return nil
		},
	}
	add.Flags().StringVar(&from, "from", "", "the cluster's client config")
	cmd.AddCommand(get, use, add)
	return cmd
}
