package views

import (
	"fmt"
	"io"
	"sort"
	"strconv"
	"strings"
	"unicode"
	"unicode/utf8"

	"github.com/gpuctl/gpuctl/api"
)

// column is one column of a table; flex marks the free-text column that
// is cut to make the table fit the terminal. A table with no free text to
// cut fits by leaving out columns instead, as kubectl does: drop > 0
// marks one that may go, the highest first; `-o wide` shows them all.
type column struct {
	name string
	flex bool
	drop int
}

// cell is one table cell: its text and, where the text does not sort as
// it should (ages, sizes, counts), the value it sorts by.
type cell struct {
	text string
	key  any // float64 or string; nil sorts by text
}

func txt(s string) cell { return cell{text: s} }

// num is a cell that sorts by v.
func num(text string, v float64) cell { return cell{text: text, key: v} }

// count is an integer cell.
func count[T ~int | ~int32 | ~int64 | ~uint32 | ~uint64](v T) cell {
	return cell{text: strconv.FormatInt(int64(v), 10), key: float64(v)}
}

// tableData is a table before it is laid out.
type tableData struct {
	cols []column
	rows [][]cell
	// empty says in words that there are no rows, e.g. "no jobs".
	empty string
}

func (t *tableData) add(cells ...cell) { t.rows = append(t.rows, cells) }

// normColumn folds a column name for --sort-by: case, spaces, dashes
// and underscores aside.
func normColumn(s string) string {
	var b strings.Builder
	for _, r := range strings.ToLower(s) {
		if unicode.IsLetter(r) || unicode.IsDigit(r) {
			b.WriteRune(r)
		}
	}
	return b.String()
}

// sortRows orders the rows by the column named by, stably.
func (t *tableData) sortRows(by string) error {
	if by == "" {
		return nil
	}
	idx := -1
	names := make([]string, len(t.cols))
	for i, c := range t.cols {
		names[i] = strings.ToLower(strings.ReplaceAll(c.name, " ", "-"))
		if normColumn(c.name) == normColumn(by) {
			idx = i
		}
	}
	if idx < 0 {
		return fmt.Errorf("--sort-by %q: no such column; use one of %s", by, strings.Join(names, ", "))
	}
	sort.SliceStable(t.rows, func(a, b int) bool {
		ka, kb := sortKey(t.rows[a][idx]), sortKey(t.rows[b][idx])
		fa, aok := ka.(float64)
		fb, bok := kb.(float64)
		switch {
		case aok && bok:
			return fa < fb
		case aok != bok:
			return aok // numbers before text ("-")
		}
		return ka.(string) < kb.(string)
	})
	return nil
}

func sortKey(c cell) any {
	if c.key != nil {
		return c.key
	}
	return c.text
}

func width(s string) int { return utf8.RuneCountInString(s) }

// cut shortens s to at most n columns, ending in an ellipsis when cut.
func cut(s string, n int) string {
	switch {
	case width(s) <= n:
		return s
	case n <= 0:
		return ""
	}
	return string([]rune(s)[:n-1]) + "…"
}

// minFlex is the narrowest a free-text column is cut to.
const minFlex = 12

// writeTable sorts, escapes and lays out t: columns two spaces apart, the
// flex column cut so the table fits o's width, the last column not padded.
// An empty table writes nothing to w and its empty sentence to o.Stderr.
func (o Options) writeTable(w io.Writer, t tableData) error {
	if len(t.rows) == 0 {
		if o.Stderr != nil && t.empty != "" {
			fmt.Fprintln(o.Stderr, t.empty)
		}
		return nil
	}
	if err := t.sortRows(o.SortBy); err != nil {
		return err
	}
	cells := make([][]string, 0, len(t.rows)+1)
	if !o.NoHeaders {
		head := make([]string, len(t.cols))
		for i, c := range t.cols {
			head[i] = c.name
		}
		cells = append(cells, head)
	}
	for _, r := range t.rows {
		row := make([]string, len(t.cols))
		for i := range t.cols {
			if i < len(r) {
				row[i] = api.EscapeText(r[i].text)
			}
		}
		cells = append(cells, row)
	}
	widths := make([]int, len(t.cols))
	for _, r := range cells {
		for i, c := range r {
			widths[i] = max(widths[i], width(c))
		}
	}
	if limit := o.width(); limit > 0 {
		total := 2 * (len(widths) - 1)
		for _, wd := range widths {
			total += wd
		}
		for i, c := range t.cols {
			if c.flex && total > limit {
				widths[i] = max(min(widths[i], minFlex), widths[i]-(total-limit))
				break
			}
		}
		cells, widths = dropColumns(t.cols, cells, widths, total-limit)
	}
	var b strings.Builder
	for _, r := range cells {
		b.Reset()
		for i, c := range r {
			c = cut(c, widths[i])
			b.WriteString(c)
			if i < len(r)-1 {
				b.WriteString(strings.Repeat(" ", widths[i]-width(c)+2))
			}
		}
		if _, err := fmt.Fprintln(w, strings.TrimRight(b.String(), " ")); err != nil {
			return err
		}
	}
	return nil
}

// dropColumns leaves out the droppable columns, highest drop first, until
// the table is over by nothing (or none is left to drop).
func dropColumns(cols []column, cells [][]string, widths []int, over int) ([][]string, []int) {
	gone := map[int]bool{}
	for over > 0 {
		pick := -1
		for i, c := range cols {
			if c.drop > 0 && !gone[i] && (pick < 0 || c.drop > cols[pick].drop) {
				pick = i
			}
		}
		if pick < 0 {
			break
		}
		gone[pick] = true
		over -= widths[pick] + 2
	}
	if len(gone) == 0 {
		return cells, widths
	}
	keep := func(r []string) []string {
		out := make([]string, 0, len(r)-len(gone))
		for i, c := range r {
			if !gone[i] {
				out = append(out, c)
			}
		}
		return out
	}
	for i, r := range cells {
		cells[i] = keep(r)
	}
	kept := make([]int, 0, len(widths)-len(gone))
	for i, wd := range widths {
		if !gone[i] {
			kept = append(kept, wd)
		}
	}
	return cells, kept
}

func dash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}
