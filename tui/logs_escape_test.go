package tui

import (
	"strings"
	"testing"

	"github.com/gpuctl/gpuctl/transport"
)

// TestLogViewEscapes shows a rank's log holding terminal escapes and a
// bidi override: the console shows them as escapes and writes none of
// them to the terminal.
func TestLogViewEscapes(t *testing.T) {
	hs := newHarness(t, transport.RoleViewer, 120, 30)
	hs.cl.LogLines = []string{"step 1 \x1b]0;pwned\x07title", "clear\x1b[2J\x1b[H", "invoice\u202egpj.exe"}
	hs.command("job j-0a1b2c")
	hs.keys("4")
	raw := hs.m.Render()
	for _, bad := range []string{"\x1b]0;", "\x07", "\x1b[2J", "\x1b[H", "\u202e"} {
		if strings.Contains(raw, bad) {
			t.Errorf("the console wrote %q to the terminal:\n%q", bad, raw)
		}
	}
	screen := hs.screen()
	for _, want := range []string{`step 1 \x1b]0;pwned\x07title`, `clear\x1b[2J\x1b[H`, `invoice\u202egpj.exe`} {
		if !strings.Contains(screen, want) {
			t.Errorf("screen lacks %q:\n%s", want, screen)
		}
	}
}
