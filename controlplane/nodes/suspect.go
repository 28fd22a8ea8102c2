package nodes

import (
	"fmt"
	"slices"
	"strings"
	"time"
)

// SuspectPolicy is what a recovery's loss of a node does to it. A lost
// node is not cordoned for good: it becomes suspect for For (no queued work
// lands there; a recovering job may take it once its validation gang passes
// there, which lifts the suspicion), and only the CordonAt-th loss within
// Window cordons it until an operator uncordons it.
type SuspectPolicy struct {
	For      time.Duration
	Window   time.Duration
	CordonAt int
}

// DefaultSuspectPolicy: suspect for a minute; the third loss within ten
// minutes cordons.
var DefaultSuspectPolicy = SuspectPolicy{For: time.Minute, Window: 10 * time.Minute, CordonAt: 3}

func (p *SuspectPolicy) defaults() {
	d := DefaultSuspectPolicy
	if p.For <= 0 {
		p.For = d.For
	}
	if p.Window <= 0 {
		p.Window = d.Window
	}
	if p.CordonAt <= 0 {
		p.CordonAt = d.CordonAt
	}
}

// Suspicion is Suspect's verdict on one loss.
type Suspicion struct {
	// Lost are the node's losses within the window, oldest first, this
	// one included: what the node's record keeps.
	Lost []time.Time
	// Until is when the suspicion ends; zero when Cordon.
	Until time.Time
	// Cordon: the loss is one too many, the node is cordoned for good.
	Cordon bool
	// New is false when this loss was on record already (two jobs lost
	// the node at once): it counts once.
	New    bool
	Reason string
}

// Suspect decides what losing a node at lost (when it went down), judged
// at now, does to it given the losses on its record. It is pure: no clock,
// times are passed in, so a table tests it.
func Suspect(record []time.Time, lost, now time.Time, p SuspectPolicy) Suspicion {
	p.defaults()
	var kept []time.Time
	for _, t := range record {
		if lost.Sub(t) < p.Window {
			kept = append(kept, t)
		}
	}
	v := Suspicion{New: !slices.ContainsFunc(kept, lost.Equal)}
	if v.New {
		kept = append(kept, lost)
	}
	slices.SortFunc(kept, func(a, b time.Time) int { return a.Compare(b) })
	v.Lost = kept
	if len(kept) >= p.CordonAt {
		at := make([]string, len(kept))
		for i, t := range kept {
			at[i] = clockOf(t)
		}
		v.Cordon = true
		v.Reason = fmt.Sprintf("lost %d times within %s (at %s): cordoned until an operator uncordons it",
			len(kept), p.Window, strings.Join(at, ", "))
		return v
	}
	v.Until = now.Add(p.For)
	v.Reason = fmt.Sprintf("lost at %s, %d of %d losses within %s that cordon it", clockOf(lost), len(kept), p.CordonAt, p.Window)
	return v
}

// clockOf names a time of day in UTC, as node events and listings do.
func clockOf(t time.Time) string { return t.UTC().Format("15:04:05") }

// Suspected reports whether a node's status says it is suspect at now.
func Suspected(until int64, now time.Time) bool { return until > now.UnixNano() }
