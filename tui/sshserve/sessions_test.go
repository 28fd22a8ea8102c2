package sshserve

import (
	"os"
	"testing"
	"time"
)

// TestSSHKeyFileChangeEndsSessions removes one key from the file and
// changes another's role: both open sessions end within a few seconds
// with the reason, a key left as it was keeps its session, and the
// changed key logs in again with its new role.
func TestSSHKeyFileChangeEndsSessions(t *testing.T) {
	c := startConsole(t)
	line, carol := pubLine(t)
	c.lines["carol"] = "role=viewer " + line + " carol"
	write := func(names ...string) {
		t.Helper()
		var data string
		for _, n := range names {
			data += c.lines[n] + "\n"
		}
		// Written in place, as an editor does; the size changes or not.
		if err := os.WriteFile(c.keys, []byte(data), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	write("alice", "bob", "carol")

	alice := openSession(t, c.addr, c.operator)
	alice.out.waitFor(t, "alice@ssh (operator)", 15*time.Second)
	bob := openSession(t, c.addr, c.viewer)
	bob.out.waitFor(t, "bob@ssh (viewer)", 15*time.Second)
	kept := openSession(t, c.addr, carol)
	kept.out.waitFor(t, "carol@ssh (viewer)", 15*time.Second)

	c.lines["bob"] = "role=operator " + c.lines["bob"][len("role=viewer "):]
	write("bob", "carol")
	start := time.Now()
	for name, o := range map[string]*clientSession{"alice": alice, "bob": bob} {
		if !o.endsWithin(5 * time.Second) {
			t.Fatalf("%s's session still open 5s after the key file changed", name)
		}
	}
	t.Logf("sessions ended %s after the change", time.Since(start).Round(10*time.Millisecond))
	alice.errs.waitFor(t, "this key was removed from the authorized keys", time.Second)
	bob.errs.waitFor(t, "this key's role changed from viewer to operator", time.Second)
	select {
	case <-kept.ended:
		t.Fatal("an unchanged key's session ended")
	default:
	}
	if _, err := dial(c.addr, c.operator); err == nil {
		t.Error("the removed key logged in again")
	}
	again := openSession(t, c.addr, c.viewer)
	again.out.waitFor(t, "bob@ssh (operator)", 15*time.Second)
}

// TestSSHIdleTimeout ends a session nobody types in, though its screen
// keeps changing, and keeps one whose user types.
func TestSSHIdleTimeout(t *testing.T) {
	const idle = 2 * time.Second
	c := startConsole(t, func(cfg *Config) { cfg.IdleTimeout = idle })
	quiet := openSession(t, c.addr, c.viewer)
	typing := openSession(t, c.addr, c.operator)
	quiet.out.waitFor(t, "bob@ssh (viewer)", 15*time.Second)
	typing.out.waitFor(t, "alice@ssh (operator)", 15*time.Second)
	stop := time.Now().Add(idle + 3*time.Second)
	for time.Now().Before(stop) {
		typing.send("j")
		select {
		case <-typing.ended:
			t.Fatal("a session whose user types was ended as idle")
		case <-time.After(300 * time.Millisecond):
		}
	}
	if !quiet.endsWithin(time.Second) {
		t.Fatalf("a session nobody typed in was open %s after its idle timeout of %s", 4*time.Second, idle)
	}
	quiet.errs.waitFor(t, "nothing typed for 2s", time.Second)
}
