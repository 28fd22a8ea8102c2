// Package views renders the control plane's answers for scripts and
// people: JSON documents under one contract, and tables that fit the
// terminal. The JSON field names are a public contract documented in the
// README ("JSON output"); a test checks that every field emitted is
// documented there.
//
// The contract: every document is an object holding a named list
// ({"nodes": [...]}); names are snake_case and carry their unit
// (_seconds, _bytes, _joules, _percent, _celsius, _watts, _mhz); times are
// RFC 3339 in UTC and named _time; enums are lower-case strings. Every
// field is always present: a value that is unknown or does not apply is
// null, a list with nothing in it is [], a map {}.
package views

import (
	"encoding/json"
	"fmt"
	"io"
	"time"
)

// Format is an output format of the scripted subcommands.
type Format string

// The formats of list views.
const (
	Table Format = "table"
	Wide  Format = "wide"
	JSON  Format = "json"
)

// ParseFormat validates a -o value.
func ParseFormat(s string) (Format, error) {
	switch f := Format(s); f {
	case Table, Wide, JSON:
		return f, nil
	}
	return "", fmt.Errorf("unknown output format %q: use table, wide or json", s)
}

// Options say how a view is written.
type Options struct {
	Format Format
	// Width is the terminal's width in columns: a table wider than it has
	// its free-text column (reason, message) cut with an ellipsis. 0 means
	// 80. Wide tables are never cut.
	Width int
	// NoHeaders leaves out the header line of tables.
	NoHeaders bool
	// SortBy names the column rows are sorted by (as in the header, case
	// and spaces aside); empty keeps the server's order.
	SortBy string
	// Now is the time ages are computed from.
	Now time.Time
	// Stderr gets the sentence that says a listing is empty ("no jobs"),
	// so that in table mode stdout holds only rows. Nil drops it.
	Stderr io.Writer
}

// DefaultWidth is the terminal width assumed when it is unknown.
const DefaultWidth = 80

func (o Options) width() int {
	switch {
	case o.Format == Wide:
		return 0
	case o.Width > 0:
		return o.Width
	}
	return DefaultWidth
}

func (o Options) now() time.Time {
	if o.Now.IsZero() {
		return time.Now()
	}
	return o.Now
}

func writeJSON(w io.Writer, v any) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(v)
}

func timeOf(unixNano int64) time.Time {
	if unixNano == 0 {
		return time.Time{}
	}
	return time.Unix(0, unixNano).UTC()
}

// The opt helpers turn a zero value ("unknown" in the wire schema) into
// JSON null.

func optTime(unixNano int64) *time.Time {
	if unixNano == 0 {
		return nil
	}
	t := timeOf(unixNano)
	return &t
}

func optString(s string) *string {
	if s == "" {
		return nil
	}
	return &s
}

func optFloat(f float64) *float64 {
	if f == 0 {
		return nil
	}
	return &f
}

func optInt64(i int64) *int64 {
	if i == 0 {
		return nil
	}
	return &i
}

func ptr[T any](v T) *T { return &v }

func orEmpty[T any](s []T) []T {
	if s == nil {
		return []T{}
	}
	return s
}

func mapOrEmpty(m map[string]string) map[string]string {
	if m == nil {
		return map[string]string{}
	}
	return m
}

// age renders how long ago t was, as a person reads it in a table.
func age(now, t time.Time) string {
	if t.IsZero() {
		return "never"
	}
	return Duration(now.Sub(t))
}

// Duration renders a span as a person reads it in a table: 4.2s, 3m12s,
// 5h3m, 2d. The CLI's tables and the console both use it.
func Duration(d time.Duration) string {
	switch {
	case d < 0:
		return "0s"
	case d < 10*time.Second:
		return fmt.Sprintf("%.1fs", d.Seconds())
	case d < time.Hour:
		return d.Round(time.Second).String()
	case d < 48*time.Hour:
		return fmt.Sprintf("%dh%dm", int(d.Hours()), int(d.Minutes())%60)
	}
	return fmt.Sprintf("%dd", int(d.Hours()/24))
}

// Bytes renders a byte count with a binary unit.
func Bytes(b uint64) string {
	const unit = 1024
	if b < unit {
		return fmt.Sprintf("%dB", b)
	}
	div, exp := uint64(unit), 0
	for n := b / unit; n >= unit; n /= unit {
		div *= unit
		exp++
	}
	return fmt.Sprintf("%.1f%ciB", float64(b)/float64(div), "KMGTPE"[exp])
}
