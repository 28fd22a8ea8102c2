package scheduler

import (
	"fmt"
	"time"
)

// SlowRule bounds what gpuctl does on its own about a fail-slow finding of
// a job with slow_recovery auto: a finding must stand for Hold before it
// is acted on, and at most Max automatic slow exclusions happen per job
// in any Window, so a job cannot restart itself in a loop.
type SlowRule struct {
	Hold   time.Duration
	Max    int
	Window time.Duration
}

// DefaultSlowRule is the rule the server uses: a minute's hold (the
// analysis raises a finding on tens of collectives; a minute more keeps a
// passing throttle from costing a restart), and two automatic exclusions
// a day.
func DefaultSlowRule() SlowRule {
	return SlowRule{Hold: time.Minute, Max: 2, Window: 24 * time.Hour}
}

// SlowCase is one standing fail-slow finding of a job, as the rule sees
// it. Times are Unix nanoseconds.
type SlowCase struct {
	// Auto is the job's slow_recovery auto.
	Auto bool
	// Class names the finding (compute-slow, communication-slow, job-slow).
	Class string
	// Node is the node the finding blames; "" when it names none (a
	// job-wide slowdown, a communicator no node explains).
	Node string
	// Quiet is a finding an operator acknowledged or silenced.
	Quiet      bool
	Since, Now int64
	// Past are the job's earlier automatic slow exclusions.
	Past []int64
}

// SlowVerdict is what the rule says to do about a finding.
type SlowVerdict int

// Slow verdicts.
const (
	// SlowAlert: the finding is only reported (slow_recovery alert, or
	// it names no node to exclude).
	SlowAlert SlowVerdict = iota
	// SlowQuiet: an operator acknowledged or silenced it; nothing more.
	SlowQuiet
	// SlowHold: not yet; the finding has not stood for the hold.
	SlowHold
	// SlowBound: the job had its automatic exclusions for the window;
	// the finding only alerts.
	SlowBound
	// SlowExclude: restart the job without Node.
	SlowExclude
)

var slowVerdictNames = [...]string{"alert", "quiet", "hold", "bound", "exclude"}

// String names the verdict.
func (v SlowVerdict) String() string {
	if v >= 0 && int(v) < len(slowVerdictNames) {
		return slowVerdictNames[v]
	}
	return fmt.Sprintf("SlowVerdict(%d)", int(v))
}

// SlowDecision is DecideSlow's answer.
type SlowDecision struct {
	Verdict SlowVerdict
	// Node is the node to exclude (SlowExclude only).
	Node string
	// Reason says why, in one line an operator can act on.
	Reason string
}

// DecideSlow applies the rule to one finding. It does not know whether a
// spare exists: the caller plans the restart and only acts when the plan
// replaces the node.
func DecideSlow(r SlowRule, c SlowCase) SlowDecision {
	switch {
	case c.Quiet:
		return SlowDecision{Verdict: SlowQuiet, Reason: "acknowledged or silenced by an operator"}
	case !c.Auto:
		return SlowDecision{Verdict: SlowAlert, Reason: "slow_recovery is alert"}
	case c.Node == "":
		return SlowDecision{Verdict: SlowAlert, Reason: c.Class + " names no node to exclude"}
	}
	if held := time.Duration(c.Now - c.Since); held < r.Hold {
		return SlowDecision{Verdict: SlowHold, Reason: fmt.Sprintf("standing %s of the %s hold", held.Round(time.Second), r.Hold)}
	}
	recent := 0
	for _, t := range c.Past {
		if t > c.Now-int64(r.Window) && t <= c.Now {
			recent++
		}
	}
	if recent >= r.Max {
		return SlowDecision{Verdict: SlowBound, Reason: fmt.Sprintf("%d automatic slow exclusions in the last %s (the bound is %d)", recent, r.Window, r.Max)}
	}
	return SlowDecision{Verdict: SlowExclude, Node: c.Node,
		Reason: fmt.Sprintf("%s on %s for %s", c.Class, c.Node, time.Duration(c.Now-c.Since).Round(time.Second))}
}
