package jobs

import (
	"sync/atomic"
	"time"
)

// PassCount is an Observer that counts scheduling passes. Set it with
// SetObserver to wait for the owner to have looked again (a negative proved
// by the passes that could have broken it, not by a guess at the time).
type PassCount struct{ n atomic.Int64 }

// ObserveSchedulerPass counts one pass.
func (p *PassCount) ObserveSchedulerPass(time.Duration, int) { p.n.Add(1) }

// ObserveRecoveryStep ignores recovery steps.
func (p *PassCount) ObserveRecoveryStep(string, time.Duration) {}

// Passes is how many passes were observed so far.
func (p *PassCount) Passes() int64 { return p.n.Load() }
