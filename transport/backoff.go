package transport

import (
	"context"
	"math/rand/v2"
	"time"
)

// How a node reconnects to the server: one definition that nodemon paces
// itself by and that the server derives its wait after a restart from.
const (
	// NodeReconnectBase is a node's first pause after losing the server.
	NodeReconnectBase = 200 * time.Millisecond
	// NodeReconnectMax caps a node's pause between attempts; it is reached
	// only while attempts keep failing, since a node starts its pauses
	// over whenever the server answers its hello.
	NodeReconnectMax = 10 * time.Second
	// NodeDialTimeout bounds each step of a node's attempt: the QUIC dial,
	// then hello and welcome. An attempt stalled mid-handshake by the
	// crash of the server it was talking to gives up within it.
	NodeDialTimeout = 5 * time.Second
	// NodeReconnectWithin bounds how long after a server starts a live
	// node, whatever it was doing, begins an attempt that server answers:
	// an attempt in flight ends within NodeDialTimeout, then one pause of
	// at most NodeReconnectMax. (A node still in a session with the
	// crashed server hears of it from the new one's stateless reset at
	// its next heartbeat.)
	NodeReconnectWithin = NodeDialTimeout + NodeReconnectMax
)

// BackoffDelay is the pause before reconnect attempt number attempt (0 for
// the first retry): base doubled per attempt, capped at max, then reduced by
// up to the fraction jitter according to r in [0, 1). Spreading the pauses
// keeps nodes that lost the server together from returning together.
func BackoffDelay(attempt int, base, max time.Duration, jitter, r float64) time.Duration {
	if base <= 0 {
		return 0
	}
	d := max
	if attempt < 62 && base < max>>attempt {
		d = base << attempt
	}
	jitter = min(1, jitter)
	if jitter <= 0 {
		return d
	}
	r = min(1, r)
	if r < 0 {
		r = 0
	}
	return d - time.Duration(float64(d)*jitter*r)
}

// Backoff paces reconnects: exponential with jitter, capped, and reset once
// a connection stays up for ResetAfter. It is not safe for concurrent use.
type Backoff struct {
	Base       time.Duration // first pause (default 200ms)
	Max        time.Duration // longest pause (default 30s)
	Jitter     float64       // fraction of a pause taken off at random (default 0.5, negative for none)
	ResetAfter time.Duration // a connection up this long resets the pauses (default 1m)
	// Rand returns a number in [0, 1); nil uses math/rand/v2. Tests inject
	// a fixed sequence.
	Rand func() float64

	attempt int
}

func (b *Backoff) defaults() (base, max time.Duration, jitter float64, reset time.Duration) {
	base, max, jitter, reset = b.Base, b.Max, b.Jitter, b.ResetAfter
	if base <= 0 {
		base = 200 * time.Millisecond
	}
	if max <= 0 {
		max = 30 * time.Second
	}
	if max < base {
		max = base
	}
	switch {
	case jitter == 0:
		jitter = 0.5
	case jitter < 0:
		jitter = 0
	}
	if reset <= 0 {
		reset = time.Minute
	}
	return
}

// Next returns the pause before the next attempt and counts the attempt.
func (b *Backoff) Next() time.Duration {
	base, max, jitter, _ := b.defaults()
	r := rand.Float64
	if b.Rand != nil {
		r = b.Rand
	}
	d := BackoffDelay(b.attempt, base, max, jitter, r())
	if b.attempt < 62 {
		b.attempt++
	}
	return d
}

// Attempt returns how many pauses Next has handed out since the last reset.
func (b *Backoff) Attempt() int { return b.attempt }

// Reset starts the pauses over from Base.
func (b *Backoff) Reset() { b.attempt = 0 }

// Ended records that a connection ended after being up for upFor; one that
// lasted ResetAfter or longer was healthy, so the pauses start over.
func (b *Backoff) Ended(upFor time.Duration) {
	if _, _, _, reset := b.defaults(); upFor >= reset {
		b.Reset()
	}
}

// Wait pauses for Next() or until ctx is done, whichever comes first.
func (b *Backoff) Wait(ctx context.Context) error {
	t := time.NewTimer(b.Next())
	defer t.Stop()
	select {
	case <-t.C:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}
