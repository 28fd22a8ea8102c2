package sshserve

import (
	"regexp"
	"testing"
	"time"
)

// TestSSHColoursFitTheTerminal: a 256-colour terminal gets the console's
// palette colours as they are (its renderer passes them through) and no
// 24-bit colour; a 16-colour terminal gets them converted to its 16.
func TestSSHColoursFitTheTerminal(t *testing.T) {
	c := startConsole(t)
	palette := regexp.MustCompile(`\x1b\[[0-9;]*[34]8;5;`)
	rgb := regexp.MustCompile(`\x1b\[[0-9;]*[34]8;2;`)
	for _, tc := range []struct {
		term    string
		palette bool
	}{{"xterm-256color", true}, {"xterm", false}} {
		scr := openSessionTerm(t, c.addr, c.operator, tc.term, 160, 40).out
		scr.waitFor(t, "alice@ssh (operator)", 15*time.Second)
		scr.waitFor(t, "next metric", 5*time.Second)
		scr.mu.Lock()
		out := scr.buf.String()
		scr.mu.Unlock()
		if got := palette.MatchString(out); got != tc.palette {
			t.Errorf("TERM=%s: 256-colour sequences drawn: %v, want %v", tc.term, got, tc.palette)
		}
		if at := rgb.FindStringIndex(out); at != nil {
			t.Errorf("TERM=%s: 24-bit colour drawn: %q", tc.term, out[max(0, at[0]-80):min(len(out), at[1]+80)])
		}
	}
}
