package main

import (
	"fmt"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/gpuctl/gpuctl/api"
	"github.com/gpuctl/gpuctl/client"
)

func init() { subcommands = append(subcommands, newTokenCmd, newFaultCmd) }

func newTokenCmd() *cobra.Command {
	cmd := &cobra.Command{Use: "token", Short: "Manage join tokens for nodes"}
	var (
		config string
		ttl    time.Duration
	)
	create := &cobra.Command{
		Use:   "create",
		Short: "Make a join token: nodemon --server ADDR --token TOKEN",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			return withClient(cmd, config, func(c *client.Client) error {
				tok, exp, err := c.CreateToken(cmd.Context(), ttl)
				if err != nil {
					return err
				}
				fmt.Fprintln(cmd.OutOrStdout(), tok)
				fmt.Fprintf(cmd.ErrOrStderr(), "valid until %s\n", exp.Format(time.RFC3339))
				return nil
			})
		},
	}
	addConfigFlag(create, &config)
	create.Flags().DurationVar(&ttl, "ttl", 24*time.Hour, "how long the token is valid")
	cmd.AddCommand(create)
	return cmd
}

var faultKinds = map[string]api.FaultKind{
	"xid79":    api.FaultKind_FAULT_KIND_XID79,
	"xid48":    api.FaultKind_FAULT_KIND_XID48,
	"ecc":      api.FaultKind_FAULT_KIND_ECC_UNCORRECTABLE,
	"thermal":  api.FaultKind_FAULT_KIND_THERMAL,
	"gpu-lost": api.FaultKind_FAULT_KIND_GPU_LOST,
	"clear":    api.FaultKind_FAULT_KIND_CLEAR,
}

func newFaultCmd() *cobra.Command {
	var (
		config string
		gpu    int32
	)
	cmd := &cobra.Command{
		Use:   "fault NODE KIND",
		Short: "Inject a GPU fault into a simulated node (xid79, xid48, ecc, thermal, gpu-lost, clear)",
		Args:  cobra.ExactArgs(2),
		RunE: func(cmd *cobra.Command, args []string) error {
			kind, ok := faultKinds[strings.ToLower(args[1])]
			if !ok {
				return fmt.Errorf("unknown fault %q: use xid79, xid48, ecc, thermal, gpu-lost or clear", args[1])
			}
			return withClient(cmd, config, func(c *client.Client) error {
				return c.InjectFault(cmd.Context(), args[0], &api.InjectFault{GpuIndex: gpu, Kind: kind})
			})
		},
	}
	addConfigFlag(cmd, &config)
	cmd.Flags().Int32Var(&gpu, "gpu", 0, "GPU index")
	return cmd
}
