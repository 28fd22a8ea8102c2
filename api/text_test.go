package api

import (
	"strings"
	"testing"
	"unicode"
	"unicode/utf8"
)

func TestCleanText(t *testing.T) {
	tests := []struct {
		name, in string
		max      int
		want     string
	}{
		{"plain", "bad DIMM in slot 3", 0, "bad DIMM in slot 3"},
		{"terminal escapes", "ok\x1b[2J\x1b]0;pwned\x07 done", 0, "ok[2J]0;pwned done"},
		{"line breaks become spaces", "line one\r\nline two\tend", 0, "line one line two end"},
		{"runs squeezed and ends trimmed", "  a   b  ", 0, "a b"},
		{"NUL and DEL dropped", "a\x00b\x7fc", 0, "abc"},
		{"C1 controls dropped", "a\u0085b\u009bc", 0, "a bc"},
		{"bidi override dropped", "invoice\u202egpj.exe", 0, "invoicegpj.exe"},
		{"invalid UTF-8 replaced", "a\xffb", 0, "a\uFFFDb"},
		{"unicode kept", "échec sur nœud 3 — GPU 7", 0, "échec sur nœud 3 — GPU 7"},
		{"cut with ellipsis", "abcdefghij", 8, "abcde…"},
		{"cut at a rune boundary", "ééééé", 8, "éé…"},
		{"cut drops the space before the ellipsis", "abcd efgh", 8, "abcd…"},
		{"tiny bound", "abc", 2, "ab"},
		{"only controls", "\x1b\x00\x07", 0, ""},
		{"default bound", strings.Repeat("x", 5000), 0, strings.Repeat("x", MaxText-3) + "…"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			if got := CleanText(tc.in, tc.max); got != tc.want {
				t.Fatalf("CleanText(%q, %d) = %q, want %q", tc.in, tc.max, got, tc.want)
			}
		})
	}
}

// FuzzCleanText checks what every caller relies on: the result is valid
// UTF-8 within the bound, holds no control or bidi character, and cleaning
// it again changes nothing.
func FuzzCleanText(f *testing.F) {
	f.Add("drain for \x1b[31mmaintenance\x1b[0m", 64)
	f.Add("a\u202eb\r\nc\xff", 8)
	f.Add(strings.Repeat("é", 600), 0)
	f.Add("", 1)
	f.Fuzz(func(t *testing.T, s string, max int) {
		max %= 4 * MaxText
		out := CleanText(s, max)
		bound := max
		if bound <= 0 {
			bound = MaxText
		}
		if len(out) > bound {
			t.Fatalf("len %d over the bound %d: %q", len(out), bound, out)
		}
		if !utf8.ValidString(out) {
			t.Fatalf("invalid UTF-8: %q", out)
		}
		for _, r := range out {
			if unicode.IsControl(r) || isBidiControl(r) || (unicode.IsSpace(r) && r != ' ') {
				t.Fatalf("kept %U in %q", r, out)
			}
		}
		if strings.HasPrefix(out, " ") || strings.HasSuffix(out, " ") || strings.Contains(out, "  ") {
			t.Fatalf("spaces not squeezed: %q", out)
		}
		if again := CleanText(out, max); again != out {
			t.Fatalf("not idempotent: %q then %q", out, again)
		}
	})
}
