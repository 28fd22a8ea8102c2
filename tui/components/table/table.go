// Package table is the console's table: columns with fixed or flexible
// widths, a cursor, marks, a sort column, and rendering of only the rows
// that are on screen, whatever the table's length.
package table

import (
	"strings"

	"charm.land/bubbles/v2/key"
	tea "charm.land/bubbletea/v2"
	"charm.land/lipgloss/v2"

	"github.com/gpuctl/gpuctl/tui/app"
	"github.com/gpuctl/gpuctl/tui/styles"
)

// Column is one column of a table.
type Column struct {
	Title string
	// Width in cells; 0 makes the column take what the others leave.
	Width int
	Right bool
	// Wide columns show only in wide mode (ctrl-w).
	Wide bool
}

// Cell is one cell's text (no escape sequences) and an optional style.
type Cell struct {
	Text  string
	Style *lipgloss.Style
}

// Model is a table's state: the rows are the view's, addressed by index.
type Model struct {
	Cols     []Column
	Cursor   int
	Offset   int
	SortCol  int
	SortDesc bool
	// Marked holds the keys of rows marked with space.
	Marked map[string]bool
	rows   int
	height int
}

// KeyMap is the table's part of a view's keymap.
type KeyMap struct {
	Up, Down, PageUp, PageDown, Top, Bottom, Mark, Sort, Reverse key.Binding
}

// DefaultKeyMap returns the table bindings every list view has.
func DefaultKeyMap() KeyMap {
	return KeyMap{
		Up:       app.Bind("↑/k", "up", "up", "k"),
		Down:     app.Bind("↓/j", "down", "down", "j"),
		PageUp:   app.Bind("pgup", "page up", "pgup", "ctrl+b"),
		PageDown: app.Bind("pgdn", "page down", "pgdown", "ctrl+f"),
		Top:      app.Bind("g", "top", "g", "home"),
		Bottom:   app.Bind("G", "bottom", "G", "end"),
		Mark:     app.Bind("space", "mark", "space"),
		Sort:     app.Bind("o", "sort by next column", "o"),
		Reverse:  app.Bind("O", "reverse sort", "O"),
	}
}

// Bindings lists the bindings for help.
func (k KeyMap) Bindings() []key.Binding {
	return []key.Binding{k.Up, k.Down, k.PageUp, k.PageDown, k.Top, k.Bottom, k.Mark, k.Sort, k.Reverse}
}

// New returns a table with columns cols.
func New(cols ...Column) Model { return Model{Cols: cols, Marked: map[string]bool{}} }

// SetRows tells the table how many rows there are now, keeping the cursor
// in range.
func (m *Model) SetRows(n int) {
	m.rows = n
	if m.Cursor >= n {
		m.Cursor = max(n-1, 0)
	}
	m.clampOffset()
}

// Rows returns the row count.
func (m *Model) Rows() int { return m.rows }

// Update handles a navigation key; it reports whether the key was the
// table's and whether the sort changed.
func (m *Model) Update(msg tea.KeyPressMsg, k KeyMap, rowKey func(int) string) (handled, resort bool) {
	page := max(m.height-1, 1)
	switch {
	case key.Matches(msg, k.Up):
		m.Move(-1)
	case key.Matches(msg, k.Down):
		m.Move(1)
	case key.Matches(msg, k.PageUp):
		m.Move(-page)
	case key.Matches(msg, k.PageDown):
		m.Move(page)
	case key.Matches(msg, k.Top):
		m.Move(-m.rows)
	case key.Matches(msg, k.Bottom):
		m.Move(m.rows)
	case key.Matches(msg, k.Mark):
		if m.rows > 0 && rowKey != nil {
			id := rowKey(m.Cursor)
			if m.Marked[id] {
				delete(m.Marked, id)
			} else {
				m.Marked[id] = true
			}
			m.Move(1)
		}
	case key.Matches(msg, k.Sort):
		m.SortCol = (m.SortCol + 1) % len(m.Cols)
		return true, true
	case key.Matches(msg, k.Reverse):
		m.SortDesc = !m.SortDesc
		return true, true
	default:
		return false, false
	}
	return true, false
}

// Move moves the cursor by delta rows.
func (m *Model) Move(delta int) {
	m.Cursor = min(max(m.Cursor+delta, 0), max(m.rows-1, 0))
	m.clampOffset()
}

// Click selects the row at screen line y of the table (0 is the header);
// on the header it sorts by the column under x and reports resort.
func (m *Model) Click(x, y int, width int, wide bool) (resort bool) {
	if y == 0 {
		widths := m.widths(width, wide)
		pos := 0
		for i, w := range widths {
			if w == 0 {
				continue
			}
			if x >= pos && x < pos+w+1 {
				if m.SortCol == i {
					m.SortDesc = !m.SortDesc
				} else {
					m.SortCol, m.SortDesc = i, false
				}
				return true
			}
			pos += w + 1
		}
		return false
	}
	if r := m.Offset + y - 1; r < m.rows {
		m.Cursor = r
	}
	return false
}

// Scroll moves the view by delta rows (mouse wheel).
func (m *Model) Scroll(delta int) { m.Move(delta) }

func (m *Model) clampOffset() {
	h := max(m.height-1, 1)
	if m.Cursor < m.Offset {
		m.Offset = m.Cursor
	}
	if m.Cursor >= m.Offset+h {
		m.Offset = m.Cursor - h + 1
	}
	m.Offset = min(max(m.Offset, 0), max(m.rows-h, 0))
}

// widths returns each column's width, 0 for hidden ones.
func (m *Model) widths(width int, wide bool) []int {
	ws := make([]int, len(m.Cols))
	used, flex := 0, -1
	for i, c := range m.Cols {
		if c.Wide && !wide {
			continue
		}
		if c.Width == 0 {
			if flex < 0 {
				flex = i
			}
			used++
			continue
		}
		ws[i] = c.Width
		used += c.Width + 1
	}
	if flex >= 0 {
		ws[flex] = max(width-used, 6)
	}
	return ws
}

// Render draws the header and the visible rows in width × height: cell
// is asked only for the rows on screen.
func (m *Model) Render(st *styles.Styles, width, height int, wide bool, rowKey func(int) string, cell func(row, col int) Cell) string {
	m.height = height
	m.clampOffset()
	ws := m.widths(width, wide)
	var b strings.Builder
	b.Grow(width * height * 2)
	var hdr strings.Builder
	for i, c := range m.Cols {
		if ws[i] == 0 {
			continue
		}
		t := c.Title
		if i == m.SortCol {
			if m.SortDesc {
				t += "↓"
			} else {
				t += "↑"
			}
		}
		hdr.WriteString(align(t, ws[i], c.Right))
		hdr.WriteByte(' ')
	}
	b.WriteString(st.TableHeader.Render(cut(hdr.String(), width)))
	end := min(m.Offset+height-1, m.rows)
	var line strings.Builder
	for r := m.Offset; r < end; r++ {
		b.WriteByte('\n')
		sel := r == m.Cursor
		marked := rowKey != nil && len(m.Marked) > 0 && m.Marked[rowKey(r)]
		line.Reset()
		plain := sel || marked
		for i, c := range m.Cols {
			if ws[i] == 0 {
				continue
			}
			cl := cell(r, i)
			txt := align(cl.Text, ws[i], c.Right)
			if cl.Style != nil && !plain {
				txt = cl.Style.Render(txt)
			}
			line.WriteString(txt)
			line.WriteByte(' ')
		}
		s := line.String()
		switch {
		case sel && marked:
			s = st.SelectedMarked.Render(cut(s, width))
		case sel:
			s = st.Selected.Render(cut(s, width))
		case marked:
			s = st.Marked.Render(cut(s, width))
		default:
			if !fits(s, width) {
				s = lipgloss.NewStyle().MaxWidth(width).Render(s)
			}
		}
		b.WriteString(s)
	}
	if m.rows == 0 {
		b.WriteString("\n" + st.Dim.Render("  (nothing to show)"))
	}
	return b.String()
}

func align(s string, w int, right bool) string {
	if right {
		return app.PadLeft(s, w)
	}
	return app.Pad(s, w)
}

// cut trims plain text to width cells.
func cut(s string, width int) string {
	r := []rune(s)
	if len(r) > width {
		return string(r[:width])
	}
	return s
}

// fits reports whether a line (plain or styled) is at most width cells;
// styled lines are measured only when their byte length could exceed it.
func fits(s string, width int) bool {
	if len(s) <= width {
		return true
	}
	return lipgloss.Width(s) <= width
}
