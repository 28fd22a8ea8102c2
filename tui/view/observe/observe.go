// Package observe is the live NCCL call and flow stream of `gpuctl
// observe` in a scrolling pane, with pause and filters.
package observe

import (
	"context"
	"fmt"
	"strings"
	"time"

	"charm.land/bubbles/v2/help"
	"charm.land/bubbles/v2/key"
	tea "charm.land/bubbletea/v2"

	"github.com/gpuctl/gpuctl/api"
	"github.com/gpuctl/gpuctl/tui/app"
)

// MaxLines bounds the lines the pane keeps.
const MaxLines = 5000

// KeyMap is the observe view's keys.
type KeyMap struct {
	Pause, Collectives, Flows, Up, Down, Clear key.Binding
}

// ShortHelp implements help.KeyMap.
func (k KeyMap) ShortHelp() []key.Binding {
	return []key.Binding{k.Pause, k.Collectives, k.Flows, k.Clear}
}

// FullHelp implements help.KeyMap.
func (k KeyMap) FullHelp() [][]key.Binding {
	return [][]key.Binding{{k.Pause, k.Collectives, k.Flows, k.Up, k.Down, k.Clear}}
}

// Model is the observe view.
type Model struct {
	ctx    *app.Context
	keys   KeyMap
	filter string
	req    *api.ObserveRequest
	gen    uint64
	cancel context.CancelFunc
	lines  []string
	paused bool
	// held counts lines that arrived while paused.
	held        int
	scroll      int
	lost        [2]uint64
	err         error
	colls, flow bool
	// node fixes the stream to one node's (:flows), beside the filter.
	node string
}

// New returns the observe view; Init starts the stream.
func New(ctx *app.Context) *Model {
	k := KeyMap{
		Pause:       app.Bind("p", "pause", "p", "space"),
		Collectives: app.Bind("c", "collectives on/off", "c"),
		Flows:       app.Bind("w", "flows on/off", "w"),
		Up:          app.Bind("↑/k", "scroll up", "up", "k"),
		Down:        app.Bind("↓/j", "scroll down", "down", "j"),
		Clear:       app.Bind("x", "clear", "x"),
	}
	return &Model{ctx: ctx, keys: k, colls: true, flow: true}
}

// Flows returns the observe view of one node's flows only (:flows NODE),
// where a slow link or a slow rank's host is looked at.
func Flows(ctx *app.Context, node string) *Model {
	m := New(ctx)
	m.colls, m.node = false, node
	return m
}

// Name implements app.View.
func (m *Model) Name() string { return "observe" }

// Title implements app.View.
func (m *Model) Title() string {
	if m.node != "" {
		return "flows of " + m.node
	}
	return "observe"
}

// KeyMap implements app.View.
func (m *Model) KeyMap() help.KeyMap { return m.keys }

// Init implements app.View.
func (m *Model) Init() tea.Cmd { return m.restart() }

// Close implements app.Closer.
func (m *Model) Close() {
	if m.cancel != nil {
		m.cancel()
		m.cancel = nil
	}
}

// SetFilter implements app.Filterer: node:N job:J op:allreduce rank:R
// slower:50ms bytes:1M; the stream restarts with it.
func (m *Model) SetFilter(s string) { m.filter = s }

// Filter implements app.Filterer.
func (m *Model) Filter() string { return m.filter }

// ApplyFilter implements app.FilterApplier: the stream restarts.
func (m *Model) ApplyFilter() tea.Cmd { return m.restart() }

// Request returns the observe request a filter asks for.
func Request(filter string, colls, flows bool) (*api.ObserveRequest, error) {
	f := &api.ObserveFilter{Collectives: colls, Flows: flows}
	for _, w := range strings.Fields(filter) {
		k, v, ok := strings.Cut(w, ":")
		if !ok {
			return nil, fmt.Errorf("filter %q: use node:, job:, op:, rank:, slower: or bytes:", w)
		}
		switch k {
		case "node":
			f.Node = v
		case "job":
			f.Job = v
		case "op":
			op, err := api.ParseNCCLOp(v)
			if err != nil {
				return nil, err
			}
			f.Op = op
		case "rank":
			var r int32
			if _, err := fmt.Sscan(v, &r); err != nil {
				return nil, fmt.Errorf("rank:%s is not a number", v)
			}
			f.Rank, f.HasRank = r, true
		case "slower":
			d, err := time.ParseDuration(v)
			if err != nil {
				return nil, fmt.Errorf("slower:%s: %w", v, err)
			}
			f.SlowerThanNs = int64(d)
		case "bytes":
			var n uint64
			if _, err := fmt.Sscan(strings.TrimSuffix(strings.ToUpper(v), "B"), &n); err != nil {
				return nil, fmt.Errorf("bytes:%s: give a number of bytes", v)
			}
			f.MinBytes = n
		default:
			return nil, fmt.Errorf("filter %q: use node:, job:, op:, rank:, slower: or bytes:", w)
		}
	}
	return &api.ObserveRequest{Filter: f, Last: 200, Follow: true}, nil
}

type batchMsg struct {
	gen  uint64
	b    *api.ObserveBatch
	err  error
	done bool
	next tea.Cmd
}

func (m *Model) restart() tea.Cmd {
	m.Close()
	req, err := Request(m.filter, m.colls, m.flow)
	if err != nil {
		m.err = err
		return nil
	}
	if m.node != "" {
		req.Filter.Node = m.node
	}
	m.req, m.err = req, nil
	m.gen = m.ctx.NextGen()
	gen, cl := m.gen, m.ctx.Client
	ctx, cancel := context.WithCancel(context.Background())
	m.cancel = cancel
	ch := make(chan batchMsg, 16)
	var wait tea.Cmd
	wait = func() tea.Msg {
		msg, ok := <-ch
		if !ok {
			return nil
		}
		msg.next = wait
		return msg
	}
	return m.ctx.Task(func() tea.Msg {
		go func() {
			defer close(ch)
			err := cl.Observe(ctx, req, func(b *api.ObserveBatch) error {
				select {
				case ch <- batchMsg{gen: gen, b: b}:
					return nil
				case <-ctx.Done():
					return ctx.Err()
				}
			})
			select {
			case ch <- batchMsg{gen: gen, done: true, err: err}:
			case <-ctx.Done():
			}
		}()
		return wait()
	})
}

// Lines returns the lines held.
func (m *Model) Lines() []string { return m.lines }

// Paused reports whether the pane is paused.
func (m *Model) Paused() bool { return m.paused }

// Update implements app.View.
func (m *Model) Update(msg tea.Msg) (app.View, tea.Cmd) {
	switch msg := msg.(type) {
	case batchMsg:
		if msg.gen != m.gen {
			return m, nil
		}
		if msg.done {
			m.err, m.cancel = msg.err, nil
			return m, nil
		}
		m.lost = [2]uint64{msg.b.GetLostByServer(), msg.b.GetLostAtNodes()}
		for _, it := range msg.b.GetItems() {
			m.lines = append(m.lines, Line(it))
			if m.paused {
				m.held++
			}
		}
		if n := len(m.lines); n > MaxLines {
			m.lines = m.lines[n-MaxLines:]
		}
		return m, msg.next
	case app.WheelMsg:
		m.scroll = max(m.scroll-msg.Delta, 0)
	case tea.KeyPressMsg:
		switch {
		case key.Matches(msg, m.keys.Pause):
			m.paused = !m.paused
			if !m.paused {
				m.held, m.scroll = 0, 0
			}
		case key.Matches(msg, m.keys.Collectives):
			m.colls = !m.colls
			return m, m.restart()
		case key.Matches(msg, m.keys.Flows):
			m.flow = !m.flow
			return m, m.restart()
		case key.Matches(msg, m.keys.Up):
			m.scroll++
		case key.Matches(msg, m.keys.Down):
			m.scroll = max(m.scroll-1, 0)
		case key.Matches(msg, m.keys.Clear):
			m.lines, m.held = nil, 0
		case msg.String() == "enter":
			return m, m.restart()
		}
	}
	return m, nil
}

// Line renders one observed item as a pane line.
func Line(it *api.ObserveItem) string {
	if c := it.GetCollective(); c != nil {
		t := time.Unix(0, c.GetStartUnixNano()).Format("15:04:05.000")
		state := ""
		if c.GetInProgress() {
			state = " (in call)"
		}
		return fmt.Sprintf("%s %-10s pid %-7d %s/r%-3d %-13s comm %#x seq %-6d %9s %9s%s", t, it.GetNode(), c.GetPid(), c.GetJob(),
			c.GetRank(), c.GetOp().Short(), c.GetComm(), c.GetSeq(), app.Bytes(c.GetBytes()),
			time.Duration(c.GetDurationNs()).Round(time.Microsecond), state)
	}
	if f := it.GetFlow(); f != nil {
		t := time.Unix(0, f.GetTimeUnixNano()).Format("15:04:05.000")
		return fmt.Sprintf("%s %-10s pid %-7d %s/r%-3d %s %s → %s tx %s rx %s retr %d", t, it.GetNode(), f.GetPid(), f.GetJob(),
			f.GetRank(), f.GetProtocol(), f.GetLocalAddr(), f.GetRemoteAddr(), app.Bytes(f.GetTxBytes()), app.Bytes(f.GetRxBytes()),
			f.GetRetransmits())
	}
	return ""
}

// Render implements app.View.
func (m *Model) Render() string {
	st := m.ctx.Styles
	state := "following"
	switch {
	case m.paused:
		state = fmt.Sprintf("PAUSED, %d new lines held (p resumes)", m.held)
	case m.cancel == nil && m.err == nil:
		state = "ended (enter restarts)"
	}
	kinds := []string{}
	if m.colls {
		kinds = append(kinds, "collectives")
	}
	if m.flow {
		kinds = append(kinds, "flows")
	}
	head := fmt.Sprintf("%s · %s · filter %q · lost: %d by the server, %d at the nodes · %d lines", strings.Join(kinds, "+"), state,
		m.filter, m.lost[0], m.lost[1], len(m.lines))
	var b strings.Builder
	b.WriteString(st.Dim.Render(app.Trunc(head, m.ctx.Width)))
	if m.err != nil {
		b.WriteString("\n" + st.FlashErr.Render(app.Trunc(m.err.Error(), m.ctx.Width)))
	}
	rows := m.ctx.Height - strings.Count(b.String(), "\n") - 1
	end := len(m.lines)
	if m.paused {
		end -= m.held
	}
	end = max(end-m.scroll, 0)
	start := max(end-rows, 0)
	for _, l := range m.lines[start:end] {
		b.WriteString("\n" + app.Trunc(l, m.ctx.Width))
	}
	return b.String()
}
