package tui

import (
	"context"
	"slices"
	"sync"
	"testing"
	"time"

	tea "charm.land/bubbletea/v2"
	"github.com/charmbracelet/colorprofile"

	"github.com/gpuctl/gpuctl/transport"
	"github.com/gpuctl/gpuctl/tui/app"
	"github.com/gpuctl/gpuctl/tui/feed"
	"github.com/gpuctl/gpuctl/tui/fixture"
)

func benchModel(b *testing.B, nodes int, w, h int) *Model {
	b.Helper()
	p, dark := colorprofile.ANSI256, true
	m := New(Options{Client: &fixture.Client{}, Role: transport.RoleOperator, Profile: &p, Dark: &dark,
		Now: func() time.Time { return fixture.Now }})
	m.Update(tea.WindowSizeMsg{Width: w, Height: h})
	m.Update(app.SnapshotMsg{Snap: fixture.Cluster(nodes, 8)})
	return m
}

// BenchmarkOverviewFrame draws the overview of 2,000 nodes × 8 GPUs in a
// 200×50 terminal, in colour (goal: under 5 ms).
func BenchmarkOverviewFrame(b *testing.B) {
	m := benchModel(b, 2000, 200, 50)
	m.Render()
	b.ResetTimer()
	for b.Loop() {
		m.Render()
	}
	b.ReportMetric(float64(b.Elapsed().Microseconds())/float64(b.N)/1000, "ms/frame")
}

// BenchmarkNodesFrame draws the node table with 2,000 rows (goal: under 5 ms).
func BenchmarkNodesFrame(b *testing.B) {
	m := benchModel(b, 2000, 200, 50)
	m.run("nodes")
	m.Render()
	b.ResetTimer()
	for b.Loop() {
		m.Render()
	}
	b.ReportMetric(float64(b.Elapsed().Microseconds())/float64(b.N)/1000, "ms/frame")
}

// BenchmarkSnapshotApply is what one snapshot of 2,000 nodes costs the
// console (history, totals, every view on the stack) before it draws.
func BenchmarkSnapshotApply(b *testing.B) {
	m := benchModel(b, 2000, 200, 50)
	m.run("nodes")
	s := fixture.Cluster(2000, 8)
	for b.Loop() {
		m.Update(app.SnapshotMsg{Snap: s})
	}
	b.ReportMetric(float64(b.Elapsed().Microseconds())/float64(b.N)/1000, "ms/snapshot")
}

// frameWriter records when the program writes a frame.
type frameWriter struct {
	mu     sync.Mutex
	writes []time.Time
	cond   *sync.Cond
}

func newFrameWriter() *frameWriter {
	w := &frameWriter{}
	w.cond = sync.NewCond(&w.mu)
	return w
}

func (w *frameWriter) Write(p []byte) (int, error) {
	w.mu.Lock()
	w.writes = append(w.writes, time.Now())
	w.cond.Broadcast()
	w.mu.Unlock()
	return len(p), nil
}

// after waits for the first write after t, up to limit.
func (w *frameWriter) after(t time.Time, limit time.Duration) (time.Time, bool) {
	deadline := time.Now().Add(limit)
	w.mu.Lock()
	defer w.mu.Unlock()
	for {
		for i := len(w.writes) - 1; i >= 0 && w.writes[i].After(t); i-- {
			if i == 0 || !w.writes[i-1].After(t) {
				return w.writes[i], true
			}
		}
		if time.Now().After(deadline) {
			return time.Time{}, false
		}
		go func() { time.Sleep(5 * time.Millisecond); w.cond.Broadcast() }()
		w.cond.Wait()
	}
}

// BenchmarkKeyToRedraw runs a real program (its renderer writing frames)
// while 2,000 simulated nodes stream changes at 1 Hz through a feed, and
// measures from a key press to the next frame written (goal: p99 under
// 50 ms).
func BenchmarkKeyToRedraw(b *testing.B) {
	const nodes = 2000
	p, dark := colorprofile.ANSI256, true
	m := New(Options{Client: &fixture.Client{}, Role: transport.RoleOperator, Profile: &p, Dark: &dark})
	out := newFrameWriter()
	prog := tea.NewProgram(m, tea.WithInput(nil), tea.WithOutput(out), tea.WithWindowSize(200, 50),
		tea.WithColorProfile(colorprofile.ANSI256), tea.WithoutSignals())
	hub := feed.New(nil, feed.Options{})
	unsub := hub.Subscribe(prog.Send)
	defer unsub()
	hub.Apply(fixture.SnapshotBatch(fixture.Cluster(nodes, 8)))
	hub.Flush()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var wg sync.WaitGroup
	wg.Go(func() {
		// The cluster streams: every node changes once a second, as
		// nodemon's 1 Hz samples do; the feed hands out at most 4 a second.
		t := time.NewTicker(time.Second)
		flush := time.NewTicker(feed.DefaultInterval)
		defer t.Stop()
		defer flush.Stop()
		for tick, rev := 1, uint64(43); ; tick, rev = tick+1, rev+1 {
			select {
			case <-ctx.Done():
				return
			case <-t.C:
				hub.Apply(fixture.NodesBatch(nodes, 8, tick, rev))
			case <-flush.C:
				hub.Flush()
			}
		}
	})
	done := make(chan struct{})
	go func() {
		prog.Run()
		close(done)
	}()
	if _, ok := out.after(time.Time{}, 10*time.Second); !ok {
		b.Fatal("no first frame")
	}
	var lat []time.Duration
	keys := []tea.KeyPressMsg{{Code: tea.KeyRight}, {Code: tea.KeyLeft}}
	b.ResetTimer()
	for i := 0; b.Loop(); i++ {
		time.Sleep(37 * time.Millisecond) // presses at a typist's pace, unaligned with the feed
		t0 := time.Now()
		prog.Send(keys[i%2])
		t1, ok := out.after(t0, 2*time.Second)
		if !ok {
			b.Fatal("no frame after a key press within 2 s")
		}
		lat = append(lat, t1.Sub(t0))
	}
	b.StopTimer()
	cancel()
	wg.Wait()
	prog.Quit()
	<-done
	slices.Sort(lat)
	pct := func(q float64) float64 {
		return float64(lat[min(int(q*float64(len(lat))), len(lat)-1)].Microseconds()) / 1000
	}
	b.ReportMetric(pct(0.5), "p50-ms")
	b.ReportMetric(pct(0.99), "p99-ms")
	b.ReportMetric(0, "ns/op")
}

// BenchmarkCommandLineTyping types 10 KB and 100 KB into the `:` line one
// key at a time, each key followed by a call to View as the program makes
// one, and reports the time per KB: the same for both sizes when input is
// linear. "every-frame" draws on each key (the local console); "coalesced"
// at most every 250 ms (the SSH console).
func BenchmarkCommandLineTyping(b *testing.B) {
	for _, c := range []struct {
		name string
		kb   int
		min  time.Duration
	}{{"every-frame/10KB", 10, 0}, {"every-frame/100KB", 100, 0}, {"coalesced/10KB", 10, 250 * time.Millisecond}, {"coalesced/100KB", 100, 250 * time.Millisecond}} {
		kb := c.kb
		b.Run(c.name, func(b *testing.B) {
			m := benchModel(b, 200, 200, 50)
			m.frames.min, m.frames.data = c.min, c.min
			for b.Loop() {
				m.Update(tea.KeyPressMsg{Code: ':', Text: ":"})
				for i := range kb * 1024 {
					c := rune('a' + i%26)
					m.Update(tea.KeyPressMsg{Code: c, Text: string(c)})
					m.View()
				}
				m.Update(tea.KeyPressMsg{Code: tea.KeyEscape})
			}
			b.ReportMetric(float64(b.Elapsed().Microseconds())/float64(b.N)/1000/float64(kb), "ms/KB")
		})
	}
}
