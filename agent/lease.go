package agent

import (
	"bytes"
	"fmt"
	"os"
	"strconv"
	"sync"
	"time"
)

// Fencing: a rank may run only while the server confirms its node. The
// server grants a lease (Welcome.lease_ms) and renews it in answer to each
// heartbeat; the deadline counts from when the answered heartbeat was
// sent, never from when the answer came, so it never ends later than the
// server reckons (its last contact plus the lease). nodemon writes the
// deadline into one lease file per job attempt, and each rank's shim stops
// its rank once the deadline in that file has passed. The shim, not
// nodemon, enforces it: a stopped or killed nodemon kills nothing.

// leaseGrace is how long a rank stopped by its lease has after SIGTERM
// before SIGKILL. The server waits a second past the lease before it
// relaunches, so this must stay well under that.
const leaseGrace = 500 * time.Millisecond

// leaseCheckEvery is how often a shim reads its lease file.
const leaseCheckEvery = 100 * time.Millisecond

// leaseClock remembers when recent heartbeats were sent, so a renewal
// that answers one turns into a deadline.
type leaseClock struct {
	mu    sync.Mutex
	sent  map[uint64]time.Time
	order []uint64
}

// leaseClockKeep bounds the heartbeats remembered; an answer to an older
// one is too late to matter.
const leaseClockKeep = 64

func newLeaseClock() *leaseClock { return &leaseClock{sent: map[uint64]time.Time{}} }

// sentAt records that heartbeat seq was sent at t.
func (c *leaseClock) sentAt(seq uint64, t time.Time) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.sent[seq] = t
	c.order = append(c.order, seq)
	if len(c.order) > leaseClockKeep {
		delete(c.sent, c.order[0])
		c.order = c.order[1:]
	}
}

// deadline is the end of a lease of length d granted in answer to
// heartbeat seq; ok is false for a heartbeat it does not know (from an
// earlier session, or too old).
func (c *leaseClock) deadline(seq uint64, d time.Duration) (time.Time, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	t, ok := c.sent[seq]
	if !ok || d <= 0 {
		return time.Time{}, false
	}
	return t.Add(d), true
}

// reset forgets every heartbeat: a new session numbers them afresh.
func (c *leaseClock) reset() {
	c.mu.Lock()
	defer c.mu.Unlock()
	clear(c.sent)
	c.order = nil
}

// writeLease writes deadline (Unix nanoseconds) to path atomically.
func writeLease(path string, deadline time.Time) error {
	return writeFileAtomic(path, []byte(strconv.FormatInt(deadline.UnixNano(), 10)+"\n"))
}

// readLease reads the deadline in a lease file.
func readLease(path string) (time.Time, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return time.Time{}, err
	}
	n, err := strconv.ParseInt(string(bytes.TrimSpace(b)), 10, 64)
	if err != nil || n <= 0 {
		return time.Time{}, fmt.Errorf("lease file %s: %q is not a deadline", path, b)
	}
	return time.Unix(0, n), nil
}

// leaseWatch is a shim's view of its rank's lease.
type leaseWatch struct {
	path     string
	deadline time.Time
	// readErr is the last failure to read the file; the last deadline read
	// still holds (a file being replaced, a full disk must not extend it).
	readErr error
}

// expired reads the lease file and reports whether its deadline has
// passed at now. A file that cannot be read leaves the deadline it had:
// only nodemon extends a lease, and an unreadable file extends nothing.
func (w *leaseWatch) expired(now time.Time) bool {
	if d, err := readLease(w.path); err == nil {
		if d.After(w.deadline) {
			w.deadline = d
		}
		w.readErr = nil
	} else {
		w.readErr = err
	}
	return !w.deadline.IsZero() && now.After(w.deadline)
}
