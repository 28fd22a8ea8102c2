package main

import (
	"context"
	"fmt"
	"time"

	"github.com/spf13/cobra"

	"github.com/gpuctl/gpuctl/client"
	"github.com/gpuctl/gpuctl/views"
)

func init() { subcommands = append(subcommands, newStatusCmd) }

func newStatusCmd() *cobra.Command {
	var config, output string
	cmd := &cobra.Command{
		Use:   "status",
		Short: "Show which server leads the control plane, since when, and the store's health",
		Long: `Show the control plane's servers (leader and standbys, since when), the
store (bbolt, or etcd with each member's health) and the recent leadership
changes. A standby answers too, so status works while no leader is elected.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			f, err := views.ParseFormat(output)
			if err != nil {
				return err
			}
			ctx, cancel := context.WithTimeout(cmd.Context(), 15*time.Second)
			defer cancel()
			path, err := client.ConfigPath(config)
			if err != nil {
				return err
			}
			c, err := client.Dial(ctx, path)
			if err != nil {
				return err
			}
			defer c.Close()
			r, err := c.Status(ctx)
			if err != nil {
				return fmt.Errorf("status: %w", err)
			}
			return views.Status(cmd.OutOrStdout(), views.Options{Format: f, Stderr: cmd.ErrOrStderr()}, r)
		},
	}
	addConfigFlag(cmd, &config)
	cmd.Flags().StringVarP(&output, "output", "o", "table", "output format: table or json")
	return cmd
}
