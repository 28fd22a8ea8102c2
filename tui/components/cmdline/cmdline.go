// Package cmdline is the console's one-line prompt: `:` commands with tab
// completion and history, and `/` filters applied as they are typed.
package cmdline

import (
	"slices"
	"strings"

	tea "charm.land/bubbletea/v2"

	"github.com/gpuctl/gpuctl/tui/styles"
)

// Result is what a key did to the prompt.
type Result int

// Results of Update.
const (
	Editing Result = iota
	Submitted
	Cancelled
)

// Model is a prompt. Complete returns the candidates for the text typed
// so far (whole commands, e.g. "node node-07").
type Model struct {
	Prompt   string
	Value    string
	Complete func(prefix string) []string

	history []string
	hpos    int
	// cands is the completion cycle in progress.
	cands []string
	cpos  int
	base  string
}

// Open starts editing with an empty value.
func (m *Model) Open(prompt string) {
	m.Prompt, m.Value = prompt, ""
	m.hpos = len(m.history)
	m.cands = nil
}

// History returns the submitted commands, oldest first.
func (m *Model) History() []string { return slices.Clone(m.history) }

// Update handles one key.
func (m *Model) Update(k tea.KeyPressMsg) Result {
	s := k.String()
	if s != "tab" && s != "shift+tab" {
		m.cands = nil
	}
	switch s {
	case "esc", "ctrl+c":
		return Cancelled
	case "enter":
		v := strings.TrimSpace(m.Value)
		if v != "" && (len(m.history) == 0 || m.history[len(m.history)-1] != v) {
			m.history = append(m.history, v)
		}
		m.hpos = len(m.history)
		return Submitted
	case "backspace":
		r := []rune(m.Value)
		if len(r) > 0 {
			m.Value = string(r[:len(r)-1])
		}
	case "ctrl+u":
		m.Value = ""
	case "ctrl+w":
		v := strings.TrimRight(m.Value, " ")
		if i := strings.LastIndexByte(v, ' '); i >= 0 {
			m.Value = v[:i+1]
		} else {
			m.Value = ""
		}
	case "up":
		if m.hpos > 0 {
			m.hpos--
			m.Value = m.history[m.hpos]
		}
	case "down":
		if m.hpos < len(m.history)-1 {
			m.hpos++
			m.Value = m.history[m.hpos]
		} else {
			m.hpos = len(m.history)
			m.Value = ""
		}
	case "tab", "shift+tab":
		m.complete(s == "shift+tab")
	default:
		if k.Text != "" {
			m.Value += k.Text
		}
	}
	return Editing
}

func (m *Model) complete(back bool) {
	if m.Complete == nil {
		return
	}
	if m.cands == nil {
		m.base = m.Value
		m.cands = m.Complete(m.Value)
		m.cpos = -1
		if len(m.cands) == 0 {
			m.cands = nil
			return
		}
		if len(m.cands) > 1 {
			// First extend to what every candidate shares.
			if p := commonPrefix(m.cands); len(p) > len(m.Value) {
				m.Value = p
				m.cands = nil
				return
			}
		}
	}
	if back {
		m.cpos = (m.cpos - 1 + len(m.cands)) % len(m.cands)
	} else {
		m.cpos = (m.cpos + 1) % len(m.cands)
	}
	m.Value = m.cands[m.cpos]
	if len(m.cands) == 1 {
		m.Value += " "
		m.cands = nil
	}
}

func commonPrefix(ss []string) string {
	p := ss[0]
	for _, s := range ss[1:] {
		for !strings.HasPrefix(s, p) {
			p = p[:len(p)-1]
		}
	}
	return p
}

// Candidates returns the completions on offer now, for display.
func (m *Model) Candidates() []string { return m.cands }

// Render draws the prompt line.
func (m *Model) Render(st *styles.Styles, width int) string {
	line := m.Prompt + m.Value + "█"
	if len(m.cands) > 1 {
		line += "   " + st.Dim.Render(strings.Join(m.cands, "  "))
	}
	return st.Cmdline.MaxWidth(width).Render(line)
}
