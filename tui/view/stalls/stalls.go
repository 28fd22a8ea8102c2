// Package stalls lists every live NCCL stall: the lagging ranks, the ranks
// waiting, how long, the last op and seq, and the per-peer flows of the
// lagging rank's node.
package stalls

import (
	"fmt"
	"sort"
	"strings"
	"time"

	"charm.land/bubbles/v2/help"
	"charm.land/bubbles/v2/key"
	tea "charm.land/bubbletea/v2"

	"github.com/gpuctl/gpuctl/api"
	"github.com/gpuctl/gpuctl/tui/actions"
	"github.com/gpuctl/gpuctl/tui/app"
	"github.com/gpuctl/gpuctl/tui/components/table"
)

// Refresh is how often the lagging node's flows are fetched again.
const Refresh = 2 * time.Second

// KeyMap is the stalls view's keys.
type KeyMap struct {
	table.KeyMap
	Jump, Restart key.Binding
}

// ShortHelp implements help.KeyMap.
func (k KeyMap) ShortHelp() []key.Binding { return []key.Binding{k.Up, k.Down, k.Jump, k.Restart} }

// FullHelp implements help.KeyMap.
func (k KeyMap) FullHelp() [][]key.Binding { return [][]key.Binding{{k.Up, k.Down, k.Jump, k.Restart}} }

// Model is the stalls view.
type Model struct {
	ctx   *app.Context
	keys  KeyMap
	tbl   table.Model
	gen   uint64
	node  string
	flows []*api.NetFlowSample
	err   error
}

var columns = []table.Column{
	{Title: "JOB", Width: 10}, {Title: "COMM", Width: 14}, {Title: "FOR", Width: 8, Right: true},
	{Title: "LAGGING", Width: 34}, {Title: "WAITING", Width: 0},
}

// New returns the stalls view.
func New(ctx *app.Context) *Model {
	k := KeyMap{KeyMap: table.DefaultKeyMap(),
		Jump:    app.Bind("enter", "go to the lagging rank", "enter"),
		Restart: app.Bind("R", "restart without the lagging node", "R"),
	}
	k.Mark.SetEnabled(false)
	ctx.Gate(&k.Restart, app.ActRestart)
	m := &Model{ctx: ctx, keys: k, tbl: table.New(columns...)}
	m.tbl.SortCol = -1
	m.tbl.SetRows(len(ctx.Snap.Stalls))
	return m
}

// Name implements app.View.
func (m *Model) Name() string { return "stalls" }

// Title implements app.View.
func (m *Model) Title() string { return "stalls" }

// KeyMap implements app.View.
func (m *Model) KeyMap() help.KeyMap { return m.keys }

// Init implements app.View.
func (m *Model) Init() tea.Cmd { return m.fetch() }

type flowsMsg struct {
	gen   uint64
	node  string
	flows []*api.NetFlowSample
	err   error
}

type tickMsg struct{ gen uint64 }

func (m *Model) selected() *api.Stall {
	ss := m.ctx.Snap.Stalls
	if m.tbl.Cursor < len(ss) {
		return ss[m.tbl.Cursor]
	}
	return nil
}

func (m *Model) fetch() tea.Cmd {
	s := m.selected()
	m.gen = m.ctx.NextGen()
	gen := m.gen
	if s == nil || len(s.GetLaggingRanks()) == 0 {
		m.node, m.flows = "", nil
		return m.ctx.Tick(Refresh, func(time.Time) tea.Msg { return tickMsg{gen: gen} })
	}
	node := s.GetLaggingRanks()[0].GetNode()
	cl := m.ctx.Client
	since := m.ctx.Now().Add(-10 * time.Second).UnixNano()
	return m.ctx.Task(func() tea.Msg {
		c, cancel := app.Request()
		defer cancel()
		var flows []*api.NetFlowSample
		err := cl.Observe(c, &api.ObserveRequest{Filter: &api.ObserveFilter{Node: node, Flows: true}, Last: 500, SinceUnixNano: since},
			func(b *api.ObserveBatch) error {
				for _, it := range b.GetItems() {
					if f := it.GetFlow(); f != nil {
						flows = append(flows, f)
					}
				}
				return nil
			})
		return flowsMsg{gen: gen, node: node, flows: flows, err: err}
	})
}

// Update implements app.View.
func (m *Model) Update(msg tea.Msg) (app.View, tea.Cmd) {
	switch msg := msg.(type) {
	case app.SnapshotMsg:
		m.tbl.SetRows(len(m.ctx.Snap.Stalls))
	case flowsMsg:
		if msg.gen != m.gen {
			return m, nil
		}
		m.node, m.flows, m.err = msg.node, msg.flows, msg.err
		gen := m.gen
		return m, m.ctx.Tick(Refresh, func(time.Time) tea.Msg { return tickMsg{gen: gen} })
	case tickMsg:
		if msg.gen == m.gen {
			return m, m.fetch()
		}
	case tea.KeyPressMsg:
		before := m.tbl.Cursor
		if ok, _ := m.tbl.Update(msg, m.keys.KeyMap, nil); ok {
			if before != m.tbl.Cursor {
				return m, m.fetch()
			}
			return m, nil
		}
		s := m.selected()
		if s == nil {
			return m, nil
		}
		switch {
		case key.Matches(msg, m.keys.Jump):
			cmd := "job " + s.GetJob()
			if lr := s.GetLaggingRanks(); len(lr) > 0 {
				cmd += fmt.Sprintf(" rank %d", lr[0].GetRank())
			}
			return m, func() tea.Msg { return app.JumpMsg{Command: cmd} }
		case key.Matches(msg, m.keys.Restart):
			j := m.ctx.Snap.Job(s.GetJob())
			if j == nil {
				return m, nil
			}
			var ex []string
			for _, r := range s.GetLaggingRanks() {
				ex = append(ex, r.GetNode())
			}
			return m, actions.Restart(m.ctx, j, ex)
		}
	}
	return m, nil
}

func rankText(r *api.StalledRank) string {
	where := "after"
	if r.GetInCall() {
		where = "in"
	}
	return fmt.Sprintf("r%d %s pid %d %s %s seq %d (%s)", r.GetRank(), r.GetNode(), r.GetPid(), where, r.GetOp().Short(), r.GetSeq(), r.GetProcState())
}

// Render implements app.View.
func (m *Model) Render() string {
	st := m.ctx.Styles
	now := m.ctx.Now()
	ss := m.ctx.Snap.Stalls
	if len(ss) == 0 {
		return st.OK.Render("no stall is live") + "\n" + st.Dim.Render("a stall is ranks of one communicator disagreeing on the collective seq, or all inside one call, past the limit learned from its cadence (at most the job's stall_threshold)")
	}
	h := min(len(ss)+1, max(m.ctx.Height/3, 2))
	var b strings.Builder
	b.WriteString(m.tbl.Render(st, m.ctx.Width, h, m.ctx.Wide, nil, func(i, c int) table.Cell {
		s := ss[i]
		switch c {
		case 0:
			return table.Cell{Text: s.GetJob()}
		case 1:
			return table.Cell{Text: fmt.Sprintf("%#x", s.GetComm())}
		case 2:
			return table.Cell{Text: app.Age(now, s.GetSinceUnixNano())}
		case 3:
			var p []string
			for _, r := range s.GetLaggingRanks() {
				p = append(p, fmt.Sprintf("r%d@%s", r.GetRank(), r.GetNode()))
			}
			if len(p) == 0 {
				return table.Cell{Text: "none named (network or GPU?)", Style: &st.Warn}
			}
			return table.Cell{Text: strings.Join(p, " "), Style: &st.Crit}
		case 4:
			var p []string
			for _, r := range s.GetWaitingRanks() {
				p = append(p, fmt.Sprint(r.GetRank()))
			}
			return table.Cell{Text: strings.Join(p, ",")}
		}
		return table.Cell{}
	}))
	s := m.selected()
	if s == nil {
		return b.String()
	}
	b.WriteString("\n\n" + st.Bold.Render("diagnosis: ") + s.GetDiagnosis())
	fmt.Fprintf(&b, "\nstalled %s (threshold %s)", app.Age(now, s.GetSinceUnixNano()), app.Duration(time.Duration(s.GetThresholdNs())))
	for _, r := range s.GetLaggingRanks() {
		b.WriteString("\n  lagging " + st.Crit.Render(rankText(r)))
	}
	for i, r := range s.GetWaitingRanks() {
		if i == 4 {
			fmt.Fprintf(&b, "\n  … %d more waiting", len(s.GetWaitingRanks())-4)
			break
		}
		b.WriteString("\n  waiting " + rankText(r))
	}
	b.WriteString("\n\n" + st.Header.Render("flows of "+orDash(m.node)+" (last 10 s, by peer)"))
	if m.err != nil {
		b.WriteString("\n" + st.FlashErr.Render(m.err.Error()))
	}
	for _, l := range flowLines(m.flows, m.ctx.Height-strings.Count(b.String(), "\n")-1) {
		b.WriteString("\n" + app.Trunc(l, m.ctx.Width))
	}
	return b.String()
}

// flowLines sums the flows per (pid, peer) and lists the busiest first.
func flowLines(flows []*api.NetFlowSample, n int) []string {
	type k struct {
		pid  uint32
		rank int32
		peer string
	}
	type v struct{ tx, rx, retr uint64 }
	agg := map[k]*v{}
	for _, f := range flows {
		kk := k{f.GetPid(), f.GetRank(), f.GetRemoteAddr()}
		if agg[kk] == nil {
			agg[kk] = &v{}
		}
		agg[kk].tx += f.GetTxBytes()
		agg[kk].rx += f.GetRxBytes()
		agg[kk].retr += f.GetRetransmits()
	}
	keys := make([]k, 0, len(agg))
	for kk := range agg {
		keys = append(keys, kk)
	}
	sort.Slice(keys, func(a, b int) bool {
		return agg[keys[a]].tx+agg[keys[a]].rx > agg[keys[b]].tx+agg[keys[b]].rx
	})
	if len(keys) == 0 {
		return []string{"  no flows seen (nodemon traces sockets with eBPF as root)"}
	}
	var out []string
	for i, kk := range keys {
		if i >= n {
			break
		}
		x := agg[kk]
		out = append(out, fmt.Sprintf("  pid %-7d rank %-4d → %-22s tx %-10s rx %-10s retransmits %d", kk.pid, kk.rank, kk.peer,
			app.Bytes(x.tx), app.Bytes(x.rx), x.retr))
	}
	return out
}

func orDash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}
