// Package contexts is the console's list of the client config's clusters
// (:ctx): the one followed is marked, enter follows another.
package contexts

import (
	"fmt"

	"charm.land/bubbles/v2/help"
	"charm.land/bubbles/v2/key"
	tea "charm.land/bubbletea/v2"

	"github.com/gpuctl/gpuctl/tui/app"
	"github.com/gpuctl/gpuctl/tui/components/table"
)

// KeyMap is the contexts view's keys.
type KeyMap struct {
	table.KeyMap
	Switch key.Binding
}

// ShortHelp implements help.KeyMap.
func (k KeyMap) ShortHelp() []key.Binding { return []key.Binding{k.Switch, k.Up, k.Down} }

// FullHelp implements help.KeyMap.
func (k KeyMap) FullHelp() [][]key.Binding {
	return [][]key.Binding{k.KeyMap.Bindings(), {k.Switch}}
}

// Model is the contexts view.
type Model struct {
	ctx  *app.Context
	keys KeyMap
	tbl  table.Model
}

var columns = []table.Column{{Title: "CURRENT", Width: 8}, {Title: "NAME", Width: 20}, {Title: "SERVER", Width: 0}}

// New returns the contexts view, its cursor on the context followed.
func New(ctx *app.Context) *Model {
	k := KeyMap{KeyMap: table.DefaultKeyMap(), Switch: app.Bind("enter", "follow this cluster", "enter")}
	k.Mark.SetEnabled(false)
	k.Sort.SetEnabled(false)
	k.Reverse.SetEnabled(false)
	m := &Model{ctx: ctx, keys: k, tbl: table.New(columns...)}
	m.tbl.SortCol = -1
	m.tbl.SetRows(len(ctx.Contexts))
	for i, c := range ctx.Contexts {
		if c.Name == ctx.Cluster {
			m.tbl.Move(i)
		}
	}
	return m
}

// Name implements app.View.
func (m *Model) Name() string { return "ctx" }

// Title implements app.View.
func (m *Model) Title() string { return "contexts" }

// Init implements app.View.
func (m *Model) Init() tea.Cmd { return nil }

// KeyMap implements app.View.
func (m *Model) KeyMap() help.KeyMap { return m.keys }

// Update implements app.View.
func (m *Model) Update(msg tea.Msg) (app.View, tea.Cmd) {
	switch msg := msg.(type) {
	case app.WheelMsg:
		m.tbl.Scroll(msg.Delta)
	case tea.KeyPressMsg:
		if ok, _ := m.tbl.Update(msg, m.keys.KeyMap, nil); ok {
			return m, nil
		}
		if key.Matches(msg, m.keys.Switch) && m.tbl.Cursor < len(m.ctx.Contexts) {
			name := m.ctx.Contexts[m.tbl.Cursor].Name
			return m, func() tea.Msg { return app.SwitchContextMsg{Name: name} }
		}
	}
	return m, nil
}

// Render implements app.View.
func (m *Model) Render() string {
	st := m.ctx.Styles
	head := fmt.Sprintf("%d contexts · enter follows one (this console only; gpuctl config use-context changes the default)", len(m.ctx.Contexts))
	if len(m.ctx.Contexts) == 0 {
		head = "the client config is one cluster: add others with gpuctl config add-context NAME --from FILE"
	}
	body := m.tbl.Render(st, m.ctx.Width, m.ctx.Height-1, m.ctx.Wide, nil, func(i, c int) table.Cell {
		ctx := m.ctx.Contexts[i]
		switch c {
		case 0:
			if ctx.Name == m.ctx.Cluster {
				return table.Cell{Text: "*", Style: &st.OK}
			}
			return table.Cell{}
		case 1:
			return table.Cell{Text: ctx.Name}
		case 2:
			return table.Cell{Text: ctx.Server}
		}
		return table.Cell{}
	})
	return st.Dim.Render(app.Trunc(head, m.ctx.Width)) + "\n" + body
}
