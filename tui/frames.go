package tui

import (
	"time"

	tea "charm.land/bubbletea/v2"
)

// frames coalesces redraws. bubbletea draws a frame after every message;
// with a feed of thousands of nodes, or keys arriving as fast as a paste,
// most of those frames are never seen, and with many sessions on one
// server they are what costs its CPU. So a frame is drawn only when a
// message arrived since the last one: at most once per min after the
// user's input (keys, paste, mouse, resize), at most once per data after
// anything else (the feed: nodes sample once a second). A change drawn
// late is drawn by a tick when its interval ends.
type frames struct {
	min, data time.Duration
	last      tea.View
	drawn     time.Time
	// wait is the interval the undrawn changes allow: min once input
	// came, else data; zero when nothing is undrawn.
	wait    time.Duration
	ticking bool
	due     bool
}

// frameDueMsg ends a coalescing interval with changes still undrawn.
type frameDueMsg struct{}

func isInput(msg tea.Msg) bool {
	switch msg.(type) {
	case tea.KeyPressMsg, tea.PasteMsg, tea.MouseMsg, tea.WindowSizeMsg:
		return true
	}
	return false
}

func (f *frames) update(model tea.Model, msg tea.Msg, update func(tea.Msg) (tea.Model, tea.Cmd)) (tea.Model, tea.Cmd) {
	if _, ok := msg.(frameDueMsg); ok {
		f.ticking = false
		f.due = f.wait > 0 && time.Since(f.drawn) >= f.wait-time.Millisecond
		if f.wait > 0 && !f.due {
			return model, f.tick()
		}
		return model, nil
	}
	m, cmd := update(msg)
	if f.min <= 0 {
		return m, cmd
	}
	w := f.data
	if isInput(msg) {
		w = f.min
	}
	if f.wait == 0 || w < f.wait {
		f.wait = w
	}
	if !f.ticking && time.Since(f.drawn) < f.wait {
		cmd = tea.Batch(cmd, f.tick())
	}
	return m, cmd
}

// tick asks for a frameDueMsg when the undrawn changes' interval ends.
func (f *frames) tick() tea.Cmd {
	f.ticking = true
	return tea.Tick(max(f.wait-time.Since(f.drawn), time.Millisecond), func(time.Time) tea.Msg { return frameDueMsg{} })
}

func (f *frames) view(view func() tea.View) tea.View {
	if f.min <= 0 {
		return view()
	}
	if f.wait > 0 && (f.due || time.Since(f.drawn) >= f.wait) {
		f.last, f.drawn = view(), time.Now()
		f.wait, f.due = 0, false
	}
	return f.last
}
