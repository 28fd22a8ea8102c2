// Package stalls lists every live NCCL stall (the lagging ranks, the ranks
// waiting, how long, the last op and seq) and every standing fail-slow
// finding (slow rank, slow link, slow job: who, how late or how much
// slower, the evidence) in one table, with the per-peer flows of the
// selected row's node.
package stalls

import (
	"fmt"
	"sort"
	"strings"
	"time"

	"charm.land/bubbles/v2/help"
	"charm.land/bubbles/v2/key"
	tea "charm.land/bubbletea/v2"
	"github.com/charmbracelet/x/ansi"

	"github.com/gpuctl/gpuctl/api"
	"github.com/gpuctl/gpuctl/tui/actions"
	"github.com/gpuctl/gpuctl/tui/app"
	"github.com/gpuctl/gpuctl/tui/components/table"
	"github.com/gpuctl/gpuctl/tui/styles"
)

// Refresh is how often the lagging node's flows are fetched again.
const Refresh = 2 * time.Second

// KeyMap is the stalls view's keys.
type KeyMap struct {
	table.KeyMap
	Jump, Flows, Restart key.Binding
}

// ShortHelp implements help.KeyMap.
func (k KeyMap) ShortHelp() []key.Binding {
	return []key.Binding{k.Up, k.Down, k.Jump, k.Flows, k.Restart}
}

// FullHelp implements help.KeyMap.
func (k KeyMap) FullHelp() [][]key.Binding {
	return [][]key.Binding{{k.Up, k.Down, k.Jump, k.Flows, k.Restart}}
}

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

// The columns: at 80 cells the communicator goes (the detail below names
// it) and who is slow gets less room; the last column takes the rest.
var (
	columns = []table.Column{
		{Title: "KIND", Width: 9}, {Title: "JOB", Width: 10}, {Title: "WHO", Width: 16}, {Title: "FOR", Width: 6, Right: true},
		{Title: "SIZE", Width: 11, Right: true}, {Title: "DETAIL", Width: 0},
	}
	wideColumns = []table.Column{
		{Title: "KIND", Width: 9}, {Title: "JOB", Width: 10}, {Title: "COMM", Width: 10}, {Title: "WHO", Width: 34},
		{Title: "FOR", Width: 7, Right: true}, {Title: "SIZE", Width: 11, Right: true}, {Title: "DETAIL", Width: 0},
	}
)

// wideFrom is the width from which the wide columns show.
const wideFrom = 120

// New returns the stalls view.
func New(ctx *app.Context) *Model {
	k := KeyMap{KeyMap: table.DefaultKeyMap(),
		Jump:    app.Bind("enter", "go to the lagging rank or the slow GPU", "enter"),
		Flows:   app.Bind("w", "the node's flows", "w"),
		Restart: app.Bind("R", "restart without the lagging or slow node", "R"),
	}
	k.Mark.SetEnabled(false)
	ctx.Gate(&k.Restart, app.ActRestart)
	m := &Model{ctx: ctx, keys: k, tbl: table.New(columns...)}
	m.tbl.SortCol = -1
	m.tbl.SetRows(m.rows())
	return m
}

// rows is the stalls, then the fail-slow findings.
func (m *Model) rows() int { return len(m.ctx.Snap.Stalls) + len(m.ctx.Slow.Findings) }

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

// selected is the stall or the finding under the cursor (one of them, or
// neither).
func (m *Model) selected() (*api.Stall, *api.SlowFinding) {
	return m.row(m.tbl.Cursor)
}

func (m *Model) row(i int) (*api.Stall, *api.SlowFinding) {
	ss, fs := m.ctx.Snap.Stalls, m.ctx.Slow.Findings
	switch {
	case i < len(ss):
		return ss[i], nil
	case i-len(ss) < len(fs):
		return nil, fs[i-len(ss)]
	}
	return nil, nil
}

// selectedNode is the node the selected row names: the first lagging
// rank's, the slow rank's or the slow link's.
func (m *Model) selectedNode() string {
	s, f := m.selected()
	if lr := s.GetLaggingRanks(); len(lr) > 0 {
		return lr[0].GetNode()
	}
	return f.GetNode()
}

func (m *Model) fetch() tea.Cmd {
	node := m.selectedNode()
	m.gen = m.ctx.NextGen()
	gen := m.gen
	if node == "" {
		m.node, m.flows = "", nil
		return m.ctx.Tick(Refresh, func(time.Time) tea.Msg { return tickMsg{gen: gen} })
	}
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
	case app.SnapshotMsg, app.SlowMsg:
		m.tbl.SetRows(m.rows())
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
		s, f := m.selected()
		if f != nil {
			return m, m.onFinding(msg, f)
		}
		if s == nil {
			return m, nil
		}
		switch {
		case key.Matches(msg, m.keys.Flows):
			return m, m.flowsOf(m.selectedNode())
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

// onFinding acts on a key on a fail-slow finding's row.
func (m *Model) onFinding(k tea.KeyPressMsg, f *api.SlowFinding) tea.Cmd {
	j := m.ctx.Snap.Job(f.GetJob())
	switch {
	case key.Matches(k, m.keys.Jump):
		cmd := app.SlowJump(j, f)
		return func() tea.Msg { return app.JumpMsg{Command: cmd} }
	case key.Matches(k, m.keys.Flows):
		return m.flowsOf(f.GetNode())
	case key.Matches(k, m.keys.Restart):
		if j == nil || f.GetNode() == "" || f.GetClass() == "job-wide" {
			return nil
		}
		return actions.Restart(m.ctx, j, []string{f.GetNode()})
	}
	return nil
}

func (m *Model) flowsOf(node string) tea.Cmd {
	if node == "" {
		return nil
	}
	return func() tea.Msg { return app.JumpMsg{Command: "flows " + node} }
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
	if m.rows() == 0 {
		return st.OK.Render("no stall is live and no rank or link runs slow") + "\n" +
			st.Dim.Render("a stall is ranks of one communicator disagreeing on the collective seq, or all inside one call, past the limit learned from its cadence (at most the job's stall_threshold)") + "\n" +
			st.Dim.Render("a slow rank enters collectives late most of the time; a slow link takes far longer than its baseline; a slow job's steps are slower than they were")
	}
	cols := columns
	if m.ctx.Wide || m.ctx.Width >= wideFrom {
		cols = wideColumns
	}
	m.tbl.Cols = cols
	h := min(m.rows()+1, max(m.ctx.Height/3, 2))
	var b strings.Builder
	b.WriteString(m.tbl.Render(st, m.ctx.Width, h, m.ctx.Wide, nil, func(i, c int) table.Cell {
		cell := stallCell
		s, f := m.row(i)
		if f != nil {
			cell = slowCell
		}
		return cell(st, now, s, f, cols[c].Title)
	}))
	s, f := m.selected()
	switch {
	case s != nil:
		m.stallDetail(&b, s)
	case f != nil:
		m.slowDetail(&b, f)
	default:
		return b.String()
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

// stallCell is a stall's cell of the column titled col.
func stallCell(st *styles.Styles, now time.Time, s *api.Stall, _ *api.SlowFinding, col string) table.Cell {
	switch col {
	case "KIND":
		return table.Cell{Text: "hang", Style: &st.Crit}
	case "JOB":
		return table.Cell{Text: s.GetJob()}
	case "COMM":
		return table.Cell{Text: fmt.Sprintf("%#x", s.GetComm())}
	case "FOR":
		return table.Cell{Text: app.Age(now, s.GetSinceUnixNano())}
	case "WHO":
		var p []string
		for _, r := range s.GetLaggingRanks() {
			p = append(p, fmt.Sprintf("r%d@%s", r.GetRank(), r.GetNode()))
		}
		if len(p) == 0 {
			return table.Cell{Text: "none named", Style: &st.Warn}
		}
		return table.Cell{Text: strings.Join(p, " "), Style: &st.Crit}
	case "SIZE":
		return table.Cell{Text: "limit " + app.Duration(time.Duration(s.GetThresholdNs()))}
	case "DETAIL":
		var p []string
		for _, r := range s.GetWaitingRanks() {
			p = append(p, fmt.Sprint(r.GetRank()))
		}
		return table.Cell{Text: "waiting: " + strings.Join(p, ",")}
	}
	return table.Cell{}
}

// slowCell is a finding's cell of the column titled col.
func slowCell(st *styles.Styles, now time.Time, _ *api.Stall, f *api.SlowFinding, col string) table.Cell {
	t := app.FindingText(f)
	switch col {
	case "KIND":
		return table.Cell{Text: t.Kind, Style: &st.Warn}
	case "JOB":
		return table.Cell{Text: f.GetJob()}
	case "COMM":
		if f.GetComm() < 0 {
			return table.Cell{Text: "-"}
		}
		// A creation index, where a stall shows the handle.
		return table.Cell{Text: fmt.Sprintf("#%d", f.GetComm())}
	case "FOR":
		return table.Cell{Text: app.Age(now, f.GetSinceUnixNano())}
	case "WHO":
		return table.Cell{Text: t.Who, Style: &st.Warn}
	case "SIZE":
		return table.Cell{Text: t.Size}
	case "DETAIL":
		return table.Cell{Text: t.Evidence}
	}
	return table.Cell{}
}

func (m *Model) stallDetail(b *strings.Builder, s *api.Stall) {
	st := m.ctx.Styles
	now := m.ctx.Now()
	b.WriteString("\n\n" + st.Bold.Render("diagnosis: ") + s.GetDiagnosis())
	fmt.Fprintf(b, "\nstalled %s (threshold %s)", app.Age(now, s.GetSinceUnixNano()), app.Duration(time.Duration(s.GetThresholdNs())))
	for _, r := range s.GetLaggingRanks() {
		b.WriteString("\n  lagging " + st.Crit.Render(rankText(r)))
	}
	for i, r := range s.GetWaitingRanks() {
		if i == 4 {
			fmt.Fprintf(b, "\n  … %d more waiting", len(s.GetWaitingRanks())-4)
			break
		}
		b.WriteString("\n  waiting " + rankText(r))
	}
}

func (m *Model) slowDetail(b *strings.Builder, f *api.SlowFinding) {
	st := m.ctx.Styles
	t := app.FindingText(f)
	j := m.ctx.Snap.Job(f.GetJob())
	// The evidence is the finding's point: wrapped, never cut.
	b.WriteString("\n\n" + ansi.Wordwrap(st.Bold.Render(t.Kind+" "+t.Who+":")+" "+t.Evidence, m.ctx.Width, ""))
	fmt.Fprintf(b, "\n%s of %s for %s: %s", f.GetClass(), f.GetJob(), app.Age(m.ctx.Now(), f.GetSinceUnixNano()), t.Size)
	if f.GetClass() == "compute-slow" {
		fmt.Fprintf(b, ", collectives %.2fx", f.GetSlowdown())
	}
	where := "enter: the job"
	if node, gpu, ok := app.SlowGPU(j, f); ok {
		where = fmt.Sprintf("enter: %s GPU %d (clocks, throttle)", node, gpu)
	} else if f.GetClass() == "communication-slow" && f.GetNode() != "" {
		where = "enter: flows of " + f.GetNode()
	}
	if f.GetNode() != "" {
		where += " · w: flows of " + f.GetNode()
	}
	b.WriteString("\n" + st.Dim.Render(app.Trunc(where, m.ctx.Width)))
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
