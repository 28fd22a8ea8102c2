// Package job is one job of the console: its placement and ranks with
// their collective state and lateness, an x-ray of its parallel groups
// (data-parallel replicas, pipeline stages, tensor groups, ranks), a stage
// × replica grid coloured by how late ranks enter collectives (or, before
// the server has measured that, by the time they spend inside them) so
// the straggler stands out, and the tail of a rank's log.
package job

import (
	"context"
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
	"github.com/gpuctl/gpuctl/tui/styles"
	"github.com/gpuctl/gpuctl/views"
)

// Refresh is how often the job's collectives are fetched again.
const Refresh = 2 * time.Second

// Tab is a part of the job view.
type Tab int

// The job view's tabs.
const (
	TabRanks Tab = iota
	TabXray
	TabGrid
	TabLogs
)

var tabNames = []string{"1 ranks", "2 x-ray", "3 grid", "4 logs"}

// KeyMap is the job view's keys.
type KeyMap struct {
	table.KeyMap
	Ranks, Xray, Grid, Logs, Follow, Node, Checkpoint, Restart, Cancel key.Binding
}

// ShortHelp implements help.KeyMap.
func (k KeyMap) ShortHelp() []key.Binding {
	return []key.Binding{k.Ranks, k.Xray, k.Grid, k.Logs, k.Node, k.Checkpoint, k.Restart, k.Cancel}
}

// FullHelp implements help.KeyMap.
func (k KeyMap) FullHelp() [][]key.Binding {
	return [][]key.Binding{{k.Up, k.Down, k.Ranks, k.Xray, k.Grid, k.Logs, k.Follow, k.Node}, {k.Checkpoint, k.Restart, k.Cancel}}
}

// RankState is what the console knows of one rank.
type RankState struct {
	Rank, TP, PP, DP int
	Node             string
	GPU, PID         uint32
	Exited           bool
	ExitCode         int32
	Op               string
	Seq              uint64
	// InCall is the share of wall time inside collectives since the
	// previous fetch (0..1), -1 before two fetches.
	InCall  float64
	Lagging bool
	// Late is how far after the median of its peers the rank enters
	// collectives (the server's rolling figure), -1 unknown; Slow is set
	// when a compute-slow finding names the rank.
	Late time.Duration
	Slow bool
}

// Coords places rank r of a tp·pp·dp job in its groups, by the rule the
// placer numbers ranks with (scheduler.Shape, Megatron-LM's order): tp
// innermost, then dp, then pp: r = tp + TP·(dp + DP·pp).
func Coords(r, tp, dp int) (t, d, p int) {
	tp, dp = max(tp, 1), max(dp, 1)
	return r % tp, (r / tp) % dp, r / (tp * dp)
}

// replicas is how many groups of tp ranks each pipeline stage has: the
// data-parallel replicas times the context-parallel ranks (Megatron's
// order puts cp between tp and dp), which the views show as replicas.
func replicas(p *api.JobPlan) int { return max(int(p.GetDp()), 1) * max(int(p.GetCp()), 1) }

// Model is the job view.
type Model struct {
	ctx  *app.Context
	key  string
	keys KeyMap
	tab  Tab
	tbl  table.Model
	// focus is the rank to select once the job is known (a stall jump).
	focus int

	gen       uint64
	colls     []*api.CollectiveStat
	prevCall  map[int32]float64
	prevAt    time.Time
	share     map[int32]float64
	collErr   error
	scroll    int
	logGen    uint64
	logCancel context.CancelFunc
	logRank   int32
	logLines  []string
	logErr    error
	follow    bool
}

// New returns the view of job key (an id or a name), with rank selected
// when it is not negative.
func New(ctx *app.Context, key string, rank int) *Model {
	k := KeyMap{KeyMap: table.DefaultKeyMap(),
		Ranks:      app.Bind("1", "ranks", "1"),
		Xray:       app.Bind("2", "x-ray", "2"),
		Grid:       app.Bind("3", "grid", "3"),
		Logs:       app.Bind("4/L", "logs of the rank", "4", "L"),
		Follow:     app.Bind("f", "follow logs", "f"),
		Node:       app.Bind("enter", "open the rank's node", "enter"),
		Checkpoint: app.Bind("C", "checkpoint", "C"),
		Restart:    app.Bind("R", "restart", "R"),
		Cancel:     app.Bind("ctrl+k", "cancel job", "ctrl+k"),
	}
	k.Mark.SetEnabled(false)
	k.Sort.SetEnabled(false)
	k.Reverse.SetEnabled(false)
	ctx.Gate(&k.Checkpoint, app.ActCheckpoint)
	ctx.Gate(&k.Restart, app.ActRestart)
	ctx.Gate(&k.Cancel, app.ActCancel)
	m := &Model{ctx: ctx, key: key, keys: k, focus: rank, follow: true, logRank: -1,
		tbl: table.New(rankColumns...), prevCall: map[int32]float64{}, share: map[int32]float64{}}
	m.tbl.SortCol = -1
	m.syncRows()
	return m
}

// rankColumns: PID and SEQ show from wideFrom cells (or with ctrl-w), so
// the lateness fits at 80.
var rankColumns = []table.Column{
	{Title: "RANK", Width: 5, Right: true}, {Title: "TP", Width: 3, Right: true}, {Title: "PP", Width: 3, Right: true},
	{Title: "DP", Width: 4, Right: true}, {Title: "NODE", Width: 14}, {Title: "GPU", Width: 3, Right: true},
	{Title: "PID", Width: 8, Right: true, Wide: true}, {Title: "STATE", Width: 8}, {Title: "OP", Width: 13},
	{Title: "SEQ", Width: 8, Right: true, Wide: true}, {Title: "LATE", Width: 9, Right: true}, {Title: "IN NCCL", Width: 0},
}

// wideFrom is the width from which every rank column shows.
const wideFrom = 100

// Job returns the job as the latest snapshot has it, or nil.
func (m *Model) Job() *api.Job { return m.ctx.Snap.Job(m.key) }

// Tab returns the tab shown.
func (m *Model) Tab() Tab { return m.tab }

// Name implements app.View.
func (m *Model) Name() string { return "job" }

// Title implements app.View.
func (m *Model) Title() string {
	if j := m.Job(); j != nil && j.GetName() != "" {
		return j.GetName()
	}
	return m.key
}

// KeyMap implements app.View.
func (m *Model) KeyMap() help.KeyMap { return m.keys }

// Init implements app.View.
func (m *Model) Init() tea.Cmd { return m.fetch() }

// Close implements app.Closer: it ends the log stream.
func (m *Model) Close() {
	if m.logCancel != nil {
		m.logCancel()
		m.logCancel = nil
	}
}

type collMsg struct {
	gen   uint64
	colls []*api.CollectiveStat
	err   error
}

type tickMsg struct{ gen uint64 }

func (m *Model) fetch() tea.Cmd {
	m.gen = m.ctx.NextGen()
	gen, cl := m.gen, m.ctx.Client
	id := m.key
	if j := m.Job(); j != nil {
		id = j.GetId()
	}
	return m.ctx.Task(func() tea.Msg {
		c, cancel := app.Request()
		defer cancel()
		cs, err := cl.Collectives(c, id, "")
		return collMsg{gen: gen, colls: cs, err: err}
	})
}

// Ranks returns every rank of the current placement, in rank order.
func (m *Model) Ranks() []RankState {
	j := m.Job()
	if j == nil {
		return nil
	}
	p := j.GetPlan()
	lag := map[int32]bool{}
	for _, s := range m.ctx.Snap.Stalls {
		if s.GetJob() == j.GetId() {
			for _, r := range s.GetLaggingRanks() {
				lag[r.GetRank()] = true
			}
		}
	}
	type last struct {
		op  string
		seq uint64
		at  int64
	}
	lastOp := map[int32]last{}
	for _, c := range m.colls {
		if l := lastOp[c.GetRank()]; c.GetLastUnixNano() >= l.at {
			lastOp[c.GetRank()] = last{c.GetOp().Short(), c.GetSeq(), c.GetLastUnixNano()}
		}
	}
	var out []RankState
	for _, pn := range j.GetPlacement() {
		for _, r := range pn.GetRanks() {
			t, d, pp := Coords(int(r.GetRank()), int(p.GetTp()), replicas(p))
			rs := RankState{Rank: int(r.GetRank()), TP: t, PP: pp, DP: d, Node: pn.GetNode(), GPU: r.GetGpu(), PID: r.GetPid(),
				Exited: r.GetExited(), ExitCode: r.GetExitCode(), InCall: -1, Lagging: lag[r.GetRank()], Late: -1,
				Slow: m.ctx.Slow.SlowRank(j.GetId(), r.GetRank()) != nil}
			if l, ok := m.ctx.Slow.Lateness(j.GetId(), r.GetRank()); ok {
				rs.Late = l
			}
			if l, ok := lastOp[r.GetRank()]; ok {
				rs.Op, rs.Seq = l.op, l.seq
			}
			if s, ok := m.share[r.GetRank()]; ok {
				rs.InCall = s
			}
			out = append(out, rs)
		}
	}
	sort.Slice(out, func(a, b int) bool { return out[a].Rank < out[b].Rank })
	return out
}

func (m *Model) syncRows() {
	rs := m.Ranks()
	m.tbl.SetRows(len(rs))
	if m.focus >= 0 && len(rs) > 0 {
		for i, r := range rs {
			if r.Rank == m.focus {
				m.tbl.Cursor = i
				m.tbl.Move(0)
			}
		}
		m.focus = -1
	}
}

// Update implements app.View.
func (m *Model) Update(msg tea.Msg) (app.View, tea.Cmd) {
	switch msg := msg.(type) {
	case app.SnapshotMsg:
		m.syncRows()
	case collMsg:
		if msg.gen != m.gen {
			return m, nil
		}
		m.collErr = msg.err
		if msg.err == nil {
			m.colls = msg.colls
			m.updateShare(m.ctx.Now())
		}
		gen := m.gen
		return m, m.ctx.Tick(Refresh, func(time.Time) tea.Msg { return tickMsg{gen: gen} })
	case tickMsg:
		if msg.gen == m.gen {
			return m, m.fetch()
		}
	case logMsg:
		return m, m.onLog(msg)
	case app.WheelMsg:
		if m.tab == TabLogs || m.tab == TabXray {
			m.scroll = max(m.scroll+msg.Delta, 0)
			m.follow = false
		} else {
			m.tbl.Scroll(msg.Delta)
		}
	case tea.KeyPressMsg:
		return m, m.onKey(msg)
	}
	return m, nil
}

func (m *Model) updateShare(now time.Time) {
	sum := map[int32]float64{}
	for _, c := range m.colls {
		sum[c.GetRank()] += c.GetInCallSeconds()
	}
	if m.prevAt.IsZero() {
		// Until a second fetch gives a rate, share is over the attempt so far.
		if st := m.Job().GetStartUnixNano(); st > 0 {
			if dt := now.Sub(time.Unix(0, st)).Seconds(); dt > 0 {
				for r, s := range sum {
					m.share[r] = min(max(s/dt, 0), 1)
				}
			}
		}
	} else {
		if dt := now.Sub(m.prevAt).Seconds(); dt > 0 {
			for r, s := range sum {
				if p, ok := m.prevCall[r]; ok {
					m.share[r] = min(max((s-p)/dt, 0), 1)
				}
			}
		}
	}
	m.prevCall, m.prevAt = sum, now
}

func (m *Model) onKey(k tea.KeyPressMsg) tea.Cmd {
	switch {
	case key.Matches(k, m.keys.Ranks):
		m.tab = TabRanks
		return nil
	case key.Matches(k, m.keys.Xray):
		m.tab, m.scroll = TabXray, 0
		return nil
	case key.Matches(k, m.keys.Grid):
		m.tab = TabGrid
		return nil
	case key.Matches(k, m.keys.Logs):
		m.tab = TabLogs
		return m.startLogs()
	case key.Matches(k, m.keys.Follow):
		m.follow = !m.follow
		m.scroll = 0
		return nil
	}
	if m.tab == TabLogs || m.tab == TabXray {
		switch k.String() {
		case "up", "k":
			m.scroll++
			m.follow = false
			return nil
		case "down", "j":
			m.scroll = max(m.scroll-1, 0)
			return nil
		}
	}
	if ok, _ := m.tbl.Update(k, m.keys.KeyMap, nil); ok {
		return nil
	}
	j := m.Job()
	if j == nil {
		return nil
	}
	switch {
	case key.Matches(k, m.keys.Node):
		if r, ok := m.selectedRank(); ok {
			node := r.Node
			return func() tea.Msg { return app.JumpMsg{Command: "node " + node} }
		}
	case key.Matches(k, m.keys.Checkpoint):
		return actions.Checkpoint(m.ctx, j)
	case key.Matches(k, m.keys.Restart):
		ex := j.GetExclude()
		for _, r := range m.Ranks() {
			if r.Lagging {
				ex = append(ex, r.Node)
			}
		}
		return actions.Restart(m.ctx, j, dedupe(ex))
	case key.Matches(k, m.keys.Cancel):
		return actions.Cancel(m.ctx, j)
	}
	return nil
}

func dedupe(s []string) []string {
	seen := map[string]bool{}
	var out []string
	for _, x := range s {
		if !seen[x] {
			seen[x] = true
			out = append(out, x)
		}
	}
	return out
}

func (m *Model) selectedRank() (RankState, bool) {
	rs := m.Ranks()
	if m.tbl.Cursor < len(rs) {
		return rs[m.tbl.Cursor], true
	}
	return RankState{}, false
}

// Render implements app.View.
func (m *Model) Render() string {
	st := m.ctx.Styles
	j := m.Job()
	if j == nil {
		return st.Crit.Render("job " + m.key + " is not known (any more); :jobs lists them")
	}
	var b strings.Builder
	b.WriteString(m.header(j))
	tabs := make([]string, len(tabNames))
	for i, t := range tabNames {
		if Tab(i) == m.tab {
			tabs[i] = st.ButtonFocus.Render(t)
		} else {
			tabs[i] = st.Button.Render(t)
		}
	}
	b.WriteString(strings.Join(tabs, " ") + "\n")
	h := m.ctx.Height - strings.Count(b.String(), "\n")
	switch m.tab {
	case TabRanks:
		b.WriteString(m.renderRanks(h))
	case TabXray:
		b.WriteString(m.renderXray(h))
	case TabGrid:
		b.WriteString(m.renderGrid(h))
	case TabLogs:
		b.WriteString(m.renderLogs(h))
	}
	return b.String()
}

func (m *Model) header(j *api.Job) string {
	st := m.ctx.Styles
	now := m.ctx.Now()
	p := j.GetPlan()
	state := app.JobState(j)
	if j.GetStalled() {
		state = st.Crit.Render(state + ", STALLED")
	}
	var b strings.Builder
	fmt.Fprintf(&b, "%s %s · %s · plan %s (%s) · attempt %d · restarts %d · goodput %s\n", st.Bold.Render(j.GetId()), j.GetName(),
		state, app.Plan(j), orDash(p.GetSource()), j.GetAttempt(), j.GetRestarts(), app.Percent(j.GetGoodput()))
	fmt.Fprintf(&b, "step %d · step time predicted %s measured %s · last checkpoint step %d (mean %s, advised every %s) · lost steps %d\n",
		j.GetStep(), app.Secs(p.GetStepSeconds()), app.Secs(p.GetMeasuredStepSeconds()), j.GetLastCheckpointStep(),
		app.Secs(j.GetCheckpointSeconds()), app.Secs(j.GetAdvisedCheckpointIntervalSeconds()), j.GetLostSteps())
	started := "-"
	if j.GetStartUnixNano() > 0 {
		started = app.Age(now, j.GetStartUnixNano()) + " ago"
	}
	fmt.Fprintf(&b, "started %s · master %s:%d · checkpoints %s · %s\n", started, orDash(j.GetMasterAddr()), j.GetMasterPort(),
		orDash(j.GetCheckpointDir()), orDash(firstNonEmpty(j.GetPendingReason(), j.GetReason())))
	if len(j.GetTypePlans()) > 0 {
		// A job allowing several GPU models: which it got and why.
		fmt.Fprintf(&b, "gpu type %s\n", views.TypeText(j))
	}
	return b.String()
}

func firstNonEmpty(s ...string) string {
	for _, x := range s {
		if x != "" {
			return x
		}
	}
	return ""
}

func orDash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}

func (m *Model) renderRanks(h int) string {
	st := m.ctx.Styles
	rs := m.Ranks()
	out := m.tbl.Render(st, m.ctx.Width, h, m.ctx.Wide || m.ctx.Width >= wideFrom, nil, func(i, c int) table.Cell {
		r := rs[i]
		switch c {
		case 0:
			if r.Lagging {
				return table.Cell{Text: fmt.Sprintf("L %d", r.Rank), Style: &st.Crit}
			}
			return table.Cell{Text: fmt.Sprint(r.Rank)}
		case 1:
			return table.Cell{Text: fmt.Sprint(r.TP)}
		case 2:
			return table.Cell{Text: fmt.Sprint(r.PP)}
		case 3:
			return table.Cell{Text: fmt.Sprint(r.DP)}
		case 4:
			return table.Cell{Text: r.Node}
		case 5:
			return table.Cell{Text: fmt.Sprint(r.GPU)}
		case 6:
			if r.PID == 0 {
				return table.Cell{Text: "-"}
			}
			return table.Cell{Text: fmt.Sprint(r.PID)}
		case 7:
			switch {
			case r.Exited:
				return table.Cell{Text: fmt.Sprintf("exit %d", r.ExitCode)}
			case r.PID == 0:
				return table.Cell{Text: "starting"}
			}
			return table.Cell{Text: "running", Style: &st.OK}
		case 8:
			return table.Cell{Text: orDash(r.Op)}
		case 9:
			return table.Cell{Text: fmt.Sprint(r.Seq)}
		case 10:
			return lateCell(st, r)
		case 11:
			if r.InCall < 0 {
				return table.Cell{Text: "-"}
			}
			return table.Cell{Text: fmt.Sprintf("%3.0f%% of wall time", r.InCall*100)}
		}
		return table.Cell{}
	})
	if m.collErr != nil {
		out += "\n" + st.FlashErr.Render("collectives: "+m.collErr.Error())
	}
	return out
}

// lateCell is a rank's lateness; a slow-rank finding says "slow" too, as
// colour alone does not carry.
func lateCell(st *styles.Styles, r RankState) table.Cell {
	switch {
	case r.Late < 0:
		return table.Cell{Text: "-"}
	case r.Slow:
		return table.Cell{Text: "slow " + app.Late(r.Late), Style: &st.Warn}
	}
	return table.Cell{Text: app.Late(r.Late)}
}

// Xray returns the job's parallel groups as an indented tree: replicas,
// stages, tensor groups, ranks.
func (m *Model) Xray() []string {
	j := m.Job()
	rs := m.Ranks()
	p := j.GetPlan()
	tp, pp, dp := max(int(p.GetTp()), 1), max(int(p.GetPp()), 1), replicas(p)
	by := map[[3]int]RankState{}
	for _, r := range rs {
		by[[3]int{r.DP, r.PP, r.TP}] = r
	}
	lines := []string{fmt.Sprintf("%s: %d ranks = tp %d × pp %d × dp %d (rank = tp + %d·(dp + %d·pp))", j.GetName(), len(rs), tp, pp, dp, tp, dp)}
	if cp := int(p.GetCp()); cp > 1 {
		lines[0] = fmt.Sprintf("%s: %d ranks = tp %d × pp %d × (cp %d · dp %d) (rank = tp + %d·(cp + %d·dp + %d·pp); a replica below is one cp rank of one dp replica)",
			j.GetName(), len(rs), tp, pp, cp, int(p.GetDp()), tp, cp, dp)
	}
	for d := range dp {
		lines = append(lines, fmt.Sprintf("├─ data-parallel replica %d", d))
		for s := range pp {
			lines = append(lines, fmt.Sprintf("│  ├─ pipeline stage %d", s))
			var parts []string
			for t := range tp {
				r, ok := by[[3]int{d, s, t}]
				if !ok {
					parts = append(parts, fmt.Sprintf("tp%d: not placed", t))
					continue
				}
				lag := ""
				if r.Lagging {
					lag = " LAGGING"
				}
				parts = append(parts, fmt.Sprintf("r%d %s/gpu%d pid %d%s", r.Rank, r.Node, r.GPU, r.PID, lag))
			}
			lines = append(lines, "│  │  └─ tensor group: "+strings.Join(parts, " · "))
		}
	}
	return lines
}

func (m *Model) renderXray(h int) string {
	lines := m.Xray()
	top := min(m.scroll, max(len(lines)-h, 0))
	end := min(top+h, len(lines))
	out := make([]string, 0, end-top)
	for _, l := range lines[top:end] {
		out = append(out, app.Trunc(l, m.ctx.Width))
	}
	return strings.Join(out, "\n")
}

// LateScale is the lateness the grid's hottest colour stands for.
const LateScale = 50 * time.Millisecond

// GroupCell is one tensor group of the grid: the largest share of wall
// time a rank spent inside collectives and the largest lateness (-1
// unknown), and whether a rank of it lags (a stall) or is slow (a
// finding).
type GroupCell struct {
	Share     float64
	Late      time.Duration
	Lag, Slow bool
}

// Grid returns the tensor groups by pipeline stage and data-parallel
// replica.
func (m *Model) Grid() [][]GroupCell {
	p := m.Job().GetPlan()
	pp, dp := max(int(p.GetPp()), 1), replicas(p)
	g := make([][]GroupCell, pp)
	for s := range pp {
		g[s] = make([]GroupCell, dp)
		for d := range dp {
			g[s][d] = GroupCell{Share: -1, Late: -1}
		}
	}
	for _, r := range m.Ranks() {
		if r.PP >= pp || r.DP >= dp {
			continue
		}
		c := &g[r.PP][r.DP]
		c.Share, c.Late = max(c.Share, r.InCall), max(c.Late, r.Late)
		c.Lag, c.Slow = c.Lag || r.Lagging, c.Slow || r.Slow
	}
	return g
}

// byLate reports whether any group has a lateness, so the grid shows
// lateness rather than the time inside collectives.
func byLate(g [][]GroupCell) bool {
	for _, row := range g {
		for _, c := range row {
			if c.Late >= 0 {
				return true
			}
		}
	}
	return false
}

func (m *Model) renderGrid(h int) string {
	st := m.ctx.Styles
	g := m.Grid()
	late := byLate(g)
	var b strings.Builder
	if late {
		b.WriteString(st.Dim.Render(fmt.Sprintf("ms after the median entry into collectives, worst rank per tensor group (stage × replica); colour to %s; S = slow rank, L = lagging", app.Late(LateScale))) + "\n")
	} else {
		b.WriteString(st.Dim.Render("time inside NCCL collectives per tensor group (stage × replica): the ranks the others wait for spend least; L = lagging") + "\n")
	}
	b.WriteString("       ")
	cols := min(len(g[0]), max((m.ctx.Width-8)/5, 1))
	for d := range cols {
		fmt.Fprintf(&b, "%5s", fmt.Sprintf("dp%d", d))
	}
	if cols < len(g[0]) {
		fmt.Fprintf(&b, "  +%d replicas", len(g[0])-cols)
	}
	for s := range min(len(g), max(h-3, 1)) {
		fmt.Fprintf(&b, "\n%-7s", fmt.Sprintf("pp%d", s))
		for d := range cols {
			txt, lv := gridCell(g[s][d], late)
			if st.Color {
				txt = bgSeq(lv) + txt + styles.Reset
			}
			b.WriteString(txt)
		}
	}
	return b.String()
}

// gridCell is a group's five cells and heat level: its lateness in ms
// (or its share inside collectives in %), marked S when slow, L when
// lagging.
func gridCell(c GroupCell, late bool) (string, int) {
	v, known := c.Share, c.Share >= 0
	txt := fmt.Sprintf(" %3.0f ", v*100)
	if late {
		v, known = float64(c.Late)/float64(LateScale), c.Late >= 0
		ms := min(float64(c.Late)/float64(time.Millisecond), 999)
		txt = fmt.Sprintf(" %3.0f ", ms)
		if c.Slow {
			txt = fmt.Sprintf("S%3.0f ", ms)
		}
	}
	lv := styles.Level(v)
	switch {
	case c.Lag:
		return "  L  ", styles.HeatFaulty
	case !known:
		return "   ? ", styles.HeatEmpty
	}
	return txt, lv
}

// bgSeq is the 256-colour background of a heat level.
func bgSeq(level int) string {
	palette := [...]int{17, 19, 26, 32, 37, 71, 148, 214, 202, 196, 201, 240, 236}
	return fmt.Sprintf("\x1b[97;48;5;%dm", palette[level])
}
