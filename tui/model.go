// Package tui is gpuctl's operator console: a root model that routes
// messages to a stack of views (overview, nodes, jobs, stalls, …), draws
// the header, banners and status line, and holds the overlays (dialogs,
// forms) and the `:` and `/` prompts. It renders from client.Snapshots
// fed to it as app.SnapshotMsg; every action goes through app.Client.
package tui

import (
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"time"

	"charm.land/bubbles/v2/help"
	"charm.land/bubbles/v2/key"
	tea "charm.land/bubbletea/v2"
	"charm.land/lipgloss/v2"
	"github.com/charmbracelet/colorprofile"
	"github.com/charmbracelet/x/ansi"

	"github.com/gpuctl/gpuctl/api"
	"github.com/gpuctl/gpuctl/transport"
	"github.com/gpuctl/gpuctl/tui/app"
	"github.com/gpuctl/gpuctl/tui/components/cmdline"
	"github.com/gpuctl/gpuctl/tui/components/dialog"
	"github.com/gpuctl/gpuctl/tui/styles"
)

// Options configures a console.
type Options struct {
	Client app.Client
	Role   transport.Role
	// ReadOnly hides every action whatever the role.
	ReadOnly bool
	// User names the session in the header.
	User string
	// Start is the first view's command, default "overview".
	Start string
	// Profile and Dark fix the colours (tests, SSH sessions that know the
	// client's terminal); otherwise the program's reports decide.
	Profile *colorprofile.Profile
	Dark    *bool
	Log     *slog.Logger
	Now     func() time.Time
	// Run wraps network commands (see app.Context.Run).
	Run func(tea.Cmd) tea.Cmd
	// MinFrame and DataFrame coalesce redraws: a frame only after
	// something changed, at most one per MinFrame after input and one per
	// DataFrame after the feed (MinFrame 0: a frame after every message).
	// The SSH console sets them, as its sessions share one server's CPU.
	MinFrame, DataFrame time.Duration
	// Contexts are the client config's clusters and Cluster the one
	// followed; :ctx lists them and follows another (Run then returns
	// SwitchContext).
	Contexts []transport.Context
	Cluster  string
}

type mode int

const (
	modeNormal mode = iota
	modeCommand
	modeFilter
)

// Model is the console's root model.
type Model struct {
	ctx      *app.Context
	stack    []app.View
	overlays []app.Overlay
	mode     mode
	prompt   cmdline.Model
	keys     globalKeys
	help     help.Model
	showHelp bool

	flash    string
	flashErr bool
	conn     *app.ConnMsg
	connAt   time.Time
	lastSnap time.Time
	width    int
	height   int
	fixed    bool
	profile  colorprofile.Profile
	dark     bool
	frames   frames
	// rec records the history of snapshots that come without one.
	rec *app.Recorder
	// switchTo is the context :ctx chose; the console quits to follow it.
	switchTo string
}

type globalKeys struct {
	Command, Filter, Help, Back, Quit, Wide, Stall, Slow, Overview key.Binding
}

func newGlobalKeys() globalKeys {
	return globalKeys{
		Command:  app.Bind(":", "command", ":"),
		Filter:   app.Bind("/", "filter", "/"),
		Help:     app.Bind("?", "help", "?"),
		Back:     app.Bind("esc", "back", "esc"),
		Quit:     app.Bind("q", "quit", "q", "ctrl+c"),
		Wide:     app.Bind("ctrl+w", "wide", "ctrl+w"),
		Stall:    app.Bind("!", "jump to stall", "!"),
		Slow:     app.Bind("@", "jump to the slow GPU", "@"),
		Overview: app.Bind("0", "overview", "0"),
	}
}

// New returns a console; feed it app.SnapshotMsg as the watch delivers.
func New(o Options) *Model {
	profile, dark := colorprofile.ANSI256, true
	fixed := false
	if o.Profile != nil {
		profile, fixed = *o.Profile, true
	}
	if o.Dark != nil {
		dark = *o.Dark
	}
	ctx := app.NewContext(styles.New(profile, dark), o.Role, o.Client)
	ctx.ReadOnly, ctx.User, ctx.Run = o.ReadOnly, o.User, o.Run
	ctx.Contexts, ctx.Cluster = o.Contexts, o.Cluster
	if o.Log != nil {
		ctx.Log = o.Log
	}
	if o.Now != nil {
		ctx.Now = o.Now
	}
	m := &Model{ctx: ctx, frames: frames{min: o.MinFrame, data: max(o.DataFrame, o.MinFrame), wait: time.Nanosecond}, keys: newGlobalKeys(), help: help.New(), fixed: fixed, profile: profile, dark: dark,
		width: 80, height: 24}
	m.prompt.Complete = m.complete
	start := o.Start
	if start == "" {
		start = "overview"
	}
	v, err := m.open(start)
	if err != nil {
		v, _ = m.open("overview")
		m.flash, m.flashErr = err.Error(), true
	}
	m.stack = []app.View{v}
	m.layout()
	return m
}

// SwitchTo is the context the operator chose with :ctx, or "".
func (m *Model) SwitchTo() string { return m.switchTo }

// switchContext quits the console so that its caller follows the cluster
// of context name: the feed, the client and every view belong to one
// cluster, so the whole console starts again rather than views mixing two.
func (m *Model) switchContext(name string) tea.Cmd {
	if len(m.ctx.Contexts) == 0 {
		m.flash, m.flashErr = ":ctx: this console has no contexts (the client config is one cluster, or the console is served over SSH)", true
		return nil
	}
	if name == m.ctx.Cluster {
		m.flash, m.flashErr = fmt.Sprintf("already following context %q", name), false
		return nil
	}
	var names []string
	for _, c := range m.ctx.Contexts {
		if c.Name == name {
			m.switchTo = name
			return tea.Quit
		}
		names = append(names, c.Name)
	}
	m.flash, m.flashErr = fmt.Sprintf("no context %q: the client config has %s", name, strings.Join(names, ", ")), true
	return nil
}

// Context returns the session's shared context (tests read it).
func (m *Model) Context() *app.Context { return m.ctx }

// Top returns the active view.
func (m *Model) Top() app.View { return m.stack[len(m.stack)-1] }

// Overlay returns the open overlay, or nil.
func (m *Model) Overlay() app.Overlay {
	if len(m.overlays) == 0 {
		return nil
	}
	return m.overlays[len(m.overlays)-1]
}

// Flash returns the status line's message.
func (m *Model) Flash() (string, bool) { return m.flash, m.flashErr }

// Init starts the first view and asks the terminal for its background.
func (m *Model) Init() tea.Cmd {
	cmds := []tea.Cmd{m.Top().Init(), m.fetchSlow()}
	if !m.fixed {
		cmds = append(cmds, tea.RequestBackgroundColor)
	}
	return tea.Batch(cmds...)
}

// chrome is how many rows the header, banners and status line take.
func (m *Model) chrome() int {
	n := 2 // header, status line
	n += len(m.banners())
	return n
}

func (m *Model) layout() {
	m.ctx.Width = m.width
	m.ctx.Height = max(m.height-m.chrome(), 1)
}

// Update routes a message.
func (m *Model) Update(msg tea.Msg) (tea.Model, tea.Cmd) {
	return m.frames.update(m, msg, m.update)
}

func (m *Model) update(msg tea.Msg) (tea.Model, tea.Cmd) {
	switch msg := msg.(type) {
	case tea.WindowSizeMsg:
		m.width, m.height = msg.Width, msg.Height
		m.layout()
		return m, nil
	case tea.ColorProfileMsg:
		if !m.fixed {
			m.profile = msg.Profile
			m.ctx.Styles = styles.New(m.profile, m.dark)
		}
		return m, nil
	case tea.BackgroundColorMsg:
		if !m.fixed {
			m.dark = msg.IsDark()
			m.ctx.Styles = styles.New(m.profile, m.dark)
		}
		return m, nil
	case app.SnapshotMsg:
		m.ctx.Snap = msg.Snap
		if msg.History != nil {
			m.ctx.History = msg.History
		} else {
			if m.rec == nil {
				m.rec = app.NewRecorder()
			}
			m.ctx.History = m.rec.Observe(&m.ctx.Snap, m.ctx.Now().UnixNano())
		}
		m.lastSnap = m.ctx.Now()
		if m.conn != nil && m.conn.Err != nil {
			m.conn = nil
		}
		m.layout()
		return m, m.broadcast(msg)
	case app.SlowMsg:
		if msg.Err != nil {
			// An older server or a lost connection: keep what was shown; the
			// connection banner speaks of the connection.
			m.ctx.Log.Debug("fail-slow findings", "err", msg.Err)
		} else {
			m.ctx.Slow = app.NewSlow(msg.Resp)
		}
		m.layout()
		return m, tea.Batch(m.broadcast(msg), m.ctx.Tick(app.SlowRefresh, func(time.Time) tea.Msg { return slowTickMsg{} }))
	case slowTickMsg:
		return m, m.fetchSlow()
	case app.ConnMsg:
		if msg.Err == nil {
			m.conn = nil
		} else {
			c := msg
			m.conn, m.connAt = &c, m.ctx.Now()
		}
		m.layout()
		return m, nil
	case app.FlashMsg:
		m.flash, m.flashErr = msg.Text, msg.Err
		return m, nil
	case app.PushMsg:
		return m, m.push(msg.View)
	case app.BackMsg:
		m.pop()
		return m, nil
	case app.JumpMsg:
		return m, m.run(msg.Command)
	case app.SwitchContextMsg:
		return m, m.switchContext(msg.Name)
	case app.ConfirmMsg:
		run := msg.Run
		d := dialog.New(m.ctx.Styles, m.ctx.Now, msg.Title, msg.Body, msg.Danger, nil, func([]dialog.Field) tea.Cmd { return run })
		m.overlays = append(m.overlays, d)
		return m, nil
	case app.OverlayMsg:
		m.overlays = append(m.overlays, msg.Overlay)
		return m, nil
	case tea.KeyPressMsg:
		return m, m.key(msg)
	case tea.PasteMsg:
		return m, m.paste(msg.Content)
	case tea.MouseClickMsg:
		if len(m.overlays) > 0 || msg.Button != tea.MouseLeft {
			return m, nil
		}
		y := msg.Y - (m.chrome() - 1)
		if y < 0 || y >= m.ctx.Height {
			return m, nil
		}
		return m, m.toTop(app.ClickMsg{X: msg.X, Y: y})
	case tea.MouseWheelMsg:
		if len(m.overlays) > 0 {
			return m, nil
		}
		d := 3
		if msg.Button == tea.MouseWheelUp {
			d = -3
		}
		return m, m.toTop(app.WheelMsg{Delta: d})
	}
	// Anything else (answers to requests, stream chunks, ticks) goes to
	// the overlay first, then to every view; each drops what is not its own.
	if o := m.Overlay(); o != nil {
		no, cmd := o.Update(msg)
		m.setOverlay(no)
		return m, tea.Batch(cmd, m.broadcast(msg))
	}
	return m, m.broadcast(msg)
}

func (m *Model) setOverlay(o app.Overlay) {
	if o.Done() {
		m.overlays = m.overlays[:len(m.overlays)-1]
		return
	}
	m.overlays[len(m.overlays)-1] = o
}

func (m *Model) toTop(msg tea.Msg) tea.Cmd {
	v, cmd := m.Top().Update(msg)
	m.stack[len(m.stack)-1] = v
	return cmd
}

// broadcast hands msg to every view on the stack: views below the top
// keep their data current, so esc returns to a live view.
func (m *Model) broadcast(msg tea.Msg) tea.Cmd {
	var cmds []tea.Cmd
	for i, v := range m.stack {
		nv, cmd := v.Update(msg)
		m.stack[i] = nv
		cmds = append(cmds, cmd)
	}
	return tea.Batch(cmds...)
}

func (m *Model) push(v app.View) tea.Cmd {
	m.stack = append(m.stack, v)
	m.showHelp = false
	return v.Init()
}

func (m *Model) pop() {
	if len(m.stack) == 1 {
		return
	}
	if c, ok := m.Top().(app.Closer); ok {
		c.Close()
	}
	m.stack = m.stack[:len(m.stack)-1]
}

func (m *Model) key(k tea.KeyPressMsg) tea.Cmd {
	if o := m.Overlay(); o != nil {
		no, cmd := o.Update(k)
		m.setOverlay(no)
		return cmd
	}
	switch m.mode {
	case modeCommand, modeFilter:
		return m.prompted(m.prompt.Update(k))
	}
	if m.showHelp {
		if key.Matches(k, m.keys.Help, m.keys.Back) {
			m.showHelp = false
			return nil
		}
	}
	switch {
	case key.Matches(k, m.keys.Quit):
		return tea.Quit
	case key.Matches(k, m.keys.Command):
		m.mode = modeCommand
		m.prompt.Open(":")
		return nil
	case key.Matches(k, m.keys.Filter):
		if f, ok := m.Top().(app.Filterer); ok {
			m.mode = modeFilter
			m.prompt.Open("/")
			m.prompt.Value = f.Filter()
		}
		return nil
	case key.Matches(k, m.keys.Help):
		m.showHelp = true
		return nil
	case key.Matches(k, m.keys.Wide):
		m.ctx.Wide = !m.ctx.Wide
		return nil
	case key.Matches(k, m.keys.Stall):
		return m.jumpToStall()
	case key.Matches(k, m.keys.Slow):
		return m.jumpToSlow()
	case key.Matches(k, m.keys.Back):
		if f, ok := m.Top().(app.Filterer); ok && f.Filter() != "" {
			f.SetFilter("")
			return nil
		}
		m.pop()
		return nil
	case key.Matches(k, m.keys.Overview):
		for len(m.stack) > 1 {
			m.pop()
		}
		return nil
	}
	m.flash = ""
	return m.toTop(k)
}

// prompted acts on what a key or a paste did to the `:` or `/` line.
func (m *Model) prompted(r cmdline.Result) tea.Cmd {
	switch m.mode {
	case modeCommand:
		switch r {
		case cmdline.Submitted:
			m.mode = modeNormal
			return m.run(m.prompt.Value)
		case cmdline.Cancelled:
			m.mode = modeNormal
		}
	case modeFilter:
		f, _ := m.Top().(app.Filterer)
		switch r {
		case cmdline.Submitted:
			m.mode = modeNormal
			if f != nil {
				f.SetFilter(m.prompt.Value)
			}
			if a, ok := m.Top().(app.FilterApplier); ok {
				return a.ApplyFilter()
			}
		case cmdline.Cancelled:
			m.mode = modeNormal
			if f != nil {
				f.SetFilter("")
			}
		default:
			if f != nil {
				f.SetFilter(m.prompt.Value)
			}
		}
	}
	return nil
}

// paste takes a bracketed paste into the `:` or `/` line; elsewhere a
// paste is not keys and does nothing.
func (m *Model) paste(text string) tea.Cmd {
	if m.Overlay() != nil || (m.mode != modeCommand && m.mode != modeFilter) {
		return nil
	}
	m.prompt.Paste(text)
	return m.prompted(cmdline.Editing)
}

// jumpToStall opens the job of the first live stall at its lagging rank.
func (m *Model) jumpToStall() tea.Cmd {
	st := m.ctx.Snap.Stalls
	if len(st) == 0 {
		m.flash, m.flashErr = "no stall is live", false
		return nil
	}
	s := st[0]
	cmd := "job " + s.GetJob()
	if lr := s.GetLaggingRanks(); len(lr) > 0 {
		cmd += fmt.Sprintf(" rank %d", lr[0].GetRank())
	}
	return m.run(cmd)
}

type slowTickMsg struct{}

// fetchSlow asks for the fail-slow findings and the ranks' lateness.
func (m *Model) fetchSlow() tea.Cmd {
	cl := m.ctx.Client
	return m.ctx.Task(func() tea.Msg {
		c, cancel := app.Request()
		defer cancel()
		r, err := cl.ListFindings(c, "")
		return app.SlowMsg{Resp: r, Err: err}
	})
}

// jumpToSlow opens where the first standing finding points: the slow
// rank's GPU (its clocks and throttle reasons), the slow link's flows.
func (m *Model) jumpToSlow() tea.Cmd {
	fs := m.ctx.Slow.Findings
	if len(fs) == 0 {
		m.flash, m.flashErr = "no slow rank or link stands", false
		return nil
	}
	return m.run(app.SlowJump(m.ctx.Snap.Job(fs[0].GetJob()), fs[0]))
}

func (m *Model) banners() []string {
	var out []string
	if m.conn != nil && m.conn.Err != nil {
		out = append(out, "banner-conn")
	}
	if readOnlyEvent(m.ctx.Snap.Events) != nil {
		out = append(out, "banner-read-only")
	}
	if len(m.ctx.Snap.Stalls) > 0 {
		out = append(out, "banner-stall")
	}
	if len(m.ctx.Slow.Findings) > 0 {
		out = append(out, "banner-slow")
	}
	return out
}

// readOnlyEvent is the server's word that the control plane is read-only
// now (its store is away), nil when its newest word says otherwise.
func readOnlyEvent(evs []*api.Event) *api.Event {
	for _, e := range slices.Backward(evs) {
		if e.GetKind() == api.EventKind_EVENT_KIND_READ_ONLY {
			if e.GetAttrs()["read_only"] == "true" {
				return e
			}
			return nil
		}
	}
	return nil
}

func (m *Model) renderBanners() []string {
	st := m.ctx.Styles
	var out []string
	if c := m.conn; c != nil && c.Err != nil {
		since := "never"
		if !m.lastSnap.IsZero() {
			since = app.Duration(m.ctx.Now().Sub(m.lastSnap)) + " ago"
		}
		txt := fmt.Sprintf(" ✕ connection lost: %v — reconnecting (retry in %s); showing the state of %s ", c.Err, c.RetryIn.Round(100*time.Millisecond), since)
		out = append(out, st.BannerCrit.Width(m.width).MaxWidth(m.width).Render(app.Trunc(txt, m.width)))
	}
	if e := readOnlyEvent(m.ctx.Snap.Events); e != nil {
		since := app.Age(m.ctx.Now(), e.GetTimeUnixNano())
		txt := fmt.Sprintf(" ⚠ READ-ONLY for %s: %s — changes are refused; running jobs go on ", since, api.EscapeText(e.GetMessage()))
		out = append(out, st.BannerCrit.Width(m.width).MaxWidth(m.width).Render(app.Trunc(txt, m.width)))
	}
	if ss := m.ctx.Snap.Stalls; len(ss) > 0 {
		s := ss[0]
		more := ""
		if len(ss) > 1 {
			more = fmt.Sprintf(" (+%d more, :stalls)", len(ss)-1)
		}
		since := app.Age(m.ctx.Now(), s.GetSinceUnixNano())
		txt := fmt.Sprintf(" ⚠ STALL %s for %s: %s%s — ! jumps to the lagging rank ", s.GetJob(), since, s.GetDiagnosis(), more)
		out = append(out, st.Banner.Width(m.width).MaxWidth(m.width).Render(app.Trunc(txt, m.width)))
	}
	if fs := m.ctx.Slow.Findings; len(fs) > 0 {
		f := fs[0]
		t := app.FindingText(f)
		more := ""
		if len(fs) > 1 {
			more = fmt.Sprintf(" (+%d more, :stalls)", len(fs)-1)
		}
		since := app.Age(m.ctx.Now(), f.GetSinceUnixNano())
		// The key before the evidence, which is long and may be cut.
		txt := fmt.Sprintf(" ▼ %s %s of %s for %s: %s — @ opens it%s · %s ", strings.ToUpper(t.Kind), t.Who, f.GetJob(), since, t.Size, more, t.Evidence)
		out = append(out, st.Banner.Width(m.width).MaxWidth(m.width).Render(app.Trunc(txt, m.width)))
	}
	return out
}

// View draws the console.
func (m *Model) View() tea.View {
	return m.frames.view(m.view)
}

func (m *Model) view() tea.View {
	v := tea.NewView(m.Render())
	v.AltScreen = true
	v.MouseMode = tea.MouseModeCellMotion
	v.WindowTitle = "gpuctl"
	return v
}

// Render draws the screen as text.
func (m *Model) Render() string {
	st := m.ctx.Styles
	m.layout()
	var b strings.Builder
	b.WriteString(m.header())
	for _, bn := range m.renderBanners() {
		b.WriteString("\n" + bn)
	}
	body := m.body()
	b.WriteString("\n" + body)
	b.WriteString("\n" + m.status())
	out := b.String()
	if o := m.Overlay(); o != nil {
		dlg := o.Render(m.width, m.height)
		w, h := lipgloss.Size(dlg)
		x, y := max((m.width-w)/2, 0), max((m.height-h)/2, 0)
		out = lipgloss.NewCompositor(lipgloss.NewLayer(out), lipgloss.NewLayer(dlg).X(x).Y(y).Z(1)).Render()
	}
	_ = st
	return out
}

// body is the active view (or help) padded to exactly its height.
func (m *Model) body() string {
	var s string
	if m.showHelp {
		s = m.renderHelp()
	} else {
		s = m.Top().Render()
	}
	lines := strings.Split(s, "\n")
	h := m.ctx.Height
	if len(lines) > h {
		lines = lines[:h]
	}
	for len(lines) < h {
		lines = append(lines, "")
	}
	// A line wider than the terminal would wrap and push the screen down;
	// views that draw to the width themselves skip the measuring.
	if f, ok := m.Top().(app.Fitted); ok && f.Fits() && !m.showHelp {
		return strings.Join(lines, "\n")
	}
	for i, l := range lines {
		if len(l) > m.width && ansi.StringWidth(l) > m.width {
			lines[i] = ansi.Truncate(l, m.width, "…")
		}
	}
	return strings.Join(lines, "\n")
}

func (m *Model) header() string {
	st := m.ctx.Styles
	crumbs := make([]string, len(m.stack))
	for i, v := range m.stack {
		crumbs[i] = v.Title()
	}
	left := st.Title.Render("gpuctl") + " " + st.Crumb.Render(strings.Join(crumbs, " › "))
	role := string(m.ctx.Role)
	if m.ctx.ReadOnly {
		role += ", read-only"
	}
	who := role
	if m.ctx.User != "" {
		who = m.ctx.User + " (" + role + ")"
	}
	if m.ctx.Cluster != "" {
		who = "ctx " + m.ctx.Cluster + " · " + who
	}
	s := m.ctx.Snap
	sync := ""
	if !s.Synced {
		sync = " · syncing"
	}
	right := st.Role.Render(fmt.Sprintf("%s · %d nodes · %d jobs%s · %s", who, len(s.Nodes), len(s.Jobs), sync,
		m.ctx.Now().Format(time.TimeOnly)))
	gap := m.width - lipgloss.Width(left) - lipgloss.Width(right)
	if gap < 1 {
		return lipgloss.NewStyle().MaxWidth(m.width).Render(left + " " + right)
	}
	return left + strings.Repeat(" ", gap) + right
}

func (m *Model) status() string {
	st := m.ctx.Styles
	switch m.mode {
	case modeCommand, modeFilter:
		return m.prompt.Render(st, m.width)
	}
	if m.flash != "" {
		s := st.Flash
		if m.flashErr {
			s = st.FlashErr
		}
		return s.MaxWidth(m.width).Render(app.Trunc(m.flash, m.width))
	}
	hm := m.help
	hm.Styles = st.Help
	hm.SetWidth(m.width)
	bindings := append(m.Top().KeyMap().ShortHelp(), m.keys.Command, m.keys.Help)
	return hm.ShortHelpView(bindings)
}

func (m *Model) renderHelp() string {
	st := m.ctx.Styles
	var b strings.Builder
	b.WriteString(st.Header.Render("keys of "+m.Top().Title()) + "\n\n")
	groups := m.Top().KeyMap().FullHelp()
	groups = append(groups, []key.Binding{m.keys.Command, m.keys.Filter, m.keys.Help, m.keys.Back, m.keys.Wide,
		m.keys.Stall, m.keys.Slow, m.keys.Overview, m.keys.Quit})
	for _, g := range groups {
		for _, kb := range g {
			if !kb.Enabled() {
				continue
			}
			h := kb.Help()
			b.WriteString("  " + st.Key.Render(app.Pad(h.Key, 10)) + " " + st.KeyDesc.Render(h.Desc) + "\n")
		}
		b.WriteString("\n")
	}
	b.WriteString(st.Dim.Render("commands: " + strings.Join(m.allowedCommands(), " ") + "  (tab completes, ↑/↓ history)"))
	return b.String()
}
