// Package nodes is the console's node table: state, labels, a GPU
// utilisation summary and a sparkline per node.
package nodes

import (
	"cmp"
	"fmt"
	"slices"
	"strings"

	"charm.land/bubbles/v2/help"
	"charm.land/bubbles/v2/key"
	tea "charm.land/bubbletea/v2"

	"github.com/gpuctl/gpuctl/api"
	"github.com/gpuctl/gpuctl/tui/actions"
	"github.com/gpuctl/gpuctl/tui/app"
	"github.com/gpuctl/gpuctl/tui/components/spark"
	"github.com/gpuctl/gpuctl/tui/components/table"
)

// KeyMap is the node table's keys.
type KeyMap struct {
	table.KeyMap
	Open, Cordon, Uncordon, Drain key.Binding
}

// ShortHelp implements help.KeyMap.
func (k KeyMap) ShortHelp() []key.Binding {
	return []key.Binding{k.Open, k.Mark, k.Cordon, k.Uncordon, k.Drain, k.Sort}
}

// FullHelp implements help.KeyMap.
func (k KeyMap) FullHelp() [][]key.Binding {
	return [][]key.Binding{k.KeyMap.Bindings(), {k.Open, k.Cordon, k.Uncordon, k.Drain}}
}

// Model is the node table.
type Model struct {
	ctx    *app.Context
	keys   KeyMap
	tbl    table.Model
	filter string
	rows   []row
}

type row struct {
	n                   *api.NodeStatus
	name, badge, labels string
	util, mem, power    float64
	temp                uint32
	gpus, faulty, ranks int
}

// Columns of the table, in order.
var columns = []table.Column{
	{Title: "NAME", Width: 14}, {Title: "STATE", Width: 9}, {Title: "GPUS", Width: 5, Right: true},
	{Title: "UTIL", Width: 5, Right: true}, {Title: "UTIL~", Width: 20}, {Title: "MEM", Width: 5, Right: true},
	{Title: "POWER", Width: 7, Right: true}, {Title: "TEMP", Width: 5, Right: true}, {Title: "RANKS", Width: 5, Right: true},
	{Title: "LABELS", Width: 0}, {Title: "REASON", Width: 28, Wide: true},
}

// New returns the node table.
func New(ctx *app.Context) *Model {
	k := KeyMap{KeyMap: table.DefaultKeyMap(),
		Open:     app.Bind("enter", "open node", "enter"),
		Cordon:   app.Bind("c", "cordon", "c"),
		Uncordon: app.Bind("u", "uncordon", "u"),
		Drain:    app.Bind("d", "drain", "d"),
	}
	ctx.Gate(&k.Cordon, app.ActCordon)
	ctx.Gate(&k.Uncordon, app.ActUncordon)
	ctx.Gate(&k.Drain, app.ActDrain)
	m := &Model{ctx: ctx, keys: k, tbl: table.New(columns...)}
	m.tbl.Marked = ctx.NodeMarks
	m.rebuild()
	return m
}

// Name implements app.View.
func (m *Model) Name() string { return "nodes" }

// Title implements app.View.
func (m *Model) Title() string { return "nodes" }

// Init implements app.View.
func (m *Model) Init() tea.Cmd { return nil }

// KeyMap implements app.View.
func (m *Model) KeyMap() help.KeyMap { return m.keys }

// SetFilter implements app.Filterer: a substring of the name, state or labels.
func (m *Model) SetFilter(s string) { m.filter = s; m.rebuild() }

// Filter implements app.Filterer.
func (m *Model) Filter() string { return m.filter }

// Marked returns the marked node names, sorted.
func (m *Model) Marked() []string {
	out := make([]string, 0, len(m.tbl.Marked))
	for n := range m.tbl.Marked {
		out = append(out, n)
	}
	slices.Sort(out)
	return out
}

// Rows returns the node names in table order.
func (m *Model) Rows() []string {
	out := make([]string, len(m.rows))
	for i, r := range m.rows {
		out[i] = r.name
	}
	return out
}

// Cursor returns the selected node name.
func (m *Model) Cursor() string {
	if m.tbl.Cursor < len(m.rows) {
		return m.rows[m.tbl.Cursor].name
	}
	return ""
}

func (m *Model) rebuild() {
	ranks := map[string]int{}
	for _, j := range m.ctx.Snap.Jobs {
		for _, pn := range j.GetPlacement() {
			ranks[pn.GetNode()] += len(pn.GetRanks())
		}
	}
	f := strings.ToLower(m.filter)
	now := m.ctx.Now()
	rows := m.rows[:0]
	for _, n := range m.ctx.Snap.Nodes {
		r := row{n: n, name: app.NodeName(n), badge: app.NodeBadge(n, now), labels: app.Labels(n.GetRegistration().GetLabels()),
			gpus: len(n.GetGpus()), ranks: ranks[app.NodeName(n)]}
		if f != "" && !strings.Contains(strings.ToLower(r.name+" "+r.badge+" "+r.labels), f) {
			continue
		}
		for _, g := range n.GetGpus() {
			l := g.GetLast()
			r.util += float64(l.GetUtilGpuPercent())
			if t := l.GetMemTotalBytes(); t > 0 {
				r.mem += float64(l.GetMemUsedBytes()) / float64(t) * 100
			}
			r.power += float64(l.GetPowerMw()) / 1000
			r.temp = max(r.temp, l.GetTempC())
			if app.GPUFaulty(g) {
				r.faulty++
			}
		}
		if r.gpus > 0 {
			r.util /= float64(r.gpus)
			r.mem /= float64(r.gpus)
		}
		rows = append(rows, r)
	}
	m.rows = rows
	m.sort()
	m.tbl.SetRows(len(m.rows))
}

func (m *Model) sort() {
	c := m.tbl.SortCol
	slices.SortStableFunc(m.rows, func(a, b row) int {
		var o int
		switch columns[c].Title {
		case "STATE":
			o = cmp.Compare(a.badge, b.badge)
		case "GPUS":
			o = cmp.Compare(a.gpus, b.gpus)
		case "UTIL", "UTIL~":
			o = cmp.Compare(a.util, b.util)
		case "MEM":
			o = cmp.Compare(a.mem, b.mem)
		case "POWER":
			o = cmp.Compare(a.power, b.power)
		case "TEMP":
			o = cmp.Compare(a.temp, b.temp)
		case "RANKS":
			o = cmp.Compare(a.ranks, b.ranks)
		case "LABELS":
			o = cmp.Compare(a.labels, b.labels)
		}
		if o == 0 {
			o = cmp.Compare(a.name, b.name)
		}
		if m.tbl.SortDesc {
			return -o
		}
		return o
	})
}

// Update implements app.View.
func (m *Model) Update(msg tea.Msg) (app.View, tea.Cmd) {
	switch msg := msg.(type) {
	case app.SnapshotMsg:
		m.rebuild()
	case app.ClickMsg:
		// Line 0 is the count; the table starts below it.
		before := m.tbl.Cursor
		if m.tbl.Click(msg.X, msg.Y-1, m.ctx.Width, m.ctx.Wide) {
			m.rebuild()
		} else if msg.Y > 1 && before == m.tbl.Cursor {
			return m, m.open()
		}
	case app.WheelMsg:
		m.tbl.Scroll(msg.Delta)
	case tea.KeyPressMsg:
		if ok, resort := m.tbl.Update(msg, m.keys.KeyMap, m.key); ok {
			if resort {
				m.rebuild()
			}
			return m, nil
		}
		switch {
		case key.Matches(msg, m.keys.Open):
			return m, m.open()
		case key.Matches(msg, m.keys.Cordon):
			return m, actions.Cordon(m.ctx, m.targets(), "cordon")
		case key.Matches(msg, m.keys.Uncordon):
			return m, actions.Cordon(m.ctx, m.targets(), "uncordon")
		case key.Matches(msg, m.keys.Drain):
			return m, actions.Cordon(m.ctx, m.targets(), "drain")
		}
	}
	return m, nil
}

func (m *Model) key(i int) string { return m.rows[i].name }

// targets are the marked nodes, else the selected one.
func (m *Model) targets() []string {
	if mk := m.Marked(); len(mk) > 0 {
		return mk
	}
	if c := m.Cursor(); c != "" {
		return []string{c}
	}
	return nil
}

func (m *Model) open() tea.Cmd {
	c := m.Cursor()
	if c == "" {
		return nil
	}
	return func() tea.Msg { return app.JumpMsg{Command: "node " + c} }
}

// Render implements app.View.
func (m *Model) Render() string {
	st := m.ctx.Styles
	hist := m.ctx.History
	head := fmt.Sprintf("%d nodes", len(m.rows))
	if m.filter != "" {
		head += fmt.Sprintf(" matching %q", m.filter)
	}
	if mk := len(m.tbl.Marked); mk > 0 {
		head += fmt.Sprintf(" · %d marked", mk)
	}
	body := m.tbl.Render(st, m.ctx.Width, m.ctx.Height-1, m.ctx.Wide, m.key, func(i, c int) table.Cell {
		r := m.rows[i]
		switch c {
		case 0:
			return table.Cell{Text: r.name}
		case 1:
			s := &st.OK
			switch r.badge {
			case "down", "faulty":
				s = &st.Crit
			case "cordoned", "draining", "suspect":
				s = &st.Warn
			}
			return table.Cell{Text: r.badge, Style: s}
		case 2:
			if r.faulty > 0 {
				return table.Cell{Text: fmt.Sprintf("%d!%d", r.gpus, r.faulty), Style: &st.Crit}
			}
			return table.Cell{Text: fmt.Sprint(r.gpus)}
		case 3:
			return table.Cell{Text: fmt.Sprintf("%.0f%%", r.util)}
		case 4:
			var vals []float64
			if h := hist.Node[r.name]; h != nil {
				vals = h.Values()
			}
			return table.Cell{Text: spark.Line(vals, 20, 100), Style: &st.Spark}
		case 5:
			return table.Cell{Text: fmt.Sprintf("%.0f%%", r.mem)}
		case 6:
			return table.Cell{Text: fmt.Sprintf("%.0fW", r.power)}
		case 7:
			return table.Cell{Text: fmt.Sprintf("%d°C", r.temp)}
		case 8:
			return table.Cell{Text: fmt.Sprint(r.ranks)}
		case 9:
			return table.Cell{Text: r.labels}
		case 10:
			if r.n.GetState() == api.NodeState_NODE_STATE_DOWN {
				return table.Cell{Text: r.n.GetDownReason()}
			}
			return table.Cell{Text: r.n.GetCordonReason()}
		}
		return table.Cell{}
	})
	return st.Dim.Render(head) + "\n" + body
}
