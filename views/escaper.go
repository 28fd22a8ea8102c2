package views

import (
	"io"
	"unicode/utf8"

	"github.com/gpuctl/gpuctl/api"
)

// Escaper writes a byte stream (a rank's log) to a terminal escaped as
// api.EscapeLines does. A rune split between two writes is held until the
// rest arrives, so chunk boundaries change nothing.
type Escaper struct {
	w    io.Writer
	held []byte
}

// NewEscaper returns an Escaper writing to w.
func NewEscaper(w io.Writer) *Escaper { return &Escaper{w: w} }

// Write escapes p and writes it, holding back a rune p ends inside of.
func (e *Escaper) Write(p []byte) (int, error) {
	buf := append(e.held, p...)
	keep := partialRune(buf)
	out := api.EscapeLines(string(buf[:len(buf)-keep]))
	e.held = append(e.held[:0:0], buf[len(buf)-keep:]...)
	if _, err := io.WriteString(e.w, out); err != nil {
		return 0, err
	}
	return len(p), nil
}

// Flush writes what is held (the start of a rune that never finished) as
// escaped bytes.
func (e *Escaper) Flush() error {
	if len(e.held) == 0 {
		return nil
	}
	out := api.EscapeLines(string(e.held))
	e.held = nil
	_, err := io.WriteString(e.w, out)
	return err
}

// partialRune returns how many bytes at the end of b start a rune that b
// does not hold whole.
func partialRune(b []byte) int {
	for n := 1; n < utf8.UTFMax && n <= len(b); n++ {
		i := len(b) - n
		if !utf8.RuneStart(b[i]) {
			continue
		}
		if utf8.FullRune(b[i:]) {
			return 0
		}
		return n
	}
	return 0
}
