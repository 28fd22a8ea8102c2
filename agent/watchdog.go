package agent

import (
	"context"
	"fmt"
	"sync"
	"time"
)

// A server that dies without a word (SIGKILL, a host lost) sends no
// CONNECTION_CLOSE, and QUIC would take its idle timeout (30 s) to notice;
// a standby taking over must have the nodes within seconds. A server that
// grants a lease answers every heartbeat of a ready node with a renewal,
// so a session that has heard nothing on its control stream for a few
// heartbeats is taken for dead, closed, and the next server dialled. The
// ranks are not touched: their shims keep enforcing the last lease, and a
// reconnect to the new leader renews it.
//
// Without a lease the server sends nothing regularly (commands only), so
// the watchdog runs only for sessions that were granted one, and only
// when nodemon was given several servers: with one, a reconnect gains
// nothing and would end the session of a server that only paused.

// MinSilenceLimit is the shortest silence taken for a dead server, so that
// a fast heartbeat does not turn a short stall (a GC pause, a store write
// on a loaded server) into a reconnect.
const MinSilenceLimit = 3 * time.Second

// silenceBeats is how many heartbeats' renewals may go missing before the
// server is taken for dead.
const silenceBeats = 3

// SilenceLimit is how long a session with a lease may hear nothing from
// the server before nodemon takes it for dead: max(3 × heartbeat, 3 s).
func SilenceLimit(heartbeat time.Duration) time.Duration {
	return max(silenceBeats*heartbeat, MinSilenceLimit)
}

// hearing is when the server last said anything on the control stream.
// While nodemon carries out a command it reads nothing, so the time spent
// does not count as the server's silence.
type hearing struct {
	mu     sync.Mutex
	last   time.Time
	inWork bool
}

func newHearing(now time.Time) *hearing { return &hearing{last: now} }

// heard records a message from the server at now.
func (h *hearing) heard(now time.Time) {
	h.mu.Lock()
	h.last = now
	h.mu.Unlock()
}

// busy marks a command in progress (true) or done (false); the silence
// counts again from when it is done.
func (h *hearing) busy(on bool) {
	h.mu.Lock()
	h.inWork = on
	if !on {
		h.last = time.Now()
	}
	h.mu.Unlock()
}

// silence is how long the server has said nothing as of now (zero while
// a command is in progress).
func (h *hearing) silence(now time.Time) time.Duration {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.inWork {
		return 0
	}
	return now.Sub(h.last)
}

// sessionKept is logged each time the watchdog finds the server heard
// within the silence limit.
const sessionKept = "server heard within the silence limit; session kept"

// watchdog ends the session once the server has been silent for
// a.silenceLimit.
func (a *Agent) watchdog(ctx context.Context, h *hearing) error {
	t := time.NewTimer(a.silenceLimit)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
		}
		quiet := h.silence(time.Now())
		if quiet >= a.silenceLimit {
			return fmt.Errorf("nothing from the server for %s (it answers every heartbeat, every %s): taking it for dead and dialing again",
				quiet.Round(time.Millisecond), a.cfg.Heartbeat)
		}
		// Said at every look, so that staying is as visible as leaving.
		a.log.Debug(sessionKept, "quiet", quiet.Round(time.Millisecond), "limit", a.silenceLimit)
		t.Reset(a.silenceLimit - quiet)
	}
}
