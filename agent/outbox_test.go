package agent

import (
	"testing"

	"github.com/gpuctl/gpuctl/api"
)

func seqs(es []*api.Event) []uint64 {
	var out []uint64
	for _, e := range es {
		out = append(out, e.Seq)
	}
	return out
}

func equal(a, b []uint64) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}

func TestEventQueueNumbersAfterServerAndResendsUnacked(t *testing.T) {
	q := newEventQueue(100)
	q.add(&api.Event{Message: "a"})
	q.add(&api.Event{Message: "b"})
	if got := q.since(0); len(got) != 0 {
		t.Fatalf("events sent before a welcome numbered them: %v", seqs(got))
	}
	// A restarted nodemon: the server already holds seq 1..41 from it.
	q.welcome(41)
	if got := seqs(q.since(0)); !equal(got, []uint64{42, 43}) {
		t.Fatalf("after welcome(41): %v, want [42 43]", got)
	}
	q.add(&api.Event{Message: "c"})
	q.ack(42)
	if got := seqs(q.since(0)); !equal(got, []uint64{43, 44}) {
		t.Fatalf("after ack(42): %v", got)
	}
	// Reconnect to a server that persisted 43 but whose ack was lost.
	q.welcome(43)
	if got := seqs(q.since(0)); !equal(got, []uint64{44}) {
		t.Fatalf("after welcome(43): %v", got)
	}
	if got := seqs(q.since(44)); len(got) != 0 {
		t.Fatalf("since(44) = %v", got)
	}
}

func TestEventQueueOverflowIsReported(t *testing.T) {
	q := newEventQueue(10)
	for i := 0; i < 25; i++ {
		q.add(&api.Event{Kind: api.EventKind_EVENT_KIND_XID})
	}
	q.welcome(0)
	got := q.since(0)
	var summaries int
	for _, e := range got {
		if e.Kind == api.EventKind_EVENT_KIND_PROBE {
			summaries++
		}
	}
	if summaries == 0 || len(got) > 11 {
		t.Fatalf("overflow: %d events, %d summaries; want a bounded queue that reports the drop", len(got), summaries)
	}
}

func TestTelemetryBufferDropsOldestAndCounts(t *testing.T) {
	b := newTelemetryBuffer(3)
	for i := 1; i <= 5; i++ {
		b.add(&api.Telemetry{TimeUnixNano: int64(i)})
	}
	got := b.take()
	if len(got) != 3 || got[0].TimeUnixNano != 3 || got[2].DroppedBatches != 2 {
		t.Fatalf("take = %v", got)
	}
	b.putBack(got[1:])
	b.add(&api.Telemetry{TimeUnixNano: 6})
	b.add(&api.Telemetry{TimeUnixNano: 7})
	got = b.take()
	if len(got) != 3 || got[0].TimeUnixNano != 5 || got[2].DroppedBatches != 3 {
		t.Fatalf("after putBack: %d batches, first %d, dropped %d", len(got), got[0].TimeUnixNano, got[len(got)-1].DroppedBatches)
	}
}
