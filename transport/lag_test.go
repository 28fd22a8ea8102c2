package transport

import (
	"context"
	"testing"
	"time"
)

// An idle listener's probes come back at once: no lag. A probe last seen
// a second ago is a second's lag less the probe period, and one never
// seen (a probe that cannot run) is none.
func TestReceiveLag(t *testing.T) {
	auth, err := OpenAuthority(t.TempDir(), AuthorityOptions{})
	if err != nil {
		t.Fatal(err)
	}
	ln, err := Listen(context.Background(), "127.0.0.1:0", auth, ListenConfig{})
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	deadline := time.Now().Add(10 * time.Second)
	for ln.probe.seen.Load() == 0 {
		if time.Now().After(deadline) {
			t.Fatal("no probe came back within 10s")
		}
		time.Sleep(10 * time.Millisecond)
	}
	if lag := ln.ReceiveLag(); lag > time.Second {
		t.Errorf("an idle listener is %s behind", lag)
	}

	now := time.Now()
	p := &lagProbe{}
	if lag := p.lag(now); lag != 0 {
		t.Errorf("a probe never seen: lag %s", lag)
	}
	p.seen.Store(now.Add(-time.Second).UnixNano())
	if lag := p.lag(now); lag != time.Second-lagProbeEvery {
		t.Errorf("a probe seen 1s ago: lag %s", lag)
	}
}
