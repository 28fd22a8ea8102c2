package tui

import (
	"slices"
	"strings"
	"testing"

	tea "charm.land/bubbletea/v2"

	"github.com/gpuctl/gpuctl/transport"
	"github.com/gpuctl/gpuctl/tui/app"
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

// withContexts gives the console a client config of three clusters,
// following prod.
func (hs *harness) withContexts() {
	hs.m.ctx.Contexts = []transport.Context{
		{Name: "prod", Server: "head-a:7443,head-b:7443"}, {Name: "lab", Server: "lab-head:7443"}, {Name: "staging", Server: "10.0.0.7:7443"},
	}
	hs.m.ctx.Cluster = "prod"
}

// TestContextSwitch: :ctx NAME and enter on :ctx's list both end the
// console with the chosen context for its caller to follow; a context
// that is not in the config, the one already followed and a console
// without contexts each say so and keep the console.
func TestContextSwitch(t *testing.T) {
	t.Run("by name", func(t *testing.T) {
		hs := newHarness(t, transport.RoleViewer, 120, 40)
		hs.withContexts()
		if got := hs.m.complete("ctx l"); !slices.Equal(got, []string{"ctx lab"}) {
			t.Errorf("tab after :ctx l offers %v, want [ctx lab]", got)
		}
		_, cmd := hs.m.Update(app.JumpMsg{Command: "context lab"})
		if hs.m.SwitchTo() != "lab" || cmd == nil {
			t.Fatalf(":context lab: switch to %q, flash %q", hs.m.SwitchTo(), hs.m.flash)
		}
		if _, quit := runToMsg(cmd).(tea.QuitMsg); !quit {
			t.Errorf(":context lab does not quit the console for its caller to follow lab")
		}
	})
	t.Run("from the list", func(t *testing.T) {
		hs := newHarness(t, transport.RoleViewer, 120, 40)
		hs.withContexts()
		hs.command("ctx")
		if hs.m.Top().Name() != "ctx" || !strings.Contains(hs.screen(), "ctx prod · alice") {
			t.Fatalf(":ctx did not open the list under a header naming prod:\n%s", hs.screen())
		}
		hs.keys("down", "down", "enter")
		if hs.m.SwitchTo() != "staging" {
			t.Errorf("enter on the third row switches to %q, want staging", hs.m.SwitchTo())
		}
	})
	for _, tc := range []struct {
		name, cmd, flash string
		contexts         bool
	}{
		{"unknown", "ctx nope", `no context "nope": the client config has prod, lab, staging`, true},
		{"current", "ctx prod", `already following context "prod"`, true},
		{"no contexts", "ctx lab", "this console has no contexts", false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			hs := newHarness(t, transport.RoleViewer, 120, 40)
			if tc.contexts {
				hs.withContexts()
			}
			hs.command(tc.cmd)
			if hs.m.SwitchTo() != "" || !strings.Contains(hs.m.flash, tc.flash) {
				t.Errorf(":%s: switch to %q, flash %q, want %q", tc.cmd, hs.m.SwitchTo(), hs.m.flash, tc.flash)
			}
		})
	}
}

// runToMsg runs cmd and the batches it returns until a message that is
// not a batch.
func runToMsg(cmd tea.Cmd) tea.Msg {
	msg := cmd()
	if b, ok := msg.(tea.BatchMsg); ok {
		for _, c := range b {
			if c != nil {
				if m := runToMsg(c); m != nil {
					return m
				}
			}
		}
		return nil
	}
	return msg
}
