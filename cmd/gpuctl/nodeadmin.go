package main

import (
	"fmt"

	"github.com/spf13/cobra"

	"github.com/gpuctl/gpuctl/client"
)

func init() { subcommands = append(subcommands, newNodeCmd) }

func newNodeCmd() *cobra.Command {
	cmd := &cobra.Command{Use: "node", Short: "Manage a node's membership of the cluster"}
	var config, reason string
	remove := &cobra.Command{
		Use:   "remove NODE",
		Short: "Remove a node: revoke its certificate, disconnect it and forget it",
		Long: `remove revokes the node's certificate (it is refused from now on), closes its
connection (its jobs see the node down and recover), and forgets it, so that the name
may join again with a new key: what a reinstalled host needs.`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			return withClient(cmd, config, func(c *client.Client) error {
				r, err := c.RemoveNode(cmd.Context(), args[0], reason)
				if err != nil {
					return err
				}
				w := cmd.OutOrStdout()
				fmt.Fprintf(w, "node %s removed", args[0])
				if r.GetWasConnected() {
					fmt.Fprint(w, " (it was connected and has been disconnected)")
				}
				fmt.Fprintln(w)
				for _, id := range r.GetRevoked() {
					fmt.Fprintf(w, "revoked certificate serial %s\n", id.GetSerial())
				}
				_, err = fmt.Fprintf(w, "to join it again: move node.crt and node.key out of its nodemon identity dir, then nodemon --token NEW-TOKEN\n")
				return err
			})
		},
	}
	addConfigFlag(remove, &config)
	remove.Flags().StringVar(&reason, "reason", "", "why, kept with the revocation and told to the node")
	cmd.AddCommand(remove)
	return cmd
}
