// Package pace decides how much less often than their own interval nodes
// send telemetry while the server cannot keep up with it. Shedding what
// arrives keeps the server's memory bounded but not its CPU: every batch is
// still received, decrypted and skipped, and a server saturated that way
// hears heartbeats late enough to declare healthy nodes down. Asking the
// nodes to send less often removes the work at its source; the console's
// figures go stale meanwhile, which is what overload may cost.
//
// The rule has no clock: the caller passes the time of each update.
package pace

import (
	"fmt"
	"time"
)

// Signals are how the server's ingest is doing now.
type Signals struct {
	// Late is how far behind the server hears heartbeats (their median
	// lateness, or its receive path's lag).
	Late time.Duration
	// QueueFill is the ingest queue's length over its bound.
	QueueFill float64
	// Shed is the batches and GPU samples shed since the last update.
	Shed uint64
}

// Rule holds the thresholds; the zero value takes Default's.
type Rule struct {
	// Max is the largest factor asked for.
	Max uint32
	// Busy and Calm are the lateness at or past which ingest is behind,
	// and under which it has room.
	Busy, Calm time.Duration
	// QueueBusy and QueueCalm are the same for the queue's fill.
	QueueBusy, QueueCalm float64
	// Settle is how long after a change the factor waits before it rises
	// again: nodes need a batch or two to follow, and the backlog to drain.
	Settle time.Duration
	// CalmFor is how long ingest must have had room, without a break,
	// before the factor halves.
	CalmFor time.Duration
}

// Default: at most 16 times slower, doubling at most every 5 s (a server
// that fell behind needs seconds to drain its backlog) unless heartbeats
// are two seconds late or the queue is full; behind at 500 ms
// of lateness, half a queue or any shedding; room under 50 ms and a tenth
// of a queue for 30 s.
var Default = Rule{Max: 16, Busy: 500 * time.Millisecond, Calm: 50 * time.Millisecond, QueueBusy: 0.5, QueueCalm: 0.1,
	Settle: 5 * time.Second, CalmFor: 30 * time.Second}

// Pacer is the factor now and what it remembers between updates. It is not
// safe for concurrent use.
type Pacer struct {
	rule      Rule
	factor    uint32
	changed   time.Time
	calmSince time.Time
	busySince time.Time
}

// New returns a pacer at factor 1 running r (Default where r is zero).
func New(r Rule) *Pacer {
	if r == (Rule{}) {
		r = Default
	}
	return &Pacer{rule: r, factor: 1}
}

// Factor is the factor asked for now.
func (p *Pacer) Factor() uint32 { return p.factor }

// Update judges s at now and returns the factor, whether it changed, and
// why.
func (p *Pacer) Update(now time.Time, s Signals) (factor uint32, changed bool, why string) {
	r := p.rule
	busy := s.Late >= r.Busy || s.QueueFill >= r.QueueBusy || s.Shed > 0
	// Far behind (heartbeats four times the busy lateness late, or the
	// queue full), nodes are about to be declared down: no settling.
	severe := s.Late >= 4*r.Busy || s.QueueFill >= 1
	calm := s.Late < r.Calm && s.QueueFill < r.QueueCalm && s.Shed == 0
	switch {
	case busy:
		p.calmSince = time.Time{}
		if p.busySince.IsZero() {
			p.busySince = now
		}
		// One moment behind (a burst of registrations, a GC) is not
		// overload: it must be seen again a judgment later.
		sustained := now.After(p.busySince)
		if p.factor < r.Max && (severe || sustained && (p.changed.IsZero() || now.Sub(p.changed) >= r.Settle)) {
			p.factor = min(2*p.factor, r.Max)
			p.changed = now
			return p.factor, true, fmt.Sprintf("ingest behind (heartbeats %s late, queue %.0f%% full, %d shed)",
				s.Late.Round(time.Millisecond), 100*s.QueueFill, s.Shed)
		}
	case calm:
		p.busySince = time.Time{}
		if p.calmSince.IsZero() {
			p.calmSince = now
		}
		if p.factor > 1 && now.Sub(p.calmSince) >= r.CalmFor && now.Sub(p.changed) >= r.CalmFor {
			p.factor /= 2
			p.changed, p.calmSince = now, now
			return p.factor, true, fmt.Sprintf("ingest has had room for %s", r.CalmFor)
		}
	default:
		p.calmSince, p.busySince = time.Time{}, time.Time{}
	}
	return p.factor, false, ""
}
