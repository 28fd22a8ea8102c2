package tui

import (
	"slices"
	"strings"
	"testing"

	"github.com/gpuctl/gpuctl/transport"
)

// TestCommandRegistry: every name and alias means one command, and each
// command either acts or opens a view.
func TestCommandRegistry(t *testing.T) {
	seen := map[string]string{}
	for _, c := range commands {
		if (c.act == nil) == (c.open == nil) {
			t.Errorf(":%s must either act or open a view", c.name)
		}
		for _, n := range append([]string{c.name}, c.aliases...) {
			if other, dup := seen[n]; dup {
				t.Errorf("%q means both :%s and :%s", n, other, c.name)
			}
			seen[n] = c.name
			if got, ok := lookupCommand(n); !ok || got.name != c.name {
				t.Errorf("%q does not find :%s", n, c.name)
			}
		}
	}
}

// TestCommandsHelpAndCompletionAgree: for each role, help lists what tab
// completes from nothing, which is what the role may run, and every
// command the role may not run is denied, never opened.
func TestCommandsHelpAndCompletionAgree(t *testing.T) {
	for _, role := range []transport.Role{transport.RoleViewer, transport.RoleOperator, transport.RoleAdmin} {
		t.Run(string(role), func(t *testing.T) {
			hs := newHarness(t, role, 120, 40)
			m := hs.m
			allowed := m.allowedCommands()
			if got := m.complete(""); !slices.Equal(got, allowed) {
				t.Errorf("tab completes %v, may run %v", got, allowed)
			}
			help := m.renderHelp()
			if !strings.Contains(help, "commands: "+strings.Join(allowed, " ")+" ") {
				t.Errorf("help does not list %v:\n%s", allowed, help)
			}
			for _, c := range commands {
				if c.gate == "" || slices.Contains(allowed, c.name) {
					continue
				}
				m.flash = ""
				m.run(c.name)
				if !strings.Contains(m.flash, c.name+": ") {
					t.Errorf(":%s by a %s: flash %q, want a denial", c.name, role, m.flash)
				}
			}
		})
	}
}
