package feed

import (
	"testing"
	"time"

	tea "charm.land/bubbletea/v2"

	"github.com/gpuctl/gpuctl/tui/app"
	"github.com/gpuctl/gpuctl/tui/fixture"
)

// Every console fed by one hub reads the one history the hub records, once
// per snapshot, whatever the number of consoles.
func TestSubscribersShareOneHistory(t *testing.T) {
	now := fixture.Now
	hub := New(nil, Options{Now: func() time.Time { return now }})
	const sessions, snapshots = 3, 4
	got := make([]chan app.SnapshotMsg, sessions)
	for i := range got {
		ch := make(chan app.SnapshotMsg, 1)
		got[i] = ch
		cancel := hub.Subscribe(func(msg tea.Msg) {
			if s, ok := msg.(app.SnapshotMsg); ok {
				ch <- s
			}
		})
		defer cancel()
	}
	for tick := 1; tick <= snapshots; tick++ {
		now = now.Add(time.Second)
		hub.Apply(fixture.NodesBatch(10, 8, tick, uint64(tick)))
		hub.Flush()
		var first *app.History
		for i, ch := range got {
			var msg app.SnapshotMsg
			select {
			case msg = <-ch:
			case <-time.After(5 * time.Second):
				t.Fatalf("snapshot %d: console %d got nothing", tick, i)
			}
			if msg.History == nil {
				t.Fatalf("snapshot %d: console %d got no history", tick, i)
			}
			if first == nil {
				first = msg.History
			} else if msg.History != first {
				t.Fatalf("snapshot %d: console %d got a history of its own", tick, i)
			}
		}
		// Recorded once per snapshot: a sample per snapshot, not per console.
		if n := len(first.Node["node-0003"].Values()); n != tick {
			t.Fatalf("after %d snapshots the node's history holds %d samples", tick, n)
		}
	}
	// A console that subscribes later starts from the same history.
	late := make(chan app.SnapshotMsg, 1)
	cancel := hub.Subscribe(func(msg tea.Msg) {
		if s, ok := msg.(app.SnapshotMsg); ok {
			late <- s
		}
	})
	defer cancel()
	select {
	case msg := <-late:
		if n := len(msg.History.GPU["node-0007"][5].Util.Values()); n != snapshots {
			t.Errorf("a late console's GPU history holds %d samples, want %d", n, snapshots)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("a late console got no snapshot")
	}
}
