package tui

import (
	"testing"
	"time"

	tea "charm.land/bubbletea/v2"

	"github.com/gpuctl/gpuctl/transport"
	"github.com/gpuctl/gpuctl/tui/feed"
	"github.com/gpuctl/gpuctl/tui/fixture"
)

// Two consoles fed by one hub draw from one history, which the hub records
// once per snapshot, and draw the same screen of it.
func TestConsolesShareTheFeedsWork(t *testing.T) {
	hub := feed.New(nil, feed.Options{})
	consoles := make([]*harness, 2)
	msgs := make([]chan tea.Msg, 2)
	for i := range consoles {
		consoles[i] = newHarness(t, transport.RoleViewer, 120, 40)
		ch := make(chan tea.Msg, 1)
		msgs[i] = ch
		defer hub.Subscribe(func(msg tea.Msg) { ch <- msg })()
	}
	for tick := 1; tick <= 3; tick++ {
		hub.Apply(fixture.SnapshotBatch(fixture.Cluster(40, 8)))
		hub.Apply(fixture.NodesBatch(40, 8, tick, uint64(100+tick)))
		hub.Flush()
		var screens []string
		for i, hs := range consoles {
			select {
			case msg := <-msgs[i]:
				hs.send(msg)
			case <-time.After(5 * time.Second):
				t.Fatalf("console %d got no snapshot", i)
			}
			screens = append(screens, hs.m.Render())
		}
		h := consoles[0].m.ctx.History
		if consoles[1].m.ctx.History != h {
			t.Fatalf("snapshot %d: the consoles read two histories", tick)
		}
		if screens[0] != screens[1] {
			t.Fatalf("snapshot %d: the same view of one snapshot differs between consoles", tick)
		}
	}
}
