package agent

import (
	"fmt"
	"sync"
	"time"

	"github.com/gpuctl/gpuctl/api"
)

// telemetryBuffer holds batches not yet sent. While the server is away it
// keeps the newest max batches and counts the ones it had to drop; the
// count travels in every later batch, so a gap is never silent.
type telemetryBuffer struct {
	mu      sync.Mutex
	batches []*api.Telemetry
	max     int
	dropped uint64
	ready   chan struct{}
}

func newTelemetryBuffer(max int) *telemetryBuffer {
	return &telemetryBuffer{max: max, ready: make(chan struct{}, 1)}
}

func (b *telemetryBuffer) add(t *api.Telemetry) {
	b.mu.Lock()
	if len(b.batches) >= b.max {
		n := len(b.batches) - b.max + 1
		b.batches = append(b.batches[:0], b.batches[n:]...)
		b.dropped += uint64(n)
	}
	b.batches = append(b.batches, t)
	b.mu.Unlock()
	select {
	case b.ready <- struct{}{}:
	default:
	}
}

// take removes and returns every buffered batch, stamping the drop count.
func (b *telemetryBuffer) take() []*api.Telemetry {
	b.mu.Lock()
	defer b.mu.Unlock()
	out := b.batches
	b.batches = nil
	for _, t := range out {
		t.DroppedBatches = b.dropped
	}
	return out
}

// putBack returns unsent batches to the front of the buffer.
func (b *telemetryBuffer) putBack(ts []*api.Telemetry) {
	if len(ts) == 0 {
		return
	}
	b.mu.Lock()
	b.batches = append(ts, b.batches...)
	if over := len(b.batches) - b.max; over > 0 {
		b.batches = b.batches[over:]
		b.dropped += uint64(over)
	}
	b.mu.Unlock()
}

func (b *telemetryBuffer) droppedCount() uint64 {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.dropped
}

// eventQueue keeps every event until the server acknowledges it as
// persisted. Events are numbered once a server has said which seq it has
// already seen for this node, so a restarted nodemon never reuses one.
type eventQueue struct {
	mu       sync.Mutex
	pending  []*api.Event
	next     uint64 // next seq to assign; 0 until the first welcome
	max      int
	overflow uint64
	ready    chan struct{}
	// observe, when set, sees every event as it is queued (the XID
	// counters of the metrics endpoint).
	observe func(*api.Event)
}

func newEventQueue(max int) *eventQueue {
	return &eventQueue{max: max, ready: make(chan struct{}, 1)}
}

// add queues e. Past max pending events the oldest unsent ones are
// replaced by one summary event stating how many were dropped.
func (q *eventQueue) add(e *api.Event) {
	if q.observe != nil {
		q.observe(e)
	}
	q.mu.Lock()
	if len(q.pending) >= q.max {
		drop := len(q.pending) / 2
		q.overflow += uint64(drop)
		q.pending = append(q.pending[:0], q.pending[drop:]...)
		q.pending = append(q.pending, &api.Event{
			TimeUnixNano: time.Now().UnixNano(),
			Kind:         api.EventKind_EVENT_KIND_PROBE,
			Severity:     api.Severity_SEVERITY_WARNING,
			Message:      fmt.Sprintf("event queue overflowed while the server was unreachable: %d events dropped in all", q.overflow),
		})
	}
	if q.next > 0 {
		e.Seq = q.next
		q.next++
	}
	q.pending = append(q.pending, e)
	q.mu.Unlock()
	q.signal()
}

func (q *eventQueue) signal() {
	select {
	case q.ready <- struct{}{}:
	default:
	}
}

// welcome is called when a server accepts the node and says which seq it
// has persisted for it: events up to that seq are done, and events queued
// before any server was reached are numbered after it. Numbering only
// starts here, so a restarted nodemon never reuses a seq.
func (q *eventQueue) welcome(lastPersisted uint64) {
	q.mu.Lock()
	defer q.mu.Unlock()
	if q.next <= lastPersisted {
		q.next = lastPersisted + 1
	}
	kept := q.pending[:0]
	for _, e := range q.pending {
		switch {
		case e.Seq == 0:
			e.Seq = q.next
			q.next++
		case e.Seq <= lastPersisted:
			continue
		}
		kept = append(kept, e)
	}
	q.pending = kept
}

// since returns the pending events with seq > after, in order.
func (q *eventQueue) since(after uint64) []*api.Event {
	q.mu.Lock()
	defer q.mu.Unlock()
	var out []*api.Event
	for _, e := range q.pending {
		if e.Seq > after {
			out = append(out, e)
		}
	}
	return out
}

// ack forgets every event up to seq.
func (q *eventQueue) ack(seq uint64) {
	q.mu.Lock()
	defer q.mu.Unlock()
	i := 0
	for i < len(q.pending) && q.pending[i].Seq != 0 && q.pending[i].Seq <= seq {
		i++
	}
	q.pending = append(q.pending[:0], q.pending[i:]...)
}

func (q *eventQueue) len() int {
	q.mu.Lock()
	defer q.mu.Unlock()
	return len(q.pending)
}
