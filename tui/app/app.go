// Package app is what every part of the console shares: the Context
// (size, styles, role, the latest cluster snapshot and its history, the
// client actions go through), the View interface the root model routes
// to, the messages that cross between them, and the role table that
// decides which actions a session may see.
package app

import (
	"context"
	"log/slog"
	"time"

	"charm.land/bubbles/v2/help"
	"charm.land/bubbles/v2/key"
	tea "charm.land/bubbletea/v2"

	"github.com/gpuctl/gpuctl/api"
	"github.com/gpuctl/gpuctl/client"
	"github.com/gpuctl/gpuctl/transport"
	"github.com/gpuctl/gpuctl/tui/styles"
)

// Client is what the console asks of gpuctl serve. *client.Client
// implements it; tests pass a fake that records the requests.
type Client interface {
	Cordon(ctx context.Context, node, action, reason string) (*api.CordonResponse, error)
	CheckpointJob(ctx context.Context, job string) (*api.Job, error)
	RestartJob(ctx context.Context, job, fromCheckpoint string, exclude []string) (*api.Job, error)
	CancelJob(ctx context.Context, job string) (*api.Job, error)
	AssignJob(ctx context.Context, job string, nodes []string) (*api.Job, error)
	Rebalance(ctx context.Context, apply bool, maxMoves uint32) (*api.RebalanceResponse, error)
	SubmitJob(ctx context.Context, req *api.SubmitJobRequest) (*api.SubmitJobResponse, error)
	InjectFault(ctx context.Context, node string, f *api.InjectFault) error
	Logs(ctx context.Context, req *api.LogsRequest, fn func(*api.LogsChunk) error) error
	Observe(ctx context.Context, req *api.ObserveRequest, fn func(*api.ObserveBatch) error) error
	GPUHistory(ctx context.Context, node string, gpu int) ([]*api.GPUSample, error)
	Collectives(ctx context.Context, job, node string) ([]*api.CollectiveStat, error)
	ListFindings(ctx context.Context, job string) (*api.ListStallsResponse, error)
}

var _ Client = (*client.Client)(nil)

// Context is shared by the root model and every view of one console
// session. Only the root model's goroutine (Update and View) touches it.
type Context struct {
	// Width and Height are the area the active view draws in.
	Width, Height int
	Styles        *styles.Styles
	// Role is the session's role; ReadOnly hides every action whatever it is.
	Role     transport.Role
	ReadOnly bool
	// User names the session in the header (certificate or SSH key name).
	User string
	// Snap is the latest cluster snapshot, History what earlier ones said
	// (read-only: it may be shared with other sessions).
	Snap    client.Snapshot
	History *History
	// Slow is the fail-slow findings and lateness last fetched.
	Slow   Slow
	Client Client
	Log    *slog.Logger
	// Now is the clock; tests fix it.
	Now func() time.Time
	// Wide is ctrl-w's toggle: tables show every column.
	Wide bool
	// NodeMarks are the nodes marked with space in the node table; they
	// outlive the table, so :jobs can assign a job to them.
	NodeMarks map[string]bool
	// Tick schedules a refresh (tea.Tick); tests stop it.
	Tick func(d time.Duration, fn func(time.Time) tea.Msg) tea.Cmd
	// Run wraps every network command a view starts, so tests can run
	// them synchronously or drop them; nil runs them as they are.
	Run func(tea.Cmd) tea.Cmd
	// Contexts are the client config's clusters and Cluster the one this
	// console follows; both empty when the config is one cluster (or the
	// console is served over SSH, which has no client config).
	Contexts []transport.Context
	Cluster  string

	gen uint64
}

// NewContext returns a context with the defaults filled in.
func NewContext(st *styles.Styles, role transport.Role, cl Client) *Context {
	return &Context{Styles: st, Role: role, Client: cl, History: NewHistory(), Now: time.Now,
		NodeMarks: map[string]bool{}, Tick: tea.Tick,
		Log: slog.New(slog.DiscardHandler)}
}

// NextGen returns a new generation number, so a view can drop the answer
// to a request it has since replaced.
func (c *Context) NextGen() uint64 {
	c.gen++
	return c.gen
}

// Task wraps a network command through the Run hook.
func (c *Context) Task(cmd tea.Cmd) tea.Cmd {
	if cmd == nil || c.Run == nil {
		return cmd
	}
	return c.Run(cmd)
}

// Action names a change a console can ask for.
type Action string

// The console's actions.
const (
	ActSubmit     Action = "submit"
	ActCancel     Action = "cancel"
	ActAssign     Action = "assign"
	ActRebalance  Action = "rebalance"
	ActCheckpoint Action = "checkpoint"
	ActRestart    Action = "restart"
	ActCordon     Action = "cordon"
	ActUncordon   Action = "uncordon"
	ActDrain      Action = "drain"
	ActFault      Action = "fault"
	ActToken      Action = "token"
)

// actionRole is the least role that may ask for each action. It mirrors the
// server's table, which decides anyway; an action missing here is hidden.
var actionRole = map[Action]transport.Role{
	ActSubmit: transport.RoleOperator, ActCancel: transport.RoleOperator, ActAssign: transport.RoleOperator,
	ActRebalance: transport.RoleOperator, ActCheckpoint: transport.RoleOperator, ActRestart: transport.RoleOperator,
	ActCordon: transport.RoleOperator, ActUncordon: transport.RoleOperator, ActDrain: transport.RoleOperator,
	ActFault: transport.RoleAdmin, ActToken: transport.RoleAdmin,
}

// Can reports whether the session may see action a.
func (c *Context) Can(a Action) bool {
	if c.ReadOnly {
		return false
	}
	need, ok := actionRole[a]
	return ok && c.Role.AtLeast(need)
}

// Gate enables b only when the session may use action a, so a viewer's
// keymap neither matches nor shows it.
func (c *Context) Gate(b *key.Binding, a Action) {
	b.SetEnabled(c.Can(a))
}

// Bind is key.NewBinding with its keys and help in one call.
func Bind(help string, desc string, keys ...string) key.Binding {
	return key.NewBinding(key.WithKeys(keys...), key.WithHelp(help, desc))
}

// View is one screen of the console: nodes, a job, the stalls. The root
// model keeps a stack of them (enter pushes, esc pops).
type View interface {
	// Name is the view's command (":nodes"); Title its breadcrumb.
	Name() string
	Title() string
	Init() tea.Cmd
	// Update handles a message; SnapshotMsg reaches every view on the stack.
	Update(msg tea.Msg) (View, tea.Cmd)
	// Render draws the view in the Context's Width × Height.
	Render() string
	// KeyMap is what ? shows and what the view matches keys with.
	KeyMap() help.KeyMap
}

// Filterer is a view that / filters.
type Filterer interface {
	SetFilter(s string)
	Filter() string
}

// FilterApplier is a Filterer whose filter costs a request (a stream to
// restart): it is applied when the prompt is submitted, not per key.
type FilterApplier interface {
	ApplyFilter() tea.Cmd
}

// Fitted is a view that draws every line within its width itself, so the
// root model need not measure them (the overview's heat map is escape
// sequences through and through).
type Fitted interface{ Fits() bool }

// Closer is a view that holds a stream open (logs, observe) and ends it
// when popped.
type Closer interface{ Close() }

// SnapshotMsg carries a new cluster snapshot. History, when set, is the
// feed's read-only history up to it, shared by every console the feed
// serves; without it a console records its own.
type SnapshotMsg struct {
	Snap    client.Snapshot
	History *History
}

// ConnMsg says the watch was lost (Err set, retrying after RetryIn) or is
// back (Err nil).
type ConnMsg struct {
	Err     error
	RetryIn time.Duration
}

// PushMsg opens View on top of the stack.
type PushMsg struct{ View View }

// BackMsg pops the top view.
type BackMsg struct{}

// JumpMsg opens the view a command names (":job j-1a2b3c") from anywhere.
type JumpMsg struct{ Command string }

// SwitchContextMsg asks the console to follow another of the client
// config's clusters.
type SwitchContextMsg struct{ Name string }

// FlashMsg shows a one-line result in the status line.
type FlashMsg struct {
	Text string
	Err  bool
}

// ConfirmMsg opens a confirmation dialog; Run is the command to start
// once the operator confirms.
type ConfirmMsg struct {
	Title string
	// Body is the blast radius: jobs, ranks, placements affected.
	Body   string
	Danger bool
	Run    tea.Cmd
}

// OverlayMsg opens an overlay (a form, a picker) on top of the views.
type OverlayMsg struct{ Overlay Overlay }

// Overlay is a dialog or form drawn over the views; it gets every key
// while it is open.
type Overlay interface {
	Update(msg tea.Msg) (Overlay, tea.Cmd)
	// Render draws it at most width × height.
	Render(width, height int) string
	// Done reports that it closed (answered or cancelled).
	Done() bool
}

// Push returns a command that opens v.
func Push(v View) tea.Cmd { return func() tea.Msg { return PushMsg{View: v} } }

// Flash returns a command that shows text (an error when err).
func Flash(text string, err bool) tea.Cmd {
	return func() tea.Msg { return FlashMsg{Text: text, Err: err} }
}

// Confirm returns a command that asks before running run.
func Confirm(title, body string, danger bool, run tea.Cmd) tea.Cmd {
	return func() tea.Msg { return ConfirmMsg{Title: title, Body: body, Danger: danger, Run: run} }
}

// ActionResult is what an action command answers: the flash to show.
func ActionResult(what string, err error) tea.Msg {
	if err != nil {
		return FlashMsg{Text: what + ": " + err.Error(), Err: true}
	}
	return FlashMsg{Text: what}
}

// requestTimeout bounds one action request from the console.
const requestTimeout = 20 * time.Second

// Request returns a context for one request.
func Request() (context.Context, context.CancelFunc) {
	return context.WithTimeout(context.Background(), requestTimeout)
}
