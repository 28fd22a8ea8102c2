package views

import (
	"strings"
	"testing"
)

// TestEscaper writes a log in every split of two chunks: the output is
// the same as escaping it whole, so a rune or an escape sequence cut
// between chunks is neither mangled nor let through.
func TestEscaper(t *testing.T) {
	const log = "step 1 é\x1b]0;pwned\x07\n\tloss 2.3 → \u202eok\r\nbad \xff end ✓"
	const want = "step 1 é\\x1b]0;pwned\\x07\n\tloss 2.3 → \\u202eok\\r\nbad \\xff end ✓"
	for i := 0; i <= len(log); i++ {
		var b strings.Builder
		e := NewEscaper(&b)
		for _, chunk := range []string{log[:i], log[i:]} {
			if _, err := e.Write([]byte(chunk)); err != nil {
				t.Fatal(err)
			}
		}
		if err := e.Flush(); err != nil {
			t.Fatal(err)
		}
		if b.String() != want {
			t.Fatalf("split at %d: got %q, want %q", i, b.String(), want)
		}
	}
	var b strings.Builder
	e := NewEscaper(&b)
	e.Write([]byte("cut \xe2\x86"))
	e.Flush()
	if got := b.String(); got != `cut \xe2\x86` {
		t.Fatalf("a rune cut at the end: got %q", got)
	}
}
