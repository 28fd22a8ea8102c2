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
	"xid79":     api.FaultKind_FAULT_KIND_XID79,
	"xid48":     api.FaultKind_FAULT_KIND_XID48,
	"ecc":       api.FaultKind_FAULT_KIND_ECC_UNCORRECTABLE,
	"thermal":   api.FaultKind_FAULT_KIND_THERMAL,
	"gpu-lost":  api.FaultKind_FAULT_KIND_GPU_LOST,
	"slow":      api.FaultKind_FAULT_KIND_SLOW,
	"link-slow": api.FaultKind_FAULT_KIND_LINK_SLOW,
	"clear":     api.FaultKind_FAULT_KIND_CLEAR,
}

// faultRequest is the fault a `gpuctl fault` command line asks for;
// where and factor count only when set (whereSet, factorSet).
func faultRequest(kindArg string, gpu int32, where string, whereSet bool, factor float64, factorSet bool) (*api.InjectFault, error) {
	name := strings.ToLower(kindArg)
	kind, ok := faultKinds[name]
	if name == "hang" {
		if kind, ok = hangWhere[strings.ToLower(where)]; !ok {
			return nil, fmt.Errorf("hang --where %q: use inside (in a collective) or outside (between collectives)", where)
		}
	} else if whereSet {
		return nil, fmt.Errorf("--where is for hang, not %s", kindArg)
	}
	if !ok {
		return nil, fmt.Errorf("unknown fault %q: use xid79, xid48, ecc, thermal, gpu-lost, slow, link-slow, hang or clear", kindArg)
	}
	slow := kind == api.FaultKind_FAULT_KIND_SLOW || kind == api.FaultKind_FAULT_KIND_LINK_SLOW
	switch {
	case slow && !factorSet:
		return nil, fmt.Errorf("fault %s needs --factor, the share of full speed kept (e.g. --factor 0.7)", kindArg)
	case slow && !(factor > 0 && factor <= 1):
		return nil, fmt.Errorf("--factor %g: give the share of full speed kept, in (0, 1] (e.g. 0.7 for 70%%)", factor)
	case !slow && factorSet:
		return nil, fmt.Errorf("--factor is for slow and link-slow, not %s", kindArg)
	}
	return &api.InjectFault{GpuIndex: gpu, Kind: kind, Factor: factor}, nil
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
		factor float64
	)
	cmd := &cobra.Command{
		Use:   "fault NODE KIND",
		Short: "Inject a fault into a simulated node (xid79, xid48, ecc, thermal, gpu-lost, slow, link-slow, hang, clear)",
		Long: `Inject a fault into a simulated node (nodemon --sim).

  slow --gpu N --factor F   GPU N runs at F of its speed: its clocks drop and its
                            ranks take 1/F as long to compute
  link-slow --factor F      the node's NCCL transfers (reference library) run at
                            F of their speed
  hang --gpu N --where W    the rank on GPU N stops until clear: inside a collective
                            (it never returns; its peers finish it) or outside
                            (it waits between steps; its peers wait in the next one)
  clear                     ends every fault of the GPU, and a slow link`,
		Args: cobra.ExactArgs(2),
		RunE: func(cmd *cobra.Command, args []string) error {
			f, err := faultRequest(args[1], gpu, where, cmd.Flags().Changed("where"), factor, cmd.Flags().Changed("factor"))
			if err != nil {
				return err
			}
			return withClient(cmd, config, func(c *client.Client) error {
				return c.InjectFault(cmd.Context(), args[0], f)
			})
		},
	}
	addConfigFlag(cmd, &config)
	cmd.Flags().Int32Var(&gpu, "gpu", 0, "GPU index")
	cmd.Flags().StringVar(&where, "where", "inside", "hang: inside a collective or outside (between collectives)")
	cmd.Flags().Float64Var(&factor, "factor", 0, "slow, link-slow: the share of full speed kept, in (0, 1]")
	return cmd
}
