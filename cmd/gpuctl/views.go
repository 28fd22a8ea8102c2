package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"os/signal"
	"sort"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/spf13/cobra"
	"golang.org/x/sys/unix"

	"github.com/gpuctl/gpuctl/api"
	"github.com/gpuctl/gpuctl/client"
	"github.com/gpuctl/gpuctl/views"
)

func init() {
	subcommands = append(subcommands, newNodesCmd, newGPUsCmd, newEventsCmd, newCollectivesCmd)
}

// viewFlags are the flags every list view shares.
type viewFlags struct {
	config    string
	output    string
	watch     bool
	every     time.Duration
	noHeaders bool
	sortBy    string
	// kinds are the watch streams the view's data comes from; with them
	// --watch follows the streams instead of asking again and again.
	kinds []api.WatchKind
}

func (v *viewFlags) add(cmd *cobra.Command) {
	addConfigFlag(cmd, &v.config)
	cmd.Flags().StringVarP(&v.output, "output", "o", "table", "output format: table, wide or json")
	cmd.Flags().BoolVarP(&v.watch, "watch", "w", false, "follow changes until interrupted")
	cmd.Flags().DurationVar(&v.every, "interval", 2*time.Second, "least time between two refreshes with --watch")
	cmd.Flags().BoolVar(&v.noHeaders, "no-headers", false, "leave out the table's header line")
	cmd.Flags().StringVar(&v.sortBy, "sort-by", "", "sort table rows by this column (as in the header, e.g. age or \"last seen\")")
}

// options are the views' options for cmd's output.
func (v *viewFlags) options(cmd *cobra.Command, f views.Format) views.Options {
	return views.Options{Format: f, Width: terminalWidth(cmd.OutOrStdout()), NoHeaders: v.noHeaders, SortBy: v.sortBy,
		Now: time.Now(), Stderr: cmd.ErrOrStderr()}
}

// terminalWidth is $COLUMNS, else the width of the terminal w is, else
// views' default (80).
func terminalWidth(w io.Writer) int {
	if n, err := strconv.Atoi(os.Getenv("COLUMNS")); err == nil && n > 0 {
		return n
	}
	if f, ok := w.(*os.File); ok {
		if ws, err := unix.IoctlGetWinsize(int(f.Fd()), unix.TIOCGWINSZ); err == nil && ws.Col > 0 {
			return int(ws.Col)
		}
	}
	return views.DefaultWidth
}

func addConfigFlag(cmd *cobra.Command, p *string) {
	cmd.Flags().StringVar(p, "config", "", "client config file (default $GPUCTL_CONFIG, then ~/.config/gpuctl/config.yaml)")
}

// dial connects with the config named by flag, $GPUCTL_CONFIG or the default.
func dial(ctx context.Context, flag string) (*client.Client, error) {
	path, err := client.ConfigPath(flag)
	if err != nil {
		return nil, err
	}
	return client.Dial(ctx, path)
}

// withClient dials with the config named by config, $GPUCTL_CONFIG or the
// default, runs f with the connection and closes it.
func withClient(cmd *cobra.Command, config string, f func(c *client.Client) error) error {
	c, err := dial(cmd.Context(), config)
	if err != nil {
		return err
	}
	defer c.Close()
	return f(c)
}

// dialInterruptible dials as withClient does for a command that runs until
// interrupted: ctx ends on SIGINT or SIGTERM, and done closes the
// connection and stops listening for them.
func dialInterruptible(cmd *cobra.Command, config string) (ctx context.Context, c *client.Client, done func(), err error) {
	ctx, stop := signal.NotifyContext(cmd.Context(), syscall.SIGINT, syscall.SIGTERM)
	c, err = dial(ctx, config)
	if err != nil {
		stop()
		return nil, nil, nil, err
	}
	return ctx, c, func() { c.Close(); stop() }, nil
}

// runView fetches and renders once, or with --watch again whenever the
// view's watch streams say something changed (at most every --interval;
// views without streams ask again every --interval). On a terminal each
// refresh clears the screen; piped, refreshes follow each other with no
// escape codes; JSON is one document per refresh.
func (v *viewFlags) run(cmd *cobra.Command, render func(ctx context.Context, c *client.Client, w io.Writer, o views.Options) error) error {
	f, err := views.ParseFormat(v.output)
	if err != nil {
		return err
	}
	ctx, c, done, err := dialInterruptible(cmd, v.config)
	if err != nil {
		return err
	}
	defer done()
	w := cmd.OutOrStdout()
	if !v.watch {
		return render(ctx, c, w, v.options(cmd, f))
	}
	refresh := func(c *client.Client) error {
		if f != views.JSON {
			if isTerminal(w) {
				fmt.Fprint(w, "\033[H\033[2J")
			}
			fmt.Fprintf(w, "%s  (refreshed on change, at most every %s)\n\n", time.Now().Format(time.TimeOnly), v.every)
		}
		err := render(ctx, c, w, v.options(cmd, f))
		if f != views.JSON && !isTerminal(w) {
			fmt.Fprintln(w)
		}
		return err
	}
	if v.kinds == nil {
		t := time.NewTicker(v.every)
		defer t.Stop()
		for {
			if err := refresh(c); err != nil {
				return err
			}
			select {
			case <-ctx.Done():
				return nil
			case <-t.C:
			}
		}
	}
	changes, snapshot := followWatch(ctx, c, v.kinds, cmd.ErrOrStderr())
	for {
		select {
		case <-ctx.Done():
			return nil
		case err := <-changes:
			if err != nil {
				return err
			}
		}
		if err := refresh(client.New(client.SnapshotTransport(snapshot(), c.Transport()))); err != nil {
			return err
		}
		t := time.NewTimer(v.every)
		select {
		case <-ctx.Done():
			t.Stop()
			return nil
		case <-t.C:
		}
	}
}

// followWatch follows the streams of kinds into a cache. changes is sent
// nil when something changed since the last snapshot (after the first
// full one), or the error that ended the watch; snapshot reads the cache.
func followWatch(ctx context.Context, c *client.Client, kinds []api.WatchKind, stderr io.Writer) (<-chan error, func() client.Snapshot) {
	var mu sync.Mutex
	cache := client.NewCache()
	changes := make(chan error, 1)
	notify := func(err error) {
		select {
		case changes <- err:
		default:
		}
	}
	go func() {
		err := c.Watch(ctx, &api.WatchRequest{Kinds: kinds}, client.WatchOptions{
			OnDisconnect: func(err error, retry time.Duration) {
				fmt.Fprintf(stderr, "gpuctl: lost the server (%v); reconnecting in %s\n", err, retry.Round(time.Millisecond))
			}},
			func(b *api.WatchBatch) error {
				mu.Lock()
				cache.Apply(b)
				synced := cache.Snapshot().Synced
				mu.Unlock()
				if synced {
					notify(nil)
				}
				return nil
			})
		if err != nil {
			notify(err)
		}
	}()
	return changes, func() client.Snapshot {
		mu.Lock()
		defer mu.Unlock()
		return cache.Snapshot()
	}
}

func isTerminal(w io.Writer) bool {
	f, ok := w.(*os.File)
	if !ok {
		return false
	}
	_, err := unix.IoctlGetTermios(int(f.Fd()), unix.TCGETS)
	return err == nil
}

func newNodesCmd() *cobra.Command {
	var v viewFlags
	cmd := &cobra.Command{
		Use:   "nodes [NAME...]",
		Short: "List nodes with their state and GPU summary",
		Long: `List nodes. STATE is the node's liveness, ready or down, with ",cordoned" or
",draining" when it takes no new work (as kubectl's Ready,SchedulingDisabled).
Figures in parentheses are the last ones a down node sent, not live readings.`,
		RunE: func(cmd *cobra.Command, args []string) error {
			return v.run(cmd, func(ctx context.Context, c *client.Client, w io.Writer, o views.Options) error {
				nodes, err := c.Nodes(ctx)
				if err != nil {
					return err
				}
				if nodes, err = views.SelectNodes(nodes, args); err != nil {
					return err
				}
				return views.Nodes(w, o, nodes)
			})
		},
	}
	v.add(cmd)
	v.kinds = []api.WatchKind{api.WatchKind_WATCH_KIND_NODES}
	return cmd
}

func newGPUsCmd() *cobra.Command {
	var v viewFlags
	var node []string
	cmd := &cobra.Command{
		Use:   "gpus [NODE...]",
		Short: "List every GPU with its latest counters",
		RunE: func(cmd *cobra.Command, args []string) error {
			return v.run(cmd, func(ctx context.Context, c *client.Client, w io.Writer, o views.Options) error {
				nodes, err := c.Nodes(ctx)
				if err != nil {
					return err
				}
				if nodes, err = views.SelectNodes(nodes, append(append([]string{}, args...), node...)); err != nil {
					return err
				}
				return views.GPUs(w, o, nodes)
			})
		},
	}
	v.add(cmd)
	v.kinds = []api.WatchKind{api.WatchKind_WATCH_KIND_NODES}
	cmd.Flags().StringSliceVar(&node, "node", nil, "only these nodes' GPUs (as the arguments)")
	return cmd
}

func newEventsCmd() *cobra.Command {
	var (
		v         viewFlags
		node, job string
		since     sinceFlag
		limit     uint32
	)
	cmd := &cobra.Command{
		Use:   "events",
		Short: "List cluster events: XIDs, ECC, throttling, node up/down, rank exits, recovery, audit",
		Args:  cobra.NoArgs,
		Long: `List cluster events, in time order across nodes. With --watch the events
already there are printed, then each new one as it happens (no screen is
redrawn; piped, no escape codes are written; JSON is one {"events": [...]}
document per line).`,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if v.watch {
				return streamEvents(cmd, &v, node, job, since, limit)
			}
			return v.run(cmd, func(ctx context.Context, c *client.Client, w io.Writer, o views.Options) error {
				req := &api.ListEventsRequest{Node: node, Limit: limit}
				if since.set {
					req.SinceUnixNano = since.at(time.Now()).UnixNano()
				}
				if job != "" {
					// The server filters by node only: take all, keep the job's.
					req.Limit = 0
				}
				evs, err := c.Events(ctx, req)
				if err != nil {
					return err
				}
				if job != "" {
					if evs, err = jobEvents(ctx, c, job, evs); err != nil {
						return err
					}
					if limit > 0 && len(evs) > int(limit) {
						evs = evs[len(evs)-int(limit):]
					}
				}
				return views.Events(w, o, evs)
			})
		},
	}
	v.add(cmd)
	cmd.Flags().StringVar(&node, "node", "", "only this node's events")
	cmd.Flags().StringVar(&job, "job", "", "only this job's events (id or name)")
	cmd.Flags().Var(&since, "since", "only events newer than this: a duration (10m, 1d, 2d12h) or an RFC 3339 time")
	cmd.Flags().Uint32Var(&limit, "limit", 200, "at most this many, newest kept (0 = all)")
	return cmd
}

// streamEvents prints the events there are (as without --watch), then
// every new event as the server stores it, in time order within each
// batch, until interrupted.
func streamEvents(cmd *cobra.Command, v *viewFlags, node, job string, since sinceFlag, limit uint32) error {
	f, err := views.ParseFormat(v.output)
	if err != nil {
		return err
	}
	ctx, c, done, err := dialInterruptible(cmd, v.config)
	if err != nil {
		return err
	}
	defer done()
	w := cmd.OutOrStdout()
	o := v.options(cmd, f)
	var ids map[string]bool
	if job != "" {
		jobs, err := c.Jobs(ctx, job)
		if err != nil {
			return err
		}
		ids = map[string]bool{}
		for _, j := range jobs {
			ids[j.GetId()] = true
		}
	}
	keep := func(e *api.Event) bool {
		if node != "" && e.GetNode() != node {
			return false
		}
		if ids != nil && !ids[e.GetJob()] && !strings.HasPrefix(e.GetJob(), firstKey(ids)+"-validate") {
			return false
		}
		return !since.set || e.GetTimeUnixNano() >= since.at(o.Now).UnixNano()
	}
	backlog := limit
	if backlog == 0 {
		backlog = 1000
	}
	printed := 0
	return c.Watch(ctx, &api.WatchRequest{Kinds: []api.WatchKind{api.WatchKind_WATCH_KIND_EVENTS}, EventsBacklog: backlog},
		client.WatchOptions{OnDisconnect: func(err error, retry time.Duration) {
			fmt.Fprintf(cmd.ErrOrStderr(), "gpuctl: lost the server (%v); reconnecting in %s\n", err, retry.Round(time.Millisecond))
		}},
		func(b *api.WatchBatch) error {
			if b.GetSnapshot() && printed > 0 {
				// A resync repeats events already printed: say so rather
				// than print them twice.
				fmt.Fprintf(cmd.ErrOrStderr(), "gpuctl: the server resynced this watch (%s); events meanwhile may be missing\n", b.GetResyncReason())
				return nil
			}
			var evs []*api.Event
			for _, ch := range b.GetChanges() {
				if e := ch.GetEvent(); e != nil && keep(e) {
					evs = append(evs, e)
				}
			}
			sort.SliceStable(evs, func(i, j int) bool { return evs[i].GetTimeUnixNano() < evs[j].GetTimeUnixNano() })
			if len(evs) == 0 {
				return nil
			}
			printed += len(evs)
			if f == views.JSON {
				doc := struct {
					Events []views.EventJSON `json:"events"`
				}{}
				for _, e := range evs {
					doc.Events = append(doc.Events, views.EventFromAPI(e))
				}
				return json.NewEncoder(w).Encode(doc)
			}
			o.NoHeaders = v.noHeaders || printed > len(evs)
			return views.Events(w, o, evs)
		})
}

func firstKey(m map[string]bool) string {
	for k := range m {
		return k
	}
	return ""
}

// jobEvents keeps the events of the job named key (id or name).
func jobEvents(ctx context.Context, c *client.Client, key string, evs []*api.Event) ([]*api.Event, error) {
	jobs, err := c.Jobs(ctx, key)
	if err != nil {
		return nil, err
	}
	if len(jobs) == 0 {
		return nil, fmt.Errorf("no job named %q: `gpuctl jobs --all` lists them", key)
	}
	ids := map[string]bool{}
	for _, j := range jobs {
		ids[j.GetId()] = true
	}
	var out []*api.Event
	for _, e := range evs {
		if ids[e.GetJob()] || strings.HasPrefix(e.GetJob(), jobs[0].GetId()+"-validate") {
			out = append(out, e)
		}
	}
	return out, nil
}

func newCollectivesCmd() *cobra.Command {
	var (
		v         viewFlags
		job, node string
	)
	cmd := &cobra.Command{
		Use:   "collectives",
		Short: "NCCL calls per rank, communicator and op, as traced by eBPF",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			return v.run(cmd, func(ctx context.Context, c *client.Client, w io.Writer, o views.Options) error {
				cs, err := c.Collectives(ctx, job, node)
				if err != nil {
					return err
				}
				return views.Collectives(w, o, cs)
			})
		},
	}
	v.add(cmd)
	cmd.Flags().StringVar(&job, "job", "", "only this job's ranks")
	cmd.Flags().StringVar(&node, "node", "", "only this node's ranks")
	return cmd
}
