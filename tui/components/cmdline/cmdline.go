// Package cmdline is the console's one-line prompt: `:` commands with tab
// completion and history, and `/` filters applied as they are typed.
package cmdline

import (
	"fmt"
	"slices"
	"strings"
	"unicode"
	"unicode/utf8"

	tea "charm.land/bubbletea/v2"

	"github.com/gpuctl/gpuctl/tui/styles"
)

// MaxLen bounds the line in bytes: no command or filter is longer, and a
// bound keeps each key's work (and each frame's) constant however much is
// typed or pasted.
const MaxLen = 4096

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
	// Note says why the last input was not taken whole; shown in the line.
	Note string

	history []string
	hpos    int
	// cands is the completion cycle in progress.
	cands []string
	cpos  int
	base  string
}

// Open starts editing with an empty value.
func (m *Model) Open(prompt string) {
	m.Prompt, m.Value, m.Note = prompt, "", ""
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
	m.Note = ""
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
			m.insert(k.Text)
		}
	}
	m.Value = clip(m.Value) // history and completion are bounded too
	return Editing
}

// Paste inserts pasted text (a bracketed paste): its first line only, as
// the prompt is one line and a line break must not submit it.
func (m *Model) Paste(text string) {
	m.cands = nil
	m.Note = ""
	if i := strings.IndexAny(text, "\r\n"); i >= 0 {
		text = text[:i]
		m.Note = "pasted text cut at its first line break"
	}
	m.insert(text)
}

// insert appends text, with control characters as spaces, up to MaxLen.
func (m *Model) insert(text string) {
	room := MaxLen - len(m.Value)
	if len(text) > room {
		text = cutRunes(text, room)
		m.Note = fmt.Sprintf("line cut at %d bytes", MaxLen)
	}
	m.Value += strings.Map(func(r rune) rune {
		if unicode.IsControl(r) {
			return ' '
		}
		return r
	}, text)
}

// cutRunes is s's longest prefix of at most n bytes that ends on a rune.
func cutRunes(s string, n int) string {
	if n <= 0 {
		return ""
	}
	if n >= len(s) {
		return s
	}
	for n > 0 && !utf8.RuneStart(s[n]) {
		n--
	}
	return s[:n]
}

func clip(s string) string { return cutRunes(s, MaxLen) }

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

// Render draws the prompt line: the end of a value wider than the screen,
// so the cursor stays in view.
func (m *Model) Render(st *styles.Styles, width int) string {
	note := ""
	if m.Note != "" {
		note = "  (" + m.Note + ")"
	}
	v := m.Value
	if room := width - len(m.Prompt) - 1 - len(note); room > 1 && utf8.RuneCountInString(v) > room {
		r := []rune(v)
		v = "…" + string(r[len(r)-room+1:])
	}
	line := m.Prompt + v + "█"
	if note != "" {
		line += st.Dim.Render(note)
	}
	if len(m.cands) > 1 {
		line += "   " + st.Dim.Render(strings.Join(m.cands, "  "))
	}
	return st.Cmdline.MaxWidth(width).Render(line)
}
