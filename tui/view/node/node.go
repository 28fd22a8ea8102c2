// Package node is one node of the console: a row per GPU with inline bars
// and sparklines, clocks, throttle reasons, ECC and XID state, the
// processes on each GPU with their job and rank, and the node's events.
package node

import (
	"fmt"
	"strings"
	"time"

	"charm.land/bubbles/v2/help"
	"charm.land/bubbles/v2/key"
	tea "charm.land/bubbletea/v2"

	"github.com/gpuctl/gpuctl/api"
	"github.com/gpuctl/gpuctl/tui/actions"
	"github.com/gpuctl/gpuctl/tui/app"
	"github.com/gpuctl/gpuctl/tui/components/spark"
	"github.com/gpuctl/gpuctl/tui/components/table"
)

// KeyMap is the node view's keys.
type KeyMap struct {
	table.KeyMap
	Open, Cordon, Uncordon, Drain, Fault key.Binding
}

// ShortHelp implements help.KeyMap.
func (k KeyMap) ShortHelp() []key.Binding {
	return []key.Binding{k.Open, k.Cordon, k.Uncordon, k.Drain, k.Fault}
}

// FullHelp implements help.KeyMap.
func (k KeyMap) FullHelp() [][]key.Binding {
	return [][]key.Binding{{k.Up, k.Down, k.Open}, {k.Cordon, k.Uncordon, k.Drain, k.Fault}}
}

// Model is the node view.
type Model struct {
	ctx  *app.Context
	name string
	keys KeyMap
	tbl  table.Model
}

var columns = []table.Column{
	{Title: "GPU", Width: 3, Right: true}, {Title: "UTIL", Width: 13}, {Title: "UTIL~", Width: 8},
	{Title: "MEM", Width: 13}, {Title: "POWER", Width: 8}, {Title: "TEMP", Width: 5},
	{Title: "SM/MEM MHZ", Width: 10, Wide: true}, {Title: "NVLINK", Width: 10}, {Title: "PCIE", Width: 10, Wide: true},
	{Title: "ECC/XID", Width: 9}, {Title: "RANKS", Width: 0},
}

// New returns the view of node name.
func New(ctx *app.Context, name string) *Model {
	k := KeyMap{KeyMap: table.DefaultKeyMap(),
		Open:     app.Bind("enter", "GPU history", "enter"),
		Cordon:   app.Bind("c", "cordon", "c"),
		Uncordon: app.Bind("u", "uncordon", "u"),
		Drain:    app.Bind("d", "drain", "d"),
		Fault:    app.Bind("F", "inject fault (simulated)", "F"),
	}
	ctx.Gate(&k.Cordon, app.ActCordon)
	ctx.Gate(&k.Uncordon, app.ActUncordon)
	ctx.Gate(&k.Drain, app.ActDrain)
	ctx.Gate(&k.Fault, app.ActFault)
	m := &Model{ctx: ctx, name: name, keys: k, tbl: table.New(columns...)}
	m.tbl.SortCol = -1
	m.refresh()
	return m
}

func (m *Model) node() *api.NodeStatus { return m.ctx.Snap.Node(m.name) }

func (m *Model) refresh() {
	n := m.node()
	m.tbl.SetRows(len(n.GetGpus()))
	if n != nil {
		m.keys.Fault.SetEnabled(m.ctx.Can(app.ActFault) && app.Simulated(n))
	}
}

// Name implements app.View.
func (m *Model) Name() string { return "node" }

// Title implements app.View.
func (m *Model) Title() string { return m.name }

// Init implements app.View.
func (m *Model) Init() tea.Cmd { return nil }

// KeyMap implements app.View.
func (m *Model) KeyMap() help.KeyMap { return m.keys }

// Cursor returns the selected GPU index.
func (m *Model) Cursor() int { return m.tbl.Cursor }

// Update implements app.View.
func (m *Model) Update(msg tea.Msg) (app.View, tea.Cmd) {
	switch msg := msg.(type) {
	case app.SnapshotMsg:
		m.refresh()
	case app.ClickMsg:
		if y := msg.Y - headerLines; y >= 1 {
			before := m.tbl.Cursor
			m.tbl.Click(msg.X, y, m.ctx.Width, m.ctx.Wide)
			if before == m.tbl.Cursor {
				return m, m.open()
			}
		}
	case tea.KeyPressMsg:
		if ok, _ := m.tbl.Update(msg, m.keys.KeyMap, nil); ok {
			return m, nil
		}
		n := m.node()
		if n == nil {
			return m, nil
		}
		switch {
		case key.Matches(msg, m.keys.Open):
			return m, m.open()
		case key.Matches(msg, m.keys.Cordon):
			return m, actions.Cordon(m.ctx, []string{m.name}, "cordon")
		case key.Matches(msg, m.keys.Uncordon):
			return m, actions.Cordon(m.ctx, []string{m.name}, "uncordon")
		case key.Matches(msg, m.keys.Drain):
			return m, actions.Cordon(m.ctx, []string{m.name}, "drain")
		case key.Matches(msg, m.keys.Fault):
			return m, actions.Fault(m.ctx, n, m.tbl.Cursor)
		}
	}
	return m, nil
}

func (m *Model) open() tea.Cmd {
	if m.node() == nil {
		return nil
	}
	cmd := fmt.Sprintf("gpu %s %d", m.name, m.tbl.Cursor)
	return func() tea.Msg { return app.JumpMsg{Command: cmd} }
}

const headerLines = 3

// rankKey finds a process's job and rank.
type rankKey struct{ job, rank string }

func (m *Model) ranksByPID() map[uint32]rankKey {
	out := map[uint32]rankKey{}
	for _, j := range m.ctx.Snap.Jobs {
		for _, pn := range j.GetPlacement() {
			if pn.GetNode() != m.name {
				continue
			}
			for _, r := range pn.GetRanks() {
				if r.GetPid() != 0 {
					out[r.GetPid()] = rankKey{j.GetName(), fmt.Sprint(r.GetRank())}
				}
			}
		}
	}
	return out
}

func (m *Model) ranksByGPU() map[uint32][]string {
	out := map[uint32][]string{}
	for _, j := range m.ctx.Snap.Jobs {
		for _, pn := range j.GetPlacement() {
			if pn.GetNode() != m.name {
				continue
			}
			for _, r := range pn.GetRanks() {
				out[r.GetGpu()] = append(out[r.GetGpu()], fmt.Sprintf("%s/r%d pid %d", j.GetName(), r.GetRank(), r.GetPid()))
			}
		}
	}
	return out
}

// Render implements app.View.
func (m *Model) Render() string {
	st := m.ctx.Styles
	n := m.node()
	if n == nil {
		return st.Crit.Render("node " + m.name + " is not in the cluster (any more)")
	}
	now := m.ctx.Now()
	reg := n.GetRegistration()
	var b strings.Builder
	badge := app.NodeBadge(n, now)
	bs := st.OK
	switch badge {
	case "down", "faulty":
		bs = st.Crit
	case "cordoned", "draining", "suspect":
		bs = st.Warn
	}
	fmt.Fprintf(&b, "%s %s  %s · since %s · last seen %s ago · %s\n", st.Bold.Render(m.name), bs.Render("["+badge+"]"),
		app.Labels(reg.GetLabels()), app.Age(now, n.GetStateSinceUnixNano()), app.Age(now, n.GetLastSeenUnixNano()), n.GetRemoteAddr())
	sim := ""
	if reg.GetSimProfile() != "" {
		sim = " · simulated " + reg.GetSimProfile()
	}
	fmt.Fprintf(&b, "driver %s · CUDA %s · nodemon %s%s · lost: %d collectives, %d net events, %d batches\n",
		dash(reg.GetDriverVersion()), dash(reg.GetCudaVersion()), dash(reg.GetAgentVersion()), sim,
		n.GetLostCollectives(), n.GetLostNetEvents(), n.GetDroppedBatches())
	note := ""
	switch {
	case n.GetState() == api.NodeState_NODE_STATE_DOWN:
		note = st.Crit.Render("down: " + n.GetDownReason() + " — figures are the last the node sent")
	case app.Cordoned(n):
		note = st.Warn.Render("cordoned: " + dash(n.GetCordonReason()))
	case app.Suspect(n, now):
		note = st.Warn.Render(fmt.Sprintf("suspect until %s (%s ahead): %s; lost %d× within the window; no queued work until then, unless a validation gang passes here",
			time.Unix(0, n.GetSuspectUntilUnixNano()).UTC().Format("15:04:05"), app.Duration(time.Unix(0, n.GetSuspectUntilUnixNano()).Sub(now)),
			dash(n.GetSuspectReason()), len(n.GetLostUnixNano())))
	}
	b.WriteString(note + "\n")
	gpus := n.GetGpus()
	hist := m.ctx.History.GPU[m.name]
	byGPU := m.ranksByGPU()
	tblH := min(len(gpus)+2, max(m.ctx.Height-headerLines-6, 3))
	b.WriteString(m.tbl.Render(st, m.ctx.Width, tblH, m.ctx.Wide, nil, func(i, c int) table.Cell {
		g := gpus[i]
		l := g.GetLast()
		switch c {
		case 0:
			return table.Cell{Text: fmt.Sprint(g.GetInfo().GetIndex())}
		case 1:
			return table.Cell{Text: fmt.Sprintf("%s %3d%%", spark.Bar(float64(l.GetUtilGpuPercent())/100, 8), l.GetUtilGpuPercent()), Style: &st.Bar}
		case 2:
			var v []float64
			if i < len(hist) {
				v = hist[i].Util.Values()
			}
			return table.Cell{Text: spark.Line(v, 8, 100), Style: &st.Spark}
		case 3:
			f := 0.0
			if t := l.GetMemTotalBytes(); t > 0 {
				f = float64(l.GetMemUsedBytes()) / float64(t)
			}
			return table.Cell{Text: fmt.Sprintf("%s %3.0f%%", spark.Bar(f, 8), f*100), Style: &st.Bar}
		case 4:
			lim := g.GetInfo().GetPowerLimitMw()
			if lim == 0 {
				return table.Cell{Text: fmt.Sprintf("%dW", l.GetPowerMw()/1000)}
			}
			return table.Cell{Text: fmt.Sprintf("%d/%d", l.GetPowerMw()/1000, lim/1000)}
		case 5:
			s := fmt.Sprintf("%d°C", l.GetTempC())
			if len(l.GetThrottleNames()) > 0 {
				return table.Cell{Text: s, Style: &st.Warn}
			}
			return table.Cell{Text: s}
		case 6:
			return table.Cell{Text: fmt.Sprintf("%d/%d", l.GetSmClockMhz(), l.GetMemClockMhz())}
		case 7:
			return table.Cell{Text: app.Rate(l.GetNvlinkTxBytesPerSec() + l.GetNvlinkRxBytesPerSec())}
		case 8:
			return table.Cell{Text: app.Rate(l.GetPcieTxBytesPerSec() + l.GetPcieRxBytesPerSec())}
		case 9:
			if app.GPUFaulty(g) {
				return table.Cell{Text: "FAULT", Style: &st.Crit}
			}
			e := l.GetEcc()
			return table.Cell{Text: fmt.Sprintf("%d/%d", e.GetVolatileCorrected(), e.GetVolatileUncorrected())}
		case 10:
			return table.Cell{Text: dash(strings.Join(byGPU[g.GetInfo().GetIndex()], " "))}
		}
		return table.Cell{}
	}))
	if m.tbl.Cursor < len(gpus) {
		g := gpus[m.tbl.Cursor]
		l := g.GetLast()
		fmt.Fprintf(&b, "\n%s GPU %d %s %s · throttle: %s", st.Bold.Render("›"), g.GetInfo().GetIndex(), g.GetInfo().GetModel(),
			g.GetInfo().GetPciBusId(), dash(strings.Join(l.GetThrottleNames(), ",")))
		if !g.GetHealthy() {
			b.WriteString(" · " + st.Crit.Render("unhealthy: "+g.GetUnhealthyReason()))
		}
		pids := m.ranksByPID()
		var procs []string
		for _, p := range l.GetProcesses() {
			s := fmt.Sprintf("pid %d %s %s", p.GetPid(), p.GetName(), app.Bytes(p.GetUsedMemBytes()))
			if rk, ok := pids[p.GetPid()]; ok {
				s += " (" + rk.job + " rank " + rk.rank + ")"
			}
			procs = append(procs, s)
		}
		b.WriteString("\n  processes: " + dash(strings.Join(procs, "; ")))
	}
	b.WriteString("\n" + st.Header.Render("recent events"))
	room := m.ctx.Height - strings.Count(b.String(), "\n") - 1
	evs := m.events(room)
	for _, e := range evs {
		b.WriteString("\n" + eventLine(now, e, m.ctx.Width))
	}
	if len(evs) == 0 {
		b.WriteString("\n" + st.Dim.Render("  none kept"))
	}
	return b.String()
}

func (m *Model) events(n int) []*api.Event {
	var out []*api.Event
	evs := m.ctx.Snap.Events
	for i := len(evs) - 1; i >= 0 && len(out) < n; i-- {
		if evs[i].GetNode() == m.name {
			out = append(out, evs[i])
		}
	}
	return out
}

func eventLine(now time.Time, e *api.Event, width int) string {
	s := fmt.Sprintf("  %s ago %-8s %-12s %s", app.Age(now, e.GetTimeUnixNano()), e.GetSeverity().Short(), e.GetKind().Short(), e.GetMessage())
	return app.Trunc(s, width)
}

func dash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}
