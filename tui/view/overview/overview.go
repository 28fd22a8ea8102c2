// Package overview is the console's first screen: every GPU of the
// cluster as a heat map, node state badges and the cluster's totals.
package overview

import (
	"fmt"
	"strings"

	"charm.land/bubbles/v2/help"
	"charm.land/bubbles/v2/key"
	tea "charm.land/bubbletea/v2"

	"github.com/gpuctl/gpuctl/api"
	"github.com/gpuctl/gpuctl/client"
	"github.com/gpuctl/gpuctl/tui/actions"
	"github.com/gpuctl/gpuctl/tui/app"
	"github.com/gpuctl/gpuctl/tui/components/heatmap"
	"github.com/gpuctl/gpuctl/tui/styles"
)

// KeyMap is the overview's keys.
type KeyMap struct {
	Left, Right, Up, Down, Open, Metric, Zoom, Nodes, Jobs, Stalls, Events key.Binding
	Cordon, Uncordon, Drain                                                key.Binding
}

// ShortHelp implements help.KeyMap.
func (k KeyMap) ShortHelp() []key.Binding {
	return []key.Binding{k.Open, k.Metric, k.Zoom, k.Cordon, k.Nodes, k.Jobs}
}

// FullHelp implements help.KeyMap.
func (k KeyMap) FullHelp() [][]key.Binding {
	return [][]key.Binding{{k.Left, k.Right, k.Up, k.Down, k.Open, k.Metric, k.Zoom},
		{k.Nodes, k.Jobs, k.Stalls, k.Events}, {k.Cordon, k.Uncordon, k.Drain}}
}

// Model is the overview.
type Model struct {
	ctx    *app.Context
	keys   KeyMap
	metric heatmap.Metric
	zoom   heatmap.Zoom
	cursor int
	top    int
	layout *heatmap.Layout
	// layoutKey is what the layout was built for.
	layoutKey string
	totals    totals
}

// New returns the overview.
func New(ctx *app.Context) *Model {
	k := KeyMap{
		Left:     app.Bind("←/h", "previous node", "left", "h"),
		Right:    app.Bind("→/l", "next node", "right", "l"),
		Up:       app.Bind("↑/k", "line up", "up", "k"),
		Down:     app.Bind("↓/j", "line down", "down", "j"),
		Open:     app.Bind("enter", "open node", "enter"),
		Metric:   app.Bind("m", "next metric", "m"),
		Zoom:     app.Bind("z", "zoom: auto/gpus/nodes", "z"),
		Nodes:    app.Bind("n", "nodes", "n"),
		Jobs:     app.Bind("J", "jobs", "J"),
		Stalls:   app.Bind("s", "stalls", "s"),
		Events:   app.Bind("e", "events", "e"),
		Cordon:   app.Bind("c", "cordon node", "c"),
		Uncordon: app.Bind("u", "uncordon node", "u"),
		Drain:    app.Bind("d", "drain node", "d"),
	}
	m := &Model{ctx: ctx, keys: k}
	m.gate()
	m.refresh()
	return m
}

func (m *Model) gate() {
	m.ctx.Gate(&m.keys.Cordon, app.ActCordon)
	m.ctx.Gate(&m.keys.Uncordon, app.ActUncordon)
	m.ctx.Gate(&m.keys.Drain, app.ActDrain)
}

// Name implements app.View.
func (m *Model) Name() string { return "overview" }

// Title implements app.View.
func (m *Model) Title() string { return "overview" }

// Init implements app.View.
func (m *Model) Init() tea.Cmd { return nil }

// KeyMap implements app.View.
func (m *Model) KeyMap() help.KeyMap { return m.keys }

// Fits implements app.Fitted: every line is cut to the width here.
func (m *Model) Fits() bool { return true }

// Metric returns the metric shown.
func (m *Model) Metric() heatmap.Metric { return m.metric }

// Selected returns the node under the cursor, or nil.
func (m *Model) Selected() *api.NodeStatus {
	ns := m.ctx.Snap.Nodes
	if m.cursor < 0 || m.cursor >= len(ns) {
		return nil
	}
	return ns[m.cursor]
}

func (m *Model) refresh() {
	// The totals of a snapshot are worked out once for every console that
	// shows it (as of when the first of them got it), and only read.
	snap, now := &m.ctx.Snap, m.ctx.Now()
	m.totals = m.ctx.History.Derive(totalsKey{}, func() any { return computeTotals(snap, now) }).(totals)
	if m.cursor >= len(m.ctx.Snap.Nodes) {
		m.cursor = max(len(m.ctx.Snap.Nodes)-1, 0)
	}
}

// totalsKey names a snapshot's totals among what consoles derive from it.
type totalsKey struct{}

// mapHeight is the rows the heat map may use: totals (2), legend, info and
// the not-ready line take the rest.
func (m *Model) mapHeight() int { return max(m.ctx.Height-5, 1) }

func (m *Model) ensureLayout() *heatmap.Layout {
	ns := m.ctx.Snap.Nodes
	first, last := "", ""
	if len(ns) > 0 {
		first, last = app.NodeName(ns[0]), app.NodeName(ns[len(ns)-1])
	}
	k := fmt.Sprintf("%d/%s/%s/%d/%d/%d/%v", len(ns), first, last, m.ctx.Width, m.mapHeight(), m.zoom, m.ctx.Styles.Color)
	if m.layout == nil || k != m.layoutKey {
		m.layout = heatmap.NewLayout(ns, m.ctx.Width, m.mapHeight(), m.zoom, m.ctx.Styles.Color)
		m.layoutKey = k
	}
	return m.layout
}

// Update implements app.View.
func (m *Model) Update(msg tea.Msg) (app.View, tea.Cmd) {
	switch msg := msg.(type) {
	case app.SnapshotMsg:
		m.refresh()
	case app.ClickMsg:
		return m, m.click(msg)
	case app.WheelMsg:
		l := m.ensureLayout()
		m.top = min(max(m.top+msg.Delta, 0), max(l.Rows-m.mapHeight(), 0))
	case tea.KeyPressMsg:
		return m, m.key(msg)
	}
	return m, nil
}

func (m *Model) click(c app.ClickMsg) tea.Cmd {
	l := m.ensureLayout()
	y := c.Y - 3
	if y < 0 || y >= m.mapHeight() {
		return nil
	}
	line := l.LineAt(m.top + y)
	i := l.At(line, c.X-l.Margin)
	if i < 0 {
		return nil
	}
	if i == m.cursor {
		return m.open()
	}
	m.cursor = i
	return nil
}

func (m *Model) open() tea.Cmd {
	if n := m.Selected(); n != nil {
		name := app.NodeName(n)
		return func() tea.Msg { return app.JumpMsg{Command: "node " + name} }
	}
	return nil
}

func jump(cmd string) tea.Cmd { return func() tea.Msg { return app.JumpMsg{Command: cmd} } }

func (m *Model) key(k tea.KeyPressMsg) tea.Cmd {
	l := m.ensureLayout()
	n := len(m.ctx.Snap.Nodes)
	moveLine := func(d int) {
		line, col, ok := l.Where(m.cursor)
		if !ok {
			return
		}
		if i := l.At(line+d, col); i >= 0 {
			m.cursor = i
		}
	}
	switch {
	case key.Matches(k, m.keys.Left):
		m.step(-1)
	case key.Matches(k, m.keys.Right):
		m.step(1)
	case key.Matches(k, m.keys.Up):
		moveLine(-1)
	case key.Matches(k, m.keys.Down):
		moveLine(1)
	case key.Matches(k, m.keys.Open):
		return m.open()
	case key.Matches(k, m.keys.Metric):
		m.metric = m.metric.Next()
	case key.Matches(k, m.keys.Zoom):
		m.zoom = (m.zoom + 1) % 3
		m.top = 0
	case key.Matches(k, m.keys.Nodes):
		return jump("nodes")
	case key.Matches(k, m.keys.Jobs):
		return jump("jobs")
	case key.Matches(k, m.keys.Stalls):
		return jump("stalls")
	case key.Matches(k, m.keys.Events):
		return jump("events")
	case key.Matches(k, m.keys.Cordon), key.Matches(k, m.keys.Uncordon), key.Matches(k, m.keys.Drain):
		sel := m.Selected()
		if sel == nil || n == 0 {
			return nil
		}
		action := "cordon"
		if key.Matches(k, m.keys.Uncordon) {
			action = "uncordon"
		} else if key.Matches(k, m.keys.Drain) {
			action = "drain"
		}
		return actions.Cordon(m.ctx, []string{app.NodeName(sel)}, action)
	}
	m.follow()
	return nil
}

// step moves the cursor to the next or previous node in map order.
func (m *Model) step(d int) {
	l := m.ensureLayout()
	line, col, ok := l.Where(m.cursor)
	if !ok {
		return
	}
	for {
		col += d
		if col < 0 {
			line--
			if line < 0 {
				return
			}
			col = len(l.Lines[line]) - 1
		}
		if line >= len(l.Lines) {
			return
		}
		if col >= len(l.Lines[line]) {
			line++
			col = 0
			if line >= len(l.Lines) {
				return
			}
		}
		if i := l.Lines[line][col]; i >= 0 {
			m.cursor = i
			return
		}
	}
}

// follow scrolls so the cursor's line is on screen.
func (m *Model) follow() {
	l := m.ensureLayout()
	line, _, ok := l.Where(m.cursor)
	if !ok {
		return
	}
	r := l.RowOfLine(line)
	h := m.mapHeight()
	if r < m.top {
		m.top = r
	}
	rpl := max(l.RowOfLine(line+1)-r, 1)
	if r+rpl > m.top+h {
		m.top = r + rpl - h
	}
	m.top = min(max(m.top, 0), max(l.Rows-h, 0))
}

// Render implements app.View.
func (m *Model) Render() string {
	st := m.ctx.Styles
	w := m.ctx.Width
	l := m.ensureLayout()
	t := m.totals
	var b strings.Builder
	b.WriteString(app.Trunc(t.gpuLine(), w) + "\n")
	b.WriteString(t.nodeLine(st, w) + "\n")
	zoom := "every GPU, two per cell"
	if !st.Color {
		zoom = "every GPU, one per cell"
	}
	if l.PerNode {
		zoom = "one cell per node (mean)"
	}
	group := ""
	if l.GroupBy != "" {
		group = ", grouped by " + l.GroupBy
	}
	scroll := ""
	if l.Rows > m.mapHeight() {
		scroll = fmt.Sprintf(", rows %d-%d of %d", m.top+1, min(m.top+m.mapHeight(), l.Rows), l.Rows)
	}
	legend := fmt.Sprintf("%s: %s low→high  %s faulty  %s down  [%s%s%s]", m.metric, strings.Join(st.HeatLegend, ""),
		cell(st, styles.HeatFaulty), cell(st, styles.HeatStale), zoom, group, scroll)
	if lw := len([]rune(legend)); lw > w {
		legend = fmt.Sprintf("%s: %s  [%s%s]", m.metric, strings.Join(st.HeatLegend, ""), zoom, scroll)
	}
	b.WriteString(st.Dim.Render(legend) + "\n")
	b.WriteString(l.Render(st, heatmap.SharedLevels(m.ctx.History, m.metric, m.ctx.Snap.Nodes), m.top, m.mapHeight(), m.cursor))
	for range m.mapHeight() - min(max(l.Rows-m.top, 0), m.mapHeight()) {
		b.WriteString("\n")
	}
	b.WriteString("\n" + app.Trunc(m.info(), w))
	b.WriteString("\n" + app.Trunc(t.notReady, w))
	return b.String()
}

func cell(st *styles.Styles, i int) string {
	if st.Color {
		return st.Heat[i][i] + styles.Reset
	}
	return st.HeatMono[i]
}

// info describes the node under the cursor.
func (m *Model) info() string {
	n := m.Selected()
	if n == nil {
		if !m.ctx.Snap.Synced {
			return "waiting for the cluster's state…"
		}
		return "no nodes have joined yet (gpuctl token create, then nodemon --token)"
	}
	var util, mem, pow, temp float64
	gs := n.GetGpus()
	for _, g := range gs {
		l := g.GetLast()
		util += float64(l.GetUtilGpuPercent())
		if t := l.GetMemTotalBytes(); t > 0 {
			mem += float64(l.GetMemUsedBytes()) / float64(t) * 100
		}
		pow += float64(l.GetPowerMw()) / 1000
		temp = max(temp, float64(l.GetTempC()))
	}
	if k := float64(len(gs)); k > 0 {
		util, mem = util/k, mem/k
	}
	jobs := jobsOn(&m.ctx.Snap, app.NodeName(n))
	s := fmt.Sprintf("▸ %s [%s] %s · %d GPUs util %.0f%% mem %.0f%% %.0f W max %.0f°C", app.NodeName(n), app.NodeBadge(n, m.ctx.Now()),
		app.Labels(n.GetRegistration().GetLabels()), len(gs), util, mem, pow, temp)
	if len(jobs) > 0 {
		s += " · jobs " + strings.Join(jobs, ",")
	}
	if r := n.GetCordonReason(); r != "" {
		s += " · cordoned: " + r
	}
	if r := n.GetDownReason(); r != "" && n.GetState() == api.NodeState_NODE_STATE_DOWN {
		s += " · down: " + r
	}
	return s
}

func jobsOn(snap *client.Snapshot, node string) []string {
	var out []string
	for _, j := range snap.Jobs {
		for _, pn := range j.GetPlacement() {
			if pn.GetNode() == node {
				out = append(out, j.GetName())
				break
			}
		}
	}
	return out
}
