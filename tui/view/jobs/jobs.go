// Package jobs is the console's job table: state, plan, GPUs, progress
// with a steps-per-second sparkline, predicted and measured step time,
// checkpoints, restarts, goodput and why pending jobs wait.
package jobs

import (
	"cmp"
	"fmt"
	"slices"
	"strings"

	"charm.land/bubbles/v2/help"
	"charm.land/bubbles/v2/key"
	tea "charm.land/bubbletea/v2"

	"github.com/gpuctl/gpuctl/api"
	"github.com/gpuctl/gpuctl/client"
	"github.com/gpuctl/gpuctl/tui/actions"
	"github.com/gpuctl/gpuctl/tui/app"
	"github.com/gpuctl/gpuctl/tui/components/spark"
	"github.com/gpuctl/gpuctl/tui/components/table"
)

// KeyMap is the job table's keys.
type KeyMap struct {
	table.KeyMap
	Open, Checkpoint, Restart, Cancel, Assign, Submit, Rebalance key.Binding
}

// ShortHelp implements help.KeyMap.
func (k KeyMap) ShortHelp() []key.Binding {
	return []key.Binding{k.Open, k.Checkpoint, k.Restart, k.Cancel, k.Assign, k.Submit, k.Rebalance}
}

// FullHelp implements help.KeyMap.
func (k KeyMap) FullHelp() [][]key.Binding {
	return [][]key.Binding{k.KeyMap.Bindings(), {k.Open, k.Checkpoint, k.Restart, k.Cancel, k.Assign, k.Submit, k.Rebalance}}
}

// Model is the job table.
type Model struct {
	ctx    *app.Context
	keys   KeyMap
	tbl    table.Model
	filter string
	rows   []*api.Job
	// ckpt is each job's newest checkpoint event time.
	ckpt map[string]int64
}

var columns = []table.Column{
	{Title: "ID", Width: 8}, {Title: "NAME", Width: 16}, {Title: "STATE", Width: 10}, {Title: "PLAN", Width: 8},
	{Title: "GPUS", Width: 5, Right: true}, {Title: "STEP", Width: 7, Right: true}, {Title: "STEPS/S", Width: 12},
	{Title: "PRED", Width: 6, Right: true, Wide: true}, {Title: "MEAS", Width: 6, Right: true},
	{Title: "CKPT", Width: 12, Right: true}, {Title: "RST", Width: 3, Right: true}, {Title: "GOODPUT", Width: 7, Right: true},
	{Title: "WHY", Width: 0},
}

// New returns the job table.
func New(ctx *app.Context) *Model {
	k := KeyMap{KeyMap: table.DefaultKeyMap(),
		Open:       app.Bind("enter", "open job", "enter"),
		Checkpoint: app.Bind("C", "checkpoint", "C"),
		Restart:    app.Bind("R", "restart", "R"),
		Cancel:     app.Bind("ctrl+k", "cancel job", "ctrl+k"),
		Assign:     app.Bind("a", "assign to marked nodes", "a"),
		Submit:     app.Bind("N", "submit", "N"),
		Rebalance:  app.Bind("B", "rebalance", "B"),
	}
	ctx.Gate(&k.Checkpoint, app.ActCheckpoint)
	ctx.Gate(&k.Restart, app.ActRestart)
	ctx.Gate(&k.Cancel, app.ActCancel)
	ctx.Gate(&k.Assign, app.ActAssign)
	ctx.Gate(&k.Submit, app.ActSubmit)
	ctx.Gate(&k.Rebalance, app.ActRebalance)
	k.Mark.SetEnabled(false)
	m := &Model{ctx: ctx, keys: k, tbl: table.New(columns...)}
	m.tbl.SortCol = -1
	m.rebuild()
	return m
}

// Name implements app.View.
func (m *Model) Name() string { return "jobs" }

// Title implements app.View.
func (m *Model) Title() string { return "jobs" }

// Init implements app.View.
func (m *Model) Init() tea.Cmd { return nil }

// KeyMap implements app.View.
func (m *Model) KeyMap() help.KeyMap { return m.keys }

// SetFilter implements app.Filterer.
func (m *Model) SetFilter(s string) { m.filter = s; m.rebuild() }

// Filter implements app.Filterer.
func (m *Model) Filter() string { return m.filter }

// Selected returns the job under the cursor.
func (m *Model) Selected() *api.Job {
	if m.tbl.Cursor < len(m.rows) {
		return m.rows[m.tbl.Cursor]
	}
	return nil
}

// Select moves the cursor to job id.
func (m *Model) Select(id string) {
	for i, j := range m.rows {
		if j.GetId() == id || j.GetName() == id {
			m.tbl.Cursor = i
			m.tbl.Move(0)
		}
	}
}

// LastCheckpoints maps each job to its newest checkpoint event's time.
func LastCheckpoints(s *client.Snapshot) map[string]int64 {
	out := map[string]int64{}
	for _, e := range s.Events {
		if e.GetKind() == api.EventKind_EVENT_KIND_CHECKPOINT && e.GetJob() != "" {
			out[e.GetJob()] = max(out[e.GetJob()], e.GetTimeUnixNano())
		}
	}
	return out
}

func (m *Model) rebuild() {
	m.ckpt = LastCheckpoints(&m.ctx.Snap)
	f := strings.ToLower(m.filter)
	m.rows = m.rows[:0]
	for _, j := range m.ctx.Snap.Jobs {
		if f != "" && !strings.Contains(strings.ToLower(j.GetId()+" "+j.GetName()+" "+app.JobState(j)+" "+j.GetTenant()), f) {
			continue
		}
		m.rows = append(m.rows, j)
	}
	if c := m.tbl.SortCol; c >= 0 {
		slices.SortStableFunc(m.rows, func(a, b *api.Job) int {
			var o int
			switch columns[c].Title {
			case "NAME":
				o = cmp.Compare(a.GetName(), b.GetName())
			case "STATE":
				o = cmp.Compare(a.GetState(), b.GetState())
			case "GPUS":
				o = cmp.Compare(app.JobGPUs(a), app.JobGPUs(b))
			case "STEP", "STEPS/S":
				o = cmp.Compare(a.GetStep(), b.GetStep())
			case "MEAS", "PRED":
				o = cmp.Compare(a.GetPlan().GetMeasuredStepSeconds(), b.GetPlan().GetMeasuredStepSeconds())
			case "RST":
				o = cmp.Compare(a.GetRestarts(), b.GetRestarts())
			case "GOODPUT":
				o = cmp.Compare(a.GetGoodput(), b.GetGoodput())
			default:
				o = cmp.Compare(a.GetId(), b.GetId())
			}
			if m.tbl.SortDesc {
				return -o
			}
			return o
		})
	}
	m.tbl.SetRows(len(m.rows))
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
		if ok, resort := m.tbl.Update(msg, m.keys.KeyMap, nil); ok {
			if resort {
				m.rebuild()
			}
			return m, nil
		}
		if key.Matches(msg, m.keys.Submit) {
			return m, actions.Submit(m.ctx)
		}
		if key.Matches(msg, m.keys.Rebalance) {
			return m, actions.Rebalance(m.ctx)
		}
		j := m.Selected()
		if j == nil {
			return m, nil
		}
		switch {
		case key.Matches(msg, m.keys.Open):
			return m, m.open()
		case key.Matches(msg, m.keys.Checkpoint):
			return m, actions.Checkpoint(m.ctx, j)
		case key.Matches(msg, m.keys.Restart):
			return m, actions.Restart(m.ctx, j, j.GetExclude())
		case key.Matches(msg, m.keys.Cancel):
			return m, actions.Cancel(m.ctx, j)
		case key.Matches(msg, m.keys.Assign):
			return m, actions.Assign(m.ctx, j, m.markedNodes())
		}
	}
	return m, nil
}

// markedNodes are the nodes marked in the node table, if it is open below.
func (m *Model) markedNodes() []string {
	out := make([]string, 0, len(m.ctx.NodeMarks))
	for n := range m.ctx.NodeMarks {
		out = append(out, n)
	}
	slices.Sort(out)
	return out
}

func (m *Model) open() tea.Cmd {
	j := m.Selected()
	if j == nil {
		return nil
	}
	id := j.GetId()
	return func() tea.Msg { return app.JumpMsg{Command: "job " + id} }
}

// Render implements app.View.
func (m *Model) Render() string {
	st := m.ctx.Styles
	now := m.ctx.Now()
	head := fmt.Sprintf("%d jobs", len(m.rows))
	if m.filter != "" {
		head += fmt.Sprintf(" matching %q", m.filter)
	}
	body := m.tbl.Render(st, m.ctx.Width, m.ctx.Height-1, m.ctx.Wide, nil, func(i, c int) table.Cell {
		j := m.rows[i]
		p := j.GetPlan()
		switch c {
		case 0:
			return table.Cell{Text: j.GetId()}
		case 1:
			return table.Cell{Text: j.GetName()}
		case 2:
			s := app.JobState(j)
			if j.GetStalled() {
				return table.Cell{Text: s + "!", Style: &st.Crit}
			}
			switch j.GetState() {
			case api.JobState_JOB_STATE_RUNNING, api.JobState_JOB_STATE_SUCCEEDED:
				return table.Cell{Text: s, Style: &st.OK}
			case api.JobState_JOB_STATE_FAILED:
				return table.Cell{Text: s, Style: &st.Crit}
			case api.JobState_JOB_STATE_RECOVERING, api.JobState_JOB_STATE_PENDING:
				return table.Cell{Text: s, Style: &st.Warn}
			}
			return table.Cell{Text: s}
		case 3:
			return table.Cell{Text: app.Plan(j)}
		case 4:
			g := fmt.Sprint(app.JobGPUs(j))
			if f := j.GetFullGpus(); f > 0 && int(f) != app.JobGPUs(j) {
				g = fmt.Sprintf("%d/%d", app.JobGPUs(j), f)
			}
			return table.Cell{Text: g}
		case 5:
			return table.Cell{Text: fmt.Sprint(j.GetStep())}
		case 6:
			var v []float64
			if h := m.ctx.History.Job[j.GetId()]; h != nil {
				v = h.Rate.Values()
			}
			return table.Cell{Text: spark.Line(v, 12, 0), Style: &st.Spark}
		case 7:
			return table.Cell{Text: app.Secs(p.GetStepSeconds())}
		case 8:
			return table.Cell{Text: app.Secs(p.GetMeasuredStepSeconds())}
		case 9:
			if j.GetLastCheckpointStep() == 0 {
				return table.Cell{Text: "-"}
			}
			age := ""
			if t := m.ckpt[j.GetId()]; t > 0 {
				age = " " + app.Age(now, t)
			}
			return table.Cell{Text: fmt.Sprintf("%d%s", j.GetLastCheckpointStep(), age)}
		case 10:
			return table.Cell{Text: fmt.Sprint(j.GetRestarts())}
		case 11:
			return table.Cell{Text: app.Percent(j.GetGoodput())}
		case 12:
			if r := j.GetPendingReason(); r != "" && j.GetState() == api.JobState_JOB_STATE_PENDING {
				return table.Cell{Text: r}
			}
			return table.Cell{Text: j.GetReason()}
		}
		return table.Cell{}
	})
	return st.Dim.Render(head) + "\n" + body
}
