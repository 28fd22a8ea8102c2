package main

import (
	"context"
	"fmt"
	"io"
	"os"

	"github.com/spf13/cobra"

	"github.com/gpuctl/gpuctl/api"
	"github.com/gpuctl/gpuctl/client"
	"github.com/gpuctl/gpuctl/transport"
	"github.com/gpuctl/gpuctl/views"
)

func init() { subcommands = append(subcommands, newUserCmd) }

func newUserCmd() *cobra.Command {
	cmd := &cobra.Command{Use: "user", Short: "Manage the people and scripts that may use the cluster: add, list, revoke"}
	cmd.AddCommand(newUserAddCmd(), newUserListCmd(), newUserRevokeCmd())
	return cmd
}

func newUserAddCmd() *cobra.Command {
	var config, role, out, server string
	cmd := &cobra.Command{
		Use:   "add NAME --role viewer|operator|admin",
		Short: "Issue a client certificate and print (or write with -o) the client config that uses it",
		Long: `add makes a key here, has the server sign a certificate for it with the role, and
prints a self-contained client config (the key inline: keep it like a key file), or with
-o FILE writes FILE, FILE's .crt and .key and ca.crt next to it, as admin.yaml is written.
The config dials the server this one does, or --server.`,
		Example: `  gpuctl user add alice --role operator -o alice.yaml
  gpuctl user add ci --role viewer > ci.yaml && chmod 600 ci.yaml`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			r, err := transport.ParseRole(role)
			if err != nil {
				return fmt.Errorf("user add: --role: %w", err)
			}
			path, err := client.ConfigPath(config)
			if err != nil {
				return err
			}
			if server == "" {
				cfg, _, err := transport.LoadClientConfig(path)
				if err != nil {
					return fmt.Errorf("user add: %w", err)
				}
				server = cfg.Server
			}
			if out != "" {
				// Refuse before anything is issued, rather than after.
				if _, err := os.Lstat(out); err == nil {
					return fmt.Errorf("user add: %s already exists; refusing to overwrite it", out)
				}
			}
			c, err := client.Dial(cmd.Context(), path)
			if err != nil {
				return err
			}
			defer c.Close()
			id, rec, err := c.AddUser(cmd.Context(), args[0], r)
			if err != nil {
				return err
			}
			if out != "" {
				if err := transport.WriteClientConfig(out, server, id); err != nil {
					return fmt.Errorf("user add: the certificate was issued (serial %s) but: %w; revoke it with `gpuctl user revoke %s`", rec.GetSerial(), err, args[0])
				}
				fmt.Fprintf(cmd.ErrOrStderr(), "user %s (%s, serial %s): wrote %s\n", rec.GetName(), rec.GetRole(), rec.GetSerial(), out)
				return nil
			}
			data, err := transport.ClientConfigYAML(server, id)
			if err != nil {
				return err
			}
			if _, err := cmd.OutOrStdout().Write(data); err != nil {
				return err
			}
			fmt.Fprintf(cmd.ErrOrStderr(), "user %s (%s, serial %s): the config above holds its private key; store it with mode 600\n", rec.GetName(), rec.GetRole(), rec.GetSerial())
			return nil
		},
	}
	addConfigFlag(cmd, &config)
	cmd.Flags().StringVar(&role, "role", "", "viewer (look), operator (run jobs, cordon) or admin (everything)")
	cmd.MarkFlagRequired("role")
	cmd.Flags().StringVarP(&out, "output", "o", "", "write the config to this file (and its certificate and key next to it) instead of printing it")
	cmd.Flags().StringVar(&server, "server", "", "server address written into the config, or every server's, comma-separated (default: the ones this config dials)")
	return cmd
}

func newUserListCmd() *cobra.Command {
	var (
		v     viewFlags
		nodes bool
	)
	cmd := &cobra.Command{
		Use:   "list",
		Short: "List client certificates: name, role, valid or revoked, serial, expiry",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			kind := api.IdentityKind_IDENTITY_KIND_USER
			if nodes {
				kind = api.IdentityKind_IDENTITY_KIND_UNSPECIFIED
			}
			return v.run(cmd, func(ctx context.Context, c *client.Client, w io.Writer, o views.Options) error {
				r, err := c.IdentityList(ctx, kind)
				if err != nil {
					return err
				}
				return views.IdentityList(w, o, r)
			})
		},
	}
	v.add(cmd)
	cmd.Flags().BoolVar(&nodes, "with-nodes", false, "list node certificates too")
	return cmd
}

func newUserRevokeCmd() *cobra.Command {
	var config, reason string
	cmd := &cobra.Command{
		Use:   "revoke NAME",
		Short: "Revoke a user's certificates: refused at the next connection, open ones closed now",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			return withClient(cmd, config, func(c *client.Client) error {
				r, err := c.RevokeUser(cmd.Context(), args[0], reason)
				if err != nil {
					return err
				}
				for _, id := range r.GetRevoked() {
					fmt.Fprintf(cmd.OutOrStdout(), "revoked %s (%s, serial %s)\n", id.GetName(), id.GetRole(), id.GetSerial())
				}
				if n := r.GetDisconnected(); n > 0 {
					fmt.Fprintf(cmd.OutOrStdout(), "closed %d open connection(s)\n", n)
				}
				return nil
			})
		},
	}
	addConfigFlag(cmd, &config)
	cmd.Flags().StringVar(&reason, "reason", "", "why, kept with the revocation and told to the user")
	return cmd
}
