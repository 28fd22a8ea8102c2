// Package events is the console's event stream: filterable by node, job,
// kind and severity, with the XID catalog's action for GPU errors, and a
// follow mode that keeps the newest in view.
package events

import (
	"fmt"
	"strings"

	"charm.land/bubbles/v2/help"
	"charm.land/bubbles/v2/key"
	tea "charm.land/bubbletea/v2"

	"github.com/gpuctl/gpuctl/api"
	"github.com/gpuctl/gpuctl/tui/app"
	"github.com/gpuctl/gpuctl/tui/components/table"
)

// KeyMap is the events view's keys.
type KeyMap struct {
	table.KeyMap
	Follow, Open key.Binding
}

// ShortHelp implements help.KeyMap.
func (k KeyMap) ShortHelp() []key.Binding { return []key.Binding{k.Follow, k.Open, k.Up, k.Down} }

// FullHelp implements help.KeyMap.
func (k KeyMap) FullHelp() [][]key.Binding {
	return [][]key.Binding{k.KeyMap.Bindings(), {k.Follow, k.Open}}
}

// Model is the events view.
type Model struct {
	ctx    *app.Context
	keys   KeyMap
	tbl    table.Model
	filter string
	f      Filter
	rows   []*api.Event
	follow bool
}

// Filter is a parsed event filter: node:, job:, kind:, sev: terms and
// free text, all of which must match.
type Filter struct {
	Node, Job, Kind, Severity string
	Text                      []string
}

// ParseFilter reads "node:node-01 kind:xid sev:critical timeout".
func ParseFilter(s string) Filter {
	var f Filter
	for _, w := range strings.Fields(strings.ToLower(s)) {
		k, v, ok := strings.Cut(w, ":")
		switch {
		case ok && k == "node":
			f.Node = v
		case ok && k == "job":
			f.Job = v
		case ok && k == "kind":
			f.Kind = v
		case ok && (k == "sev" || k == "severity"):
			f.Severity = v
		default:
			f.Text = append(f.Text, w)
		}
	}
	return f
}

// Match reports whether e passes the filter.
func (f Filter) Match(e *api.Event) bool {
	if f.Node != "" && !strings.Contains(strings.ToLower(e.GetNode()), f.Node) {
		return false
	}
	if f.Job != "" && !strings.Contains(strings.ToLower(e.GetJob()), f.Job) {
		return false
	}
	if f.Kind != "" && e.GetKind().Short() != f.Kind {
		return false
	}
	if f.Severity != "" && e.GetSeverity().Short() != f.Severity {
		return false
	}
	msg := strings.ToLower(e.GetMessage())
	for _, t := range f.Text {
		if !strings.Contains(msg, t) {
			return false
		}
	}
	return true
}

var columns = []table.Column{
	{Title: "AGE", Width: 7, Right: true}, {Title: "SEV", Width: 8}, {Title: "KIND", Width: 12}, {Title: "NODE", Width: 12},
	{Title: "JOB", Width: 10}, {Title: "MESSAGE", Width: 0}, {Title: "ACTION", Width: 24},
}

// New returns the events view, following.
func New(ctx *app.Context) *Model {
	k := KeyMap{KeyMap: table.DefaultKeyMap(),
		Follow: app.Bind("f", "follow", "f"),
		Open:   app.Bind("enter", "open the event's node or job", "enter"),
	}
	k.Mark.SetEnabled(false)
	k.Sort.SetEnabled(false)
	k.Reverse.SetEnabled(false)
	m := &Model{ctx: ctx, keys: k, tbl: table.New(columns...), follow: true}
	m.tbl.SortCol = -1
	m.rebuild()
	return m
}

// Name implements app.View.
func (m *Model) Name() string { return "events" }

// Title implements app.View.
func (m *Model) Title() string { return "events" }

// Init implements app.View.
func (m *Model) Init() tea.Cmd { return nil }

// KeyMap implements app.View.
func (m *Model) KeyMap() help.KeyMap { return m.keys }

// SetFilter implements app.Filterer.
func (m *Model) SetFilter(s string) { m.filter, m.f = s, ParseFilter(s); m.rebuild() }

// Filter implements app.Filterer.
func (m *Model) Filter() string { return m.filter }

// Rows returns the events shown, oldest first.
func (m *Model) Rows() []*api.Event { return m.rows }

// Following reports whether the view follows new events.
func (m *Model) Following() bool { return m.follow }

func (m *Model) rebuild() {
	m.rows = m.rows[:0]
	for _, e := range m.ctx.Snap.Events {
		if m.f.Match(e) {
			m.rows = append(m.rows, e)
		}
	}
	m.tbl.SetRows(len(m.rows))
	if m.follow {
		m.tbl.Move(len(m.rows))
	}
}

// Update implements app.View.
func (m *Model) Update(msg tea.Msg) (app.View, tea.Cmd) {
	switch msg := msg.(type) {
	case app.SnapshotMsg:
		m.rebuild()
	case app.WheelMsg:
		m.tbl.Scroll(msg.Delta)
		m.follow = false
	case tea.KeyPressMsg:
		if key.Matches(msg, m.keys.Follow) {
			m.follow = !m.follow
			m.rebuild()
			return m, nil
		}
		if ok, _ := m.tbl.Update(msg, m.keys.KeyMap, nil); ok {
			m.follow = m.tbl.Cursor == len(m.rows)-1
			return m, nil
		}
		if key.Matches(msg, m.keys.Open) && m.tbl.Cursor < len(m.rows) {
			e := m.rows[m.tbl.Cursor]
			cmd := ""
			switch {
			case e.GetJob() != "":
				cmd = "job " + e.GetJob()
			case e.GetNode() != "":
				cmd = "node " + e.GetNode()
			}
			if cmd != "" {
				return m, func() tea.Msg { return app.JumpMsg{Command: cmd} }
			}
		}
	}
	return m, nil
}

// Render implements app.View.
func (m *Model) Render() string {
	st := m.ctx.Styles
	now := m.ctx.Now()
	head := fmt.Sprintf("%d events", len(m.rows))
	if m.filter != "" {
		head += fmt.Sprintf(" matching %q", m.filter)
	}
	if m.follow {
		head += " · following"
	}
	head += " · / filters: node:N job:J kind:xid sev:critical text"
	body := m.tbl.Render(st, m.ctx.Width, m.ctx.Height-1, m.ctx.Wide, nil, func(i, c int) table.Cell {
		e := m.rows[i]
		switch c {
		case 0:
			return table.Cell{Text: app.Age(now, e.GetTimeUnixNano())}
		case 1:
			s := e.GetSeverity().Short()
			switch e.GetSeverity() {
			case api.Severity_SEVERITY_CRITICAL:
				return table.Cell{Text: s, Style: &st.Crit}
			case api.Severity_SEVERITY_WARNING:
				return table.Cell{Text: s, Style: &st.Warn}
			}
			return table.Cell{Text: s}
		case 2:
			k := e.GetKind().Short()
			if e.GetKind() == api.EventKind_EVENT_KIND_XID {
				k = fmt.Sprintf("xid %d", e.GetXid())
			}
			return table.Cell{Text: k}
		case 3:
			return table.Cell{Text: orDash(e.GetNode())}
		case 4:
			return table.Cell{Text: orDash(e.GetJob())}
		case 5:
			return table.Cell{Text: e.GetMessage()}
		case 6:
			if e.GetKind() == api.EventKind_EVENT_KIND_XID || e.GetXidClass() != api.XIDClass_XID_CLASS_UNSPECIFIED {
				return table.Cell{Text: e.GetXidClass().Action(), Style: &st.Warn}
			}
			return table.Cell{Text: ""}
		}
		return table.Cell{}
	})
	return st.Dim.Render(app.Trunc(head, m.ctx.Width)) + "\n" + body
}

func orDash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}
