package sshserve

import (
	"io"
	"strings"
	"sync"

	tea "charm.land/bubbletea/v2"
	"github.com/charmbracelet/x/ansi"
)

// lineScreen draws a session's console a line at a time: each frame, the
// rows whose text changed are erased and written again, exactly as the
// console rendered them. bubbletea's own renderer keeps a cell model of
// the screen, parses every frame into it and diffs cell by cell, choosing
// each cell's colours anew; for a heat map whose colours change every
// second that was most of what a session cost the server (7 ms a frame at
// 200×50, against well under 1 ms here). A line renderer has no width
// model of its own, so the console's lines must fit the terminal, as they
// do (its views draw to the width); automatic wrap is off besides, so a
// line the terminal measures wider is clipped, never wrapped.
//
// Frames are handed over by the program's loop and drawn by a goroutine
// of the screen's own, latest frame first: a slow client skips frames
// instead of holding up its program. The program's own output (its
// terminal queries) goes through Write, under the same lock, so it never
// lands inside a frame.
type lineScreen struct {
	out io.Writer

	mu sync.Mutex // writes to out
	// Handed over by the program's loop, taken by draw.
	next      chan struct{}
	handMu    sync.Mutex
	frame     string
	height    int
	repaint   bool
	stop      chan struct{}
	stopped   chan struct{}
	closeOnce sync.Once

	// rows is what the terminal shows, owned by draw.
	rows []string
}

// The modes a session's console runs in, set at its start and undone at
// its end: the alternate screen, no cursor, mouse button and motion
// events in SGR form, bracketed paste, no automatic wrap.
const (
	screenEnter = ansi.SetModeAltScreenSaveCursor + ansi.HideCursor + ansi.SetModeMouseButtonEvent +
		ansi.SetModeMouseExtSgr + ansi.SetModeBracketedPaste + ansi.ResetModeAutoWrap + ansi.EraseEntireScreen
	screenLeave = ansi.ResetStyle + ansi.SetModeAutoWrap + ansi.ResetModeBracketedPaste + ansi.ResetModeMouseExtSgr +
		ansi.ResetModeMouseButtonEvent + ansi.ShowCursor + ansi.ResetModeAltScreenSaveCursor
)

func newScreen(out io.Writer, height int, title string) *lineScreen {
	s := &lineScreen{out: out, height: height, next: make(chan struct{}, 1), stop: make(chan struct{}), stopped: make(chan struct{})}
	// The console asks for the terminal's background (light or dark) at
	// its start; the program sends its queries only at its frame rate.
	s.write(screenEnter + ansi.SetWindowTitle(title) + ansi.RequestBackgroundColor)
	go s.draw()
	return s
}

// Write is the program's output: queries, written between frames.
func (s *lineScreen) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.out.Write(p)
}

func (s *lineScreen) write(text string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	_, _ = io.WriteString(s.out, text)
}

// show hands a frame over to be drawn.
func (s *lineScreen) show(frame string) {
	s.handMu.Lock()
	s.frame = frame
	s.handMu.Unlock()
	s.wake()
}

// resize draws the next frame whole, on a cleared screen, at most height
// rows of it.
func (s *lineScreen) resize(height int) {
	s.handMu.Lock()
	s.height, s.repaint = height, true
	s.handMu.Unlock()
}

func (s *lineScreen) wake() {
	select {
	case s.next <- struct{}{}:
	default:
	}
}

func (s *lineScreen) draw() {
	defer close(s.stopped)
	for {
		select {
		case <-s.stop:
			return
		case <-s.next:
		}
		s.handMu.Lock()
		frame, height, repaint := s.frame, s.height, s.repaint
		s.repaint = false
		s.handMu.Unlock()
		if repaint {
			s.rows = nil
		}
		if out := s.changes(frame, height, repaint); out != "" {
			s.write(out)
		}
	}
}

// changes is what brings the terminal from s.rows to frame, and records
// frame as shown.
func (s *lineScreen) changes(frame string, height int, repaint bool) string {
	rows := strings.Split(frame, "\n")
	if height > 0 && len(rows) > height {
		rows = rows[:height]
	}
	var b strings.Builder
	b.Grow(len(frame) + 32*len(rows))
	if repaint {
		b.WriteString(ansi.ResetStyle + ansi.EraseEntireScreen)
	}
	for y, row := range rows {
		if y < len(s.rows) && s.rows[y] == row {
			continue
		}
		b.WriteString(ansi.CursorPosition(1, y+1) + ansi.ResetStyle + ansi.EraseEntireLine)
		b.WriteString(row)
	}
	// Rows the last frame had and this one has not.
	for y := len(rows); y < len(s.rows); y++ {
		b.WriteString(ansi.CursorPosition(1, y+1) + ansi.ResetStyle + ansi.EraseEntireLine)
	}
	s.rows = rows
	if b.Len() == 0 {
		return ""
	}
	// Terminals that know synchronized output show the frame at once.
	return ansi.SetModeSynchronizedOutput + b.String() + ansi.ResetStyle + ansi.ResetModeSynchronizedOutput
}

// close stops drawing and gives the terminal back as it was.
func (s *lineScreen) close() {
	s.closeOnce.Do(func() {
		close(s.stop)
		<-s.stopped
		s.write(screenLeave)
	})
}

// drawnBy is the console's model drawn by a screen instead of by
// bubbletea's renderer (which the program runs without).
type drawnBy struct {
	tea.Model
	scr  *lineScreen
	last string
}

func (d *drawnBy) Update(msg tea.Msg) (tea.Model, tea.Cmd) {
	if ws, ok := msg.(tea.WindowSizeMsg); ok {
		d.scr.resize(ws.Height)
		d.last = "" // the new size is drawn whole even if the frame is the same
	}
	m, cmd := d.Model.Update(msg)
	d.Model = m
	return d, cmd
}

// View hands the console's frame to the screen when it changed; the
// program's own renderer is off, so what View returns is not drawn.
func (d *drawnBy) View() tea.View {
	v := d.Model.View()
	if v.Content != d.last {
		d.last = v.Content
		d.scr.show(v.Content)
	}
	return tea.View{}
}
