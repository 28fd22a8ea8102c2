package job

import (
	"context"
	"fmt"
	"strings"

	tea "charm.land/bubbletea/v2"

	"github.com/gpuctl/gpuctl/api"
	"github.com/gpuctl/gpuctl/tui/app"
)

// MaxLogLines bounds the log tail the view keeps.
const MaxLogLines = 2000

// logMsg is one chunk of a followed log, or its end.
type logMsg struct {
	gen  uint64
	data []byte
	node string
	err  error
	done bool
	next tea.Cmd
}

// startLogs follows the selected rank's log from 16 KiB before its end.
func (m *Model) startLogs() tea.Cmd {
	r, ok := m.selectedRank()
	if !ok {
		return nil
	}
	if m.logCancel != nil && m.logRank == int32(r.Rank) {
		return nil
	}
	m.Close()
	j := m.Job()
	m.logGen = m.ctx.NextGen()
	m.logRank, m.logLines, m.logErr, m.follow, m.scroll = int32(r.Rank), nil, nil, true, 0
	ctx, cancel := context.WithCancel(context.Background())
	m.logCancel = cancel
	gen, cl := m.logGen, m.ctx.Client
	req := &api.LogsRequest{Job: j.GetId(), Rank: int32(r.Rank), Follow: true, TailBytes: 16 << 10}
	ch := make(chan logMsg, 16)
	var wait tea.Cmd
	wait = func() tea.Msg {
		msg, ok := <-ch
		if !ok {
			return nil
		}
		msg.next = wait
		return msg
	}
	start := func() tea.Msg {
		go func() {
			defer close(ch)
			err := cl.Logs(ctx, req, func(c *api.LogsChunk) error {
				select {
				case ch <- logMsg{gen: gen, data: c.GetData(), node: c.GetNode()}:
					return nil
				case <-ctx.Done():
					return ctx.Err()
				}
			})
			select {
			case ch <- logMsg{gen: gen, done: true, err: err}:
			case <-ctx.Done():
			}
		}()
		return wait()
	}
	return m.ctx.Task(start)
}

func (m *Model) onLog(msg logMsg) tea.Cmd {
	if msg.gen != m.logGen {
		return nil
	}
	if msg.done {
		m.logErr = msg.err
		m.logCancel = nil
		return nil
	}
	text := string(msg.data)
	if len(m.logLines) > 0 && !strings.HasSuffix(m.logLines[len(m.logLines)-1], "\n") {
		text = m.logLines[len(m.logLines)-1] + text
		m.logLines = m.logLines[:len(m.logLines)-1]
	}
	for _, l := range strings.SplitAfter(text, "\n") {
		if l != "" {
			m.logLines = append(m.logLines, l)
		}
	}
	if n := len(m.logLines); n > MaxLogLines {
		m.logLines = m.logLines[n-MaxLogLines:]
	}
	return msg.next
}

// LogLines returns the log tail held, one line each.
func (m *Model) LogLines() []string {
	out := make([]string, len(m.logLines))
	for i, l := range m.logLines {
		out[i] = strings.TrimRight(l, "\n")
	}
	return out
}

func (m *Model) renderLogs(h int) string {
	st := m.ctx.Styles
	var b strings.Builder
	state := "following"
	if !m.follow {
		state = "paused (f follows)"
	}
	if m.logCancel == nil {
		state = "ended"
		if m.logErr != nil {
			state = "ended: " + m.logErr.Error()
		}
	}
	if m.logRank < 0 {
		return st.Dim.Render("select a rank in the ranks tab (1), then 4 or L shows its log")
	}
	b.WriteString(st.Dim.Render(fmt.Sprintf("rank %d log, %d lines, %s", m.logRank, len(m.logLines), state)))
	lines := m.LogLines()
	rows := max(h-1, 1)
	end := len(lines)
	if !m.follow {
		end = max(len(lines)-m.scroll, 0)
	}
	start := max(end-rows, 0)
	for _, l := range lines[start:end] {
		// A rank's output reaches the terminal escaped: a job cannot set
		// the title, clear the screen or reorder what it shows.
		b.WriteString("\n" + app.Trunc(api.EscapeText(l), m.ctx.Width))
	}
	return b.String()
}
