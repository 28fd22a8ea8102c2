package nodes

import (
	"slices"
	"sync"
	"time"
)

// lateness estimates how late the server hears heartbeats now. Each
// heartbeat carries its node's send time; less the least gap ever seen
// from that session (the node's clock offset and the network's floor),
// what remains is how long it waited on the way, the server's own
// backlog (its socket, QUIC, the goroutines in between) included. When
// most nodes' heartbeats come late, the server is behind, not the nodes:
// the detector credits every node the median lateness of the last second
// (CheckHeartbeats), which one dead node or a few slow ones cannot raise.
type lateness struct {
	mu      sync.Mutex
	samples [1024]lateSample
	next    int
}

type lateSample struct {
	at   time.Time
	late time.Duration
}

// lateWindow is how recent a heartbeat's lateness must be to count, and
// lateMinSamples how many must be that recent for a median.
const (
	lateWindow     = time.Second
	lateMinSamples = 8
)

func (l *lateness) add(at time.Time, late time.Duration) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.samples[l.next] = lateSample{at, late}
	l.next = (l.next + 1) % len(l.samples)
}

// median is the median lateness of the heartbeats heard in the window
// before now, or 0 with too few of them.
func (l *lateness) median(now time.Time) time.Duration {
	l.mu.Lock()
	recent := make([]time.Duration, 0, len(l.samples))
	for _, s := range l.samples {
		if !s.at.IsZero() && now.Sub(s.at) <= lateWindow {
			recent = append(recent, s.late)
		}
	}
	l.mu.Unlock()
	if len(recent) < lateMinSamples {
		return 0
	}
	slices.Sort(recent)
	return recent[len(recent)/2]
}

// heard notes a heartbeat's lateness, once per heartbeat (it comes by
// datagram and on the stream; the first to arrive counts).
func (ns *session) heardLate(seq uint64, sentUnixNano int64, now time.Time) {
	if sentUnixNano <= 0 || seq == 0 {
		return
	}
	for {
		prev := ns.sampled.Load()
		if seq <= prev {
			return
		}
		if ns.sampled.CompareAndSwap(prev, seq) {
			break
		}
	}
	gap := now.UnixNano() - sentUnixNano
	least := gap
	for {
		prev := ns.leastGap.Load()
		if prev != 0 && prev-1 <= least {
			least = prev - 1
			break
		}
		if ns.leastGap.CompareAndSwap(prev, least+1) { // 0 means none yet
			break
		}
	}
	ns.r.late.add(now, time.Duration(gap-least))
}
