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
		{"bidi embeddings and isolates dropped", "a\u202ab\u202bc\u202cd\u202de\u2066f\u2067g\u2068h\u2069i", 0, "abcdefghi"},
		{"bidi marks dropped", "a\u200eb\u200fc\u061cd", 0, "abcd"},
		{"zero-width and byte-order mark dropped", "ad\u200bm\u200ci\u200dn\u2060\ufeff", 0, "admin"},
		{"soft hyphen and tags dropped", "no\u00addeU+E0041:\U000e0041", 0, "nodeU+E0041:"},
		{"line separators become spaces", "a\u2028b\u2029c", 0, "a b c"},
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
// UTF-8 within the bound, holds no control, bidi or other invisible format
// character (nothing EscapeText would escape), and cleaning it again
// changes nothing.
func FuzzCleanText(f *testing.F) {
	f.Add("drain for \x1b[31mmaintenance\x1b[0m", 64)
	f.Add("a\u202eb\r\nc\xff", 8)
	f.Add("x\u2066y\u2069\u200b\ufeff\U000e0041z", 0)
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
			if unicode.IsControl(r) || unicode.Is(unicode.Cf, r) || (r >= 0x202a && r <= 0x202e) || (r >= 0x2066 && r <= 0x2069) ||
				(unicode.IsSpace(r) && r != ' ') {
				t.Fatalf("kept %U in %q", r, out)
			}
		}
		if EscapeText(out) != out {
			t.Fatalf("EscapeText would still escape %q", out)
		}
		if strings.HasPrefix(out, " ") || strings.HasSuffix(out, " ") || strings.Contains(out, "  ") {
			t.Fatalf("spaces not squeezed: %q", out)
		}
		if again := CleanText(out, max); again != out {
			t.Fatalf("not idempotent: %q then %q", out, again)
		}
	})
}

func TestEscapeText(t *testing.T) {
	tests := []struct{ name, in, want, lines string }{
		{"plain", "plain", "plain", "plain"},
		{"unicode kept", "µs · → …", "µs · → …", "µs · → …"},
		{"clear screen", "clear \x1b[2J screen", `clear \x1b[2J screen`, `clear \x1b[2J screen`},
		{"window title", "\x1b]0;pwned\x07", `\x1b]0;pwned\x07`, `\x1b]0;pwned\x07`},
		{"line breaks", "a\nb\tc\rd", `a\nb\tc\rd`, "a\nb\tc" + `\r` + "d"},
		{"bell and delete", "bell\a del\x7f", `bell\x07 del\x7f`, `bell\x07 del\x7f`},
		{"C1", "c1 \u009b31m", `c1 \u009b31m`, `c1 \u009b31m`},
		{"invalid UTF-8", "bad \xff utf8", `bad \xff utf8`, `bad \xff utf8`},
		{"bidi override", "invoice\u202egpj.exe", `invoice\u202egpj.exe`, `invoice\u202egpj.exe`},
		{"bidi isolate", "\u2066x\u2069", `\u2066x\u2069`, `\u2066x\u2069`},
		{"zero width", "ad\u200bmin", `ad\u200bmin`, `ad\u200bmin`},
		{"tag", "a\U000e0041", `a\U000e0041`, `a\U000e0041`},
		{"line separator", "a\u2028b", `a\u2028b`, `a\u2028b`},
		{"replacement character kept", "a\ufffdb", "a\ufffdb", "a\ufffdb"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			if got := EscapeText(tc.in); got != tc.want {
				t.Errorf("EscapeText(%q) = %q, want %q", tc.in, got, tc.want)
			}
			if got := EscapeLines(tc.in); got != tc.lines {
				t.Errorf("EscapeLines(%q) = %q, want %q", tc.in, got, tc.lines)
			}
		})
	}
}

// FuzzEscapeText checks that nothing a terminal acts on survives: the
// result is valid UTF-8 holding no hidden rune (EscapeLines: but line
// breaks and tabs), and it holds every printable rune of the input.
func FuzzEscapeText(f *testing.F) {
	f.Add("\x1b]0;title\x07\x1b[2J")
	f.Add("a\u202eb\r\nc\xff\u2066")
	f.Add("plain text")
	f.Fuzz(func(t *testing.T, s string) {
		for _, lines := range []bool{false, true} {
			out := EscapeText(s)
			if lines {
				out = EscapeLines(s)
			}
			if !utf8.ValidString(out) {
				t.Fatalf("invalid UTF-8: %q", out)
			}
			for _, r := range out {
				if hidden(r) && !(lines && (r == '\n' || r == '\t')) {
					t.Fatalf("kept %U in %q", r, out)
				}
			}
			if !needsEscape(s, lines) && out != s {
				t.Fatalf("changed clean text %q to %q", s, out)
			}
		}
	})
}

func TestQuote(t *testing.T) {
	tests := []struct{ name, in, want string }{
		{"short", "node-01", `"node-01"`},
		{"escapes", "a\x1b[2J", `"a\x1b[2J"`},
		{"at the bound", strings.Repeat("n", MaxQuote), `"` + strings.Repeat("n", MaxQuote) + `"`},
		{"long", strings.Repeat("n", 10<<10), `"` + strings.Repeat("n", MaxQuote) + `"… (10240 bytes)`},
		{"cut at a rune boundary", strings.Repeat("é", 40), `"` + strings.Repeat("é", 32) + `"… (80 bytes)`},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			if got := Quote(tc.in); got != tc.want {
				t.Errorf("Quote(%.80q) = %q, want %q", tc.in, got, tc.want)
			}
		})
	}
}
