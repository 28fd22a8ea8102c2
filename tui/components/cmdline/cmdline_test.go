package cmdline

import (
	"strings"
	"testing"

	tea "charm.land/bubbletea/v2"
)

func TestLineIsBounded(t *testing.T) {
	var m Model
	m.Open(":")
	for range MaxLen + 100 {
		m.Update(tea.KeyPressMsg{Code: 'x', Text: "x"})
	}
	if len(m.Value) != MaxLen {
		t.Errorf("typed line holds %d bytes, want the bound %d", len(m.Value), MaxLen)
	}
	if !strings.Contains(m.Note, "line cut at 4096 bytes") {
		t.Errorf("note %q does not say the line was cut", m.Note)
	}
}

func TestPaste(t *testing.T) {
	cases := []struct {
		name, before, paste, want, note string
	}{
		{"inserted", "node ", "node-07", "node node-07", ""},
		{"first line only", "", "cordon node-01\nrm -rf /", "cordon node-01", "pasted text cut at its first line break"},
		{"controls as spaces", "", "a\tb\x1b[2Jc", "a b [2Jc", ""},
		{"bounded, on a rune", strings.Repeat("a", MaxLen-1), "é", strings.Repeat("a", MaxLen-1), "line cut at 4096 bytes"},
		{"huge", "", strings.Repeat("z", 100_000), strings.Repeat("z", MaxLen), "line cut at 4096 bytes"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			var m Model
			m.Open(":")
			m.Value = c.before
			m.Paste(c.paste)
			if m.Value != c.want {
				t.Errorf("value %.40q… (%d bytes), want %.40q… (%d bytes)", m.Value, len(m.Value), c.want, len(c.want))
			}
			if m.Note != c.note {
				t.Errorf("note %q, want %q", m.Note, c.note)
			}
		})
	}
}
