// Package spark draws sparklines, inline bars and small charts from
// series of numbers, as plain text so any style can colour them.
package spark

import (
	"math"
	"strings"
)

var ticks = []rune("▁▂▃▄▅▆▇█")

// Line draws the last width values of vals scaled to [0, top] (top 0: the
// series' own maximum), one cell per value, right-aligned.
func Line(vals []float64, width int, top float64) string {
	if width <= 0 {
		return ""
	}
	if len(vals) > width {
		vals = vals[len(vals)-width:]
	}
	if top <= 0 {
		for _, v := range vals {
			top = math.Max(top, v)
		}
	}
	var b strings.Builder
	b.Grow(width * 3)
	for range width - len(vals) {
		b.WriteByte(' ')
	}
	for _, v := range vals {
		i := 0
		if top > 0 {
			i = int(v / top * float64(len(ticks)-1))
		}
		i = min(max(i, 0), len(ticks)-1)
		b.WriteRune(ticks[i])
	}
	return b.String()
}

var eighths = []rune(" ▏▎▍▌▋▊▉")

// Bar draws f (0..1) as a bar of width cells with eighth-block precision,
// padded with a light shade so its extent shows without colour.
func Bar(f float64, width int) string {
	if width <= 0 {
		return ""
	}
	f = math.Min(math.Max(f, 0), 1)
	full := int(f * float64(width))
	rem := int((f*float64(width) - float64(full)) * 8)
	var b strings.Builder
	b.Grow(width * 3)
	for range full {
		b.WriteRune('█')
	}
	n := full
	if n < width && rem > 0 {
		b.WriteRune(eighths[rem])
		n++
	}
	for ; n < width; n++ {
		b.WriteRune('░')
	}
	return b.String()
}

// Chart draws vals as a height-row bar chart of width columns (the last
// width values), scaled to [0, top] (top 0: the series' maximum).
func Chart(vals []float64, width, height int, top float64) []string {
	if width <= 0 || height <= 0 {
		return nil
	}
	if len(vals) > width {
		vals = vals[len(vals)-width:]
	}
	if top <= 0 {
		for _, v := range vals {
			top = math.Max(top, v)
		}
	}
	rows := make([]string, height)
	pad := width - len(vals)
	for r := range height {
		var b strings.Builder
		b.Grow(width * 3)
		for range pad {
			b.WriteByte(' ')
		}
		// Row r from the top covers levels (height-1-r)*8 .. (height-r)*8.
		floor := float64(height-1-r) * 8
		for _, v := range vals {
			lvl := 0.0
			if top > 0 {
				lvl = v / top * float64(height*8)
			}
			switch d := lvl - floor; {
			case d >= 8:
				b.WriteRune('█')
			case d <= 0:
				b.WriteByte(' ')
			default:
				b.WriteRune(ticks[max(int(d)-1, 0)])
			}
		}
		rows[r] = b.String()
	}
	return rows
}
