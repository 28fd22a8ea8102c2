package sshserve

import (
	"strings"
	"testing"
	"time"

	"github.com/charmbracelet/x/ansi"
)

// TestLineScreenChanges: a frame rewrites only the rows that changed,
// each erased first; rows the last frame had beyond this one are erased;
// rows past the terminal's height are not drawn; a repaint (after a
// resize) clears the screen and draws every row.
func TestLineScreenChanges(t *testing.T) {
	row := func(y int, text string) string {
		return ansi.CursorPosition(1, y) + ansi.ResetStyle + ansi.EraseEntireLine + text
	}
	frame := func(body string) string {
		return ansi.SetModeSynchronizedOutput + body + ansi.ResetStyle + ansi.ResetModeSynchronizedOutput
	}
	steps := []struct {
		name    string
		frame   string
		height  int
		repaint bool
		want    string
	}{
		{"first frame: every row", "a\nb\nc", 10, false, frame(row(1, "a") + row(2, "b") + row(3, "c"))},
		{"one row changed", "a\nB\nc", 10, false, frame(row(2, "B"))},
		{"the same frame: nothing", "a\nB\nc", 10, false, ""},
		{"a shorter frame erases the rows it lost", "a", 10, false, frame(row(2, "") + row(3, ""))},
		{"rows past the height are not drawn", "a\nx\ny\nz", 2, false, frame(row(2, "x"))},
		{"a repaint clears and draws every row", "a\nx", 2, true,
			frame(ansi.ResetStyle + ansi.EraseEntireScreen + row(1, "a") + row(2, "x"))},
		{"styled rows are written as they are", "\x1b[38;5;42ma\x1b[m\nx", 2, false, frame(row(1, "\x1b[38;5;42ma\x1b[m"))},
	}
	s := &lineScreen{}
	for _, st := range steps {
		if st.repaint {
			s.rows = nil
		}
		if got := s.changes(st.frame, st.height, st.repaint); got != st.want {
			t.Errorf("%s:\n got %q\nwant %q", st.name, got, st.want)
		}
	}
}

// TestSSHSessionGivesTheTerminalBack: a console drawn a line at a time
// takes the alternate screen, hides the cursor and turns mouse reports,
// bracketed paste and no-wrap on at its start, and undoes all of it when
// its user quits, so their shell is as they left it.
func TestSSHSessionGivesTheTerminalBack(t *testing.T) {
	c := startConsole(t)
	o := openSessionTerm(t, c.addr, c.operator, "xterm-256color", 120, 40)
	o.out.waitFor(t, "alice@ssh (operator)", 15*time.Second)
	o.out.mu.Lock()
	start := o.out.buf.String()
	o.out.mu.Unlock()
	if !strings.HasPrefix(start, screenEnter) {
		t.Fatalf("the session did not start with the console's modes: %q", start[:min(len(start), 120)])
	}
	o.send("q")
	if !o.endsWithin(10 * time.Second) {
		t.Fatal("the session did not end after q")
	}
	o.out.mu.Lock()
	out := o.out.buf.String()
	o.out.mu.Unlock()
	if !strings.HasSuffix(out, screenLeave) {
		t.Errorf("the session's last output is not the terminal given back: %q", tail(out, 200))
	}
}
