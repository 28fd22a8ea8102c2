package main

import (
	"context"
	"fmt"
	"io"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/gpuctl/gpuctl/api"
	"github.com/gpuctl/gpuctl/client"
	"github.com/gpuctl/gpuctl/views"
)

func init() { subcommands = append(subcommands, newTokenCmd, newFaultCmd) }

func newTokenCmd() *cobra.Command {
	cmd := &cobra.Command{Use: "token", Short: "Manage join tokens for nodes: create, list, revoke"}
	var (
		config, description string
		ttl                 time.Duration
		uses                int
	)
	create := &cobra.Command{
		Use:   "create",
		Short: "Make a join token: nodemon --server ADDR --token TOKEN",
		Long: `create makes a join token. It admits one node unless --uses allows more, and
expires after --ttl. The server keeps its id, never the token: 'gpuctl token list'
shows who used it, 'gpuctl token revoke ID' ends it early.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if ttl <= 0 {
				return fmt.Errorf("token create: --ttl %s is not positive: give how long the token may be used, e.g. --ttl 1h", ttl)
			}
			if uses < 1 {
				return fmt.Errorf("token create: --uses %d: give how many nodes may join with it (1 or more)", uses)
			}
			return withClient(cmd, config, func(c *client.Client) error {
				tok, rec, err := c.CreateJoinToken(cmd.Context(), client.TokenOptions{TTL: ttl, Uses: uses, Description: description})
				if err != nil {
					return err
				}
				fmt.Fprintln(cmd.OutOrStdout(), tok)
				fmt.Fprintf(cmd.ErrOrStderr(), "token %s: %d join(s), valid until %s\n", rec.GetId(), rec.GetUses(),
					time.Unix(0, rec.GetExpiresUnixNano()).Format(time.RFC3339))
				return nil
			})
		},
	}
	addConfigFlag(create, &config)
	create.Flags().DurationVar(&ttl, "ttl", 24*time.Hour, "how long the token is valid")
	create.Flags().IntVar(&uses, "uses", 1, "how many nodes may join with it")
	create.Flags().StringVar(&description, "description", "", "what the token is for, shown in `gpuctl token list`")

	var v viewFlags
	list := &cobra.Command{
		Use:   "list",
		Short: "List join tokens: state, uses, expiry, the nodes that joined with them",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			return v.run(cmd, func(ctx context.Context, c *client.Client, w io.Writer, o views.Options) error {
				toks, err := c.ListTokens(ctx)
				if err != nil {
					return err
				}
				return views.Tokens(w, o, toks)
			})
		},
	}
	v.add(list)

	var revokeConfig string
	revoke := &cobra.Command{
		Use:   "revoke ID",
		Short: "Revoke a join token (by the id `gpuctl token list` shows, or the whole token)",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			return withClient(cmd, revokeConfig, func(c *client.Client) error {
				rec, err := c.RevokeToken(cmd.Context(), args[0])
				if err != nil {
					return err
				}
				_, err = fmt.Fprintf(cmd.OutOrStdout(), "token %s revoked (%d of %d joins were used)\n", rec.GetId(), len(rec.GetUsed()), max(rec.GetUses(), 1))
				return err
			})
		},
	}
	addConfigFlag(revoke, &revokeConfig)
	cmd.AddCommand(create, list, revoke)
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

// hangWhere is where `gpuctl fault NODE hang --where` stops the rank.
var hangWhere = map[string]api.FaultKind{
	"inside":  api.FaultKind_FAULT_KIND_HANG_INSIDE,
	"outside": api.FaultKind_FAULT_KIND_HANG_OUTSIDE,
}

func newFaultCmd() *cobra.Command {
	var (
		config string
		gpu    int32
		where  string
	)
	cmd := &cobra.Command{
		Use:   "fault NODE KIND",
		Short: "Inject a GPU fault into a simulated node (xid79, xid48, ecc, thermal, gpu-lost, hang, clear)",
		Long: "Inject a GPU fault into a simulated node (nodemon --sim).\n\n" +
			"hang stops the rank on the GPU until clear: --where inside a collective (it never returns; its peers finish it)\n" +
			"or outside (it waits between steps, so its peers wait in the next collective).",
		Args: cobra.ExactArgs(2),
		RunE: func(cmd *cobra.Command, args []string) error {
			kind, ok := faultKinds[strings.ToLower(args[1])]
			if strings.ToLower(args[1]) == "hang" {
				if kind, ok = hangWhere[strings.ToLower(where)]; !ok {
					return fmt.Errorf("hang --where %q: use inside (in a collective) or outside (between collectives)", where)
				}
			} else if cmd.Flags().Changed("where") {
				return fmt.Errorf("--where is for hang, not %s", args[1])
			}
			if !ok {
				return fmt.Errorf("unknown fault %q: use xid79, xid48, ecc, thermal, gpu-lost, hang or clear", args[1])
			}
			return withClient(cmd, config, func(c *client.Client) error {
				return c.InjectFault(cmd.Context(), args[0], &api.InjectFault{GpuIndex: gpu, Kind: kind})
			})
		},
	}
	addConfigFlag(cmd, &config)
	cmd.Flags().Int32Var(&gpu, "gpu", 0, "GPU index")
	cmd.Flags().StringVar(&where, "where", "inside", "hang: inside a collective or outside (between collectives)")
	return cmd
}
