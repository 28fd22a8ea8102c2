package app

import (
	"slices"
	"sync"
	"testing"

	"github.com/gpuctl/gpuctl/client"
	"github.com/gpuctl/gpuctl/tui/fixture"
)

func TestRingKeepsTheLastValues(t *testing.T) {
	var r Ring
	if r.Last() != 0 || len(r.Values()) != 0 {
		t.Fatalf("empty ring: last %v values %v", r.Last(), r.Values())
	}
	for i := 1; i <= 3*HistoryLen+7; i++ {
		r.Add(int64(i), float64(i))
		r.Add(int64(i), -1) // the same sample again: ignored
		want := make([]float64, 0, HistoryLen)
		for v := max(1, i-HistoryLen+1); v <= i; v++ {
			want = append(want, float64(v))
		}
		if got := r.Values(); !slices.Equal(got, want) {
			t.Fatalf("after %d adds: %v, want %v", i, got, want)
		}
		if r.Last() != float64(i) {
			t.Fatalf("after %d adds: last %v", i, r.Last())
		}
	}
}

// A history handed out stays as it was while the recorder goes on, so
// readers need no lock (run with -race: the readers race the writer).
func TestPublishedHistoryDoesNotChange(t *testing.T) {
	rec := NewRecorder()
	snap := func(tick int) *client.Snapshot {
		s := client.Snapshot{}
		for i := range 4 {
			s.Nodes = append(s.Nodes, fixture.Node(i, 8, tick))
		}
		return &s
	}
	var kept []*History
	var want [][]float64
	for tick := range 5 {
		h := rec.Observe(snap(tick), int64(tick)*1e9)
		kept = append(kept, h)
		want = append(want, h.GPU["node-0002"][3].Util.Values())
	}
	var wg sync.WaitGroup
	for range 4 {
		wg.Go(func() {
			for range 50 {
				for i, h := range kept {
					if got := h.GPU["node-0002"][3].Util.Values(); !slices.Equal(got, want[i]) {
						t.Errorf("history %d changed: %v, was %v", i, got, want[i])
						return
					}
					_ = h.Node["node-0001"].Last()
				}
			}
		})
	}
	for tick := 5; tick < 5+3*HistoryLen; tick++ {
		rec.Observe(snap(tick), int64(tick)*1e9)
	}
	wg.Wait()
	for i, h := range kept {
		if got := h.GPU["node-0002"][3].Util.Values(); !slices.Equal(got, want[i]) {
			t.Errorf("history %d changed once the recorder went on: %v, was %v", i, got, want[i])
		}
	}
	if n := len(want[4]); n != 5 {
		t.Errorf("history after 5 snapshots has %d samples, want 5", n)
	}
	last := rec.Observe(snap(200), 200e9)
	if n := len(last.Node["node-0000"].Values()); n != HistoryLen {
		t.Errorf("node history has %d samples, want %d", n, HistoryLen)
	}
	if n := len(rec.Observe(&client.Snapshot{Nodes: snap(201).Nodes[:1]}, 201e9).GPU); n != 1 {
		t.Errorf("history of a snapshot of 1 node holds %d nodes", n)
	}
}

// What consoles derive from one history is worked out once, however many
// ask at once, and once per key.
func TestDeriveWorksOutOnce(t *testing.T) {
	h := NewRecorder().Observe(&client.Snapshot{}, 0)
	type key int
	var mu sync.Mutex
	calls := map[key]int{}
	var wg sync.WaitGroup
	for i := range 20 {
		wg.Go(func() {
			k := key(i % 2)
			v := h.Derive(k, func() any {
				mu.Lock()
				calls[k]++
				mu.Unlock()
				return int(k) * 10
			})
			if v != int(k)*10 {
				t.Errorf("key %d derived %v", k, v)
			}
		})
	}
	wg.Wait()
	if calls[0] != 1 || calls[1] != 1 {
		t.Errorf("worked out %v times per key, want once each", calls)
	}
}
