package main

import (
	"context"
	"fmt"
	"io"
	"time"

	"github.com/spf13/cobra"

	"github.com/gpuctl/gpuctl/api"
	"github.com/gpuctl/gpuctl/client"
	"github.com/gpuctl/gpuctl/views"
)

func init() {
	subcommands = append(subcommands, newStallsCmd, newLogsCmd,
		func() *cobra.Command { return newNodeActionCmd("cordon") },
		func() *cobra.Command { return newNodeActionCmd("uncordon") },
		func() *cobra.Command { return newNodeActionCmd("drain") })
}

func newStallsCmd() *cobra.Command {
	var (
		v   viewFlags
		job string
	)
	cmd := &cobra.Command{
		Use:   "stalls",
		Short: "NCCL stalls (communicators whose ranks stopped agreeing, and which rank holds them up) and slow ranks and links",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			return v.run(cmd, func(ctx context.Context, c *client.Client, w io.Writer, o views.Options) error {
				r, err := c.ListFindings(ctx, job)
				if err != nil {
					return err
				}
				return views.Findings(w, o, r)
			})
		},
	}
	v.add(cmd)
	v.kinds = []api.WatchKind{api.WatchKind_WATCH_KIND_STALLS, api.WatchKind_WATCH_KIND_JOBS}
	cmd.Flags().StringVar(&job, "job", "", "only this job's stalls (id or name)")
	cmd.AddCommand(newQuietSlowCmd("ack"), newQuietSlowCmd("silence"))
	return cmd
}

// newQuietSlowCmd is gpuctl stalls ack and silence: an operator's word
// that a job's fail-slow findings are known, so they trigger no automatic
// action (slow_recovery auto) and do not count as alerting.
func newQuietSlowCmd(what string) *cobra.Command {
	var (
		config, node string
		rank         int32
		forD         time.Duration
	)
	short := "Acknowledge a job's standing fail-slow findings (for its current attempt): no automatic action on them, no alert"
	if what == "silence" {
		short = "Silence a job's fail-slow findings for a while (--for): no automatic action on them, no alert, until it ends"
	}
	cmd := &cobra.Command{
		Use:   what + " JOB",
		Short: short,
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			req := &api.QuietSlowRequest{Job: args[0], Node: node, HasRank: cmd.Flags().Changed("rank"), Rank: rank}
			if req.HasRank && node != "" {
				return fmt.Errorf("give --rank or --node, not both")
			}
			if what == "silence" {
				if forD <= 0 {
					return fmt.Errorf("silence needs --for, a positive duration such as 30m")
				}
				req.ForNs = int64(forD)
			}
			return withClient(cmd, config, func(c *client.Client) error {
				r, err := c.QuietSlow(cmd.Context(), req)
				if err != nil {
					return err
				}
				done := "acknowledged"
				if what == "silence" {
					done = "silenced for " + forD.String()
				}
				fmt.Fprintf(cmd.OutOrStdout(), "%s: fail-slow findings %s; %d standing now\n", r.GetJob().GetId(), done, len(r.GetCovered()))
				for _, f := range r.GetCovered() {
					who := f.GetNode()
					if f.GetClass() == "compute-slow" {
						who = fmt.Sprintf("rank %d@%s", f.GetRank(), f.GetNode())
					}
					fmt.Fprintf(cmd.OutOrStdout(), "  %s %s: %s\n", f.GetClass(), who, api.EscapeText(f.GetEvidence()))
				}
				return nil
			})
		},
	}
	addConfigFlag(cmd, &config)
	cmd.Flags().Int32Var(&rank, "rank", 0, "only this rank's findings")
	cmd.Flags().StringVar(&node, "node", "", "only the findings on this node")
	if what == "silence" {
		cmd.Flags().DurationVar(&forD, "for", 0, "how long the silence lasts, e.g. 30m")
	}
	return cmd
}

var nodeActionHelp = map[string]string{
	"cordon":   "Stop placing new work on a node; what runs there keeps running",
	"uncordon": "Let a cordoned or draining node take new work again",
	"drain":    "Cordon a node and move its jobs elsewhere (checkpoint, stop, relaunch)",
}

func newNodeActionCmd(action string) *cobra.Command {
	var config, reason, output string
	cmd := &cobra.Command{
		Use:   action + " NODE",
		Short: nodeActionHelp[action],
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			return withClient(cmd, config, func(c *client.Client) error {
				f, err := views.ParseFormat(output)
				if err != nil || f == views.Wide {
					return fmt.Errorf("unknown output %q: use table or json", output)
				}
				r, err := c.Cordon(cmd.Context(), args[0], action, reason)
				if err != nil {
					return err
				}
				if f == views.JSON {
					return views.NodeAction(cmd.OutOrStdout(), r)
				}
				return views.NodeActionText(cmd.OutOrStdout(), action, r)
			})
		},
	}
	addConfigFlag(cmd, &config)
	cmd.Flags().StringVarP(&output, "output", "o", "table", "output format: table (sentences) or json (the node as gpuctl nodes -o json, and a drain's jobs)")
	if action != "uncordon" {
		cmd.Flags().StringVar(&reason, "reason", "", "why, shown in `gpuctl nodes` and the event log")
	}
	return cmd
}

func newLogsCmd() *cobra.Command {
	var (
		config string
		rank   int32
		follow bool
		tail   int
		raw    bool
	)
	cmd := &cobra.Command{
		Use:   "logs JOB",
		Short: "Print a rank's output (stdout and stderr), relayed from its node",
		Long: `Print a rank's output (stdout and stderr), relayed from its node.

On a terminal the output is escaped (\x1b[2J shows as those characters,
line breaks and tabs stay), so a job cannot set the window title, clear
the screen or hide a line; --raw prints the bytes as the rank wrote them.
Into a pipe or a file the bytes are printed as written; --raw=false
escapes them there too.`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			if rank < 0 {
				return fmt.Errorf("logs: --rank %d is negative; ranks count from 0", rank)
			}
			if tail < -1 {
				return fmt.Errorf("logs: --tail %d: give a number of lines, or -1 for all", tail)
			}
			ctx, c, done, err := dialInterruptible(cmd, config)
			if err != nil {
				return err
			}
			defer done()
			w := cmd.OutOrStdout()
			if !cmd.Flags().Changed("raw") {
				raw = !isTerminal(w)
			}
			if !raw {
				e := views.NewEscaper(w)
				defer e.Flush()
				w = e
			}
			req := &api.LogsRequest{Job: args[0], Rank: rank, Follow: follow}
			if tail >= 0 {
				last, err := tailLines(ctx, c, req, tail)
				if err != nil {
					return err
				}
				if _, err := w.Write(last); err != nil || !follow {
					return err
				}
				// Follow from where the lines printed end: from as many
				// bytes before the end as were shown, skipping those. An
				// empty tail still needs a byte of the log to start at its
				// end (TailBytes 0 is the whole log).
				skip := len(last)
				if skip == 0 {
					if skip, err = logLen(ctx, c, req, 1); err != nil {
						return err
					}
				}
				req.TailBytes = uint32(skip)
				return c.Logs(ctx, req, func(ch *api.LogsChunk) error {
					d := ch.GetData()
					n := min(skip, len(d))
					skip -= n
					_, err := w.Write(d[n:])
					return err
				})
			}
			return c.Logs(ctx, req, func(ch *api.LogsChunk) error {
				_, err := w.Write(ch.GetData())
				return err
			})
		},
	}
	addConfigFlag(cmd, &config)
	cmd.Flags().Int32Var(&rank, "rank", 0, "the rank whose log to print")
	cmd.Flags().BoolVarP(&follow, "follow", "f", false, "keep printing what the rank writes until the job ends")
	cmd.Flags().IntVar(&tail, "tail", -1, "print only the last N lines (-1: all)")
	cmd.Flags().BoolVar(&raw, "raw", false, "print the bytes as the rank wrote them, escape sequences included (default: on a terminal escaped, else raw)")
	return cmd
}

// logLen returns how many of the last want bytes of a rank's log there
// are.
func logLen(ctx context.Context, c *client.Client, req *api.LogsRequest, want uint32) (int, error) {
	n := 0
	err := c.Logs(ctx, &api.LogsRequest{Job: req.GetJob(), Rank: req.GetRank(), TailBytes: want}, func(ch *api.LogsChunk) error {
		n += len(ch.GetData())
		return nil
	})
	return n, err
}

// maxTailBytes bounds how far back --tail looks for its lines.
const maxTailBytes = 64 << 20

// tailLines returns the last n lines of a rank's log, asking for more of
// its end until it holds n line breaks before the last line or the whole
// log.
func tailLines(ctx context.Context, c *client.Client, req *api.LogsRequest, n int) ([]byte, error) {
	if n == 0 {
		return nil, nil
	}
	for want := uint32(max(n*160, 4096)); ; want *= 4 {
		var data []byte
		q := &api.LogsRequest{Job: req.GetJob(), Rank: req.GetRank(), TailBytes: want}
		if err := c.Logs(ctx, q, func(ch *api.LogsChunk) error {
			data = append(data, ch.GetData()...)
			return nil
		}); err != nil {
			return nil, err
		}
		if last, ok := views.LastLines(data, n); ok || len(data) < int(want) || want >= maxTailBytes {
			return last, nil
		}
	}
}
