package main

import (
	"fmt"
	"strings"

	"github.com/spf13/cobra"

	"github.com/gpuctl/gpuctl/client"
)

func init() { subcommands = append(subcommands, newNodeCmd) }

func newNodeCmd() *cobra.Command {
	cmd := &cobra.Command{Use: "node", Short: "Manage a node's membership of the cluster"}
	var config, reason string
	var confirmFenced bool
	remove := &cobra.Command{
		Use:   "remove NODE",
		Short: "Remove a node: revoke its certificate, disconnect it and forget it",
		Long: `remove revokes the node's certificate (it is refused from now on), closes its
connection (its jobs see the node down and recover), and forgets it, so that the name
may join again with a new key: what a reinstalled host needs.

A job that lost a node waits, before its next attempt, until the node's old ranks are
surely stopped: the node comes back, or enough of its witnesses (peer nodes that could
renew its lease) acknowledge and its lease passes. When those witnesses are gone for good
too, the job waits forever; --confirm-fenced, for a node that is not connected, is your
word that the node and its ranks are down, and its jobs go on at once.`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			return withClient(cmd, config, func(c *client.Client) error {
				remove := c.RemoveNode
				if confirmFenced {
					remove = c.RemoveLostNode
				}
				r, err := remove(cmd.Context(), args[0], reason)
				if err != nil {
					return err
				}
				if jobs := r.GetFencedJobs(); len(jobs) > 0 {
					fmt.Fprintf(cmd.ErrOrStderr(), "WARNING: you confirmed that %s and its ranks are down. Jobs %s start their next attempt without waiting for its witnesses; if %s still runs their ranks, two attempts of a job may run at once and write the same checkpoints.\n",
						args[0], strings.Join(jobs, ", "), args[0])
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
	remove.Flags().BoolVar(&confirmFenced, "confirm-fenced", false, "confirm that the node, lost, and its ranks are down for good, so that the jobs waiting\nfor its fence go on (if they are not, two attempts of a job may run)")
	cmd.AddCommand(remove)
	return cmd
}
