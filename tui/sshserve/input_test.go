package sshserve

import (
	"strings"
	"testing"
	"time"
)

// TestSSHCommandLinePaste pastes into the `:` line over SSH: a bracketed
// paste is inserted up to its first line break, and 100 KB typed as keys
// is taken in well under a few seconds, cut at the line's bound with a
// note saying so.
func TestSSHCommandLinePaste(t *testing.T) {
	c := startConsole(t)
	o := openSession(t, c.addr, c.operator)
	o.out.waitFor(t, "cordon node", 15*time.Second)

	o.send(":")
	o.send("\x1b[200~jobs-pasted\nnodes\x1b[201~")
	o.out.waitFor(t, "jobs-pasted", 5*time.Second)
	o.out.waitFor(t, "pasted text cut at its first line break", 5*time.Second)
	o.send("\x15") // ctrl+u: the line empty again

	start := time.Now()
	o.send(strings.Repeat("k", 100*1024))
	o.out.waitFor(t, "line cut at 4096 bytes", 20*time.Second)
	took := time.Since(start)
	t.Logf("100 KB typed into the line: taken in %s", took.Round(time.Millisecond))
	if took > 3*time.Second {
		t.Errorf("100 KB typed into the line took %s, want well under 3s", took)
	}
	// The console still answers: the line clears and takes new keys.
	o.send("\x15after")
	o.out.waitFor(t, "after█", 5*time.Second)
}
