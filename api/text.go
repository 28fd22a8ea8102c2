package api

import (
	"fmt"
	"strconv"
	"strings"
	"unicode"
	"unicode/utf8"
)

// MaxText is the bound on free text a client sends (reasons, descriptions,
// messages): enough for a sentence or two, too little to flood a table or
// the event log.
const MaxText = 1024

// CleanText makes free text from a client safe to store and show: invalid
// UTF-8 becomes U+FFFD, tabs and line breaks become spaces, other control
// characters (C0, DEL, C1) and the invisible format characters (the
// bidirectional overrides and isolates that can make a terminal show text
// other than what is stored, zero-width ones) are dropped, runs of spaces
// are squeezed, the ends trimmed, and the result cut at a rune boundary to
// at most max bytes (max <= 0 means MaxText), ending in "…" when cut.
func CleanText(s string, max int) string {
	if max <= 0 {
		max = MaxText
	}
	var b strings.Builder
	b.Grow(min(len(s), max))
	space := false
	for i := 0; i < len(s); {
		r, size := utf8.DecodeRuneInString(s[i:])
		i += size
		switch {
		case unicode.IsSpace(r):
			space = b.Len() > 0
			continue
		case hidden(r):
			continue
		}
		if space {
			b.WriteByte(' ')
			space = false
		}
		b.WriteRune(r) // an invalid byte decodes as RuneError, written as U+FFFD
	}
	out := b.String()
	if len(out) <= max {
		return out
	}
	const ellipsis = "…"
	cut := max - len(ellipsis)
	if cut < 0 {
		return strings.TrimRight(truncateRunes(out, max), " ")
	}
	return strings.TrimRight(truncateRunes(out, cut), " ") + ellipsis
}

// MaxQuote is how many bytes of a refused value an error quotes.
const MaxQuote = 64

// Quote quotes a value an error refuses, as %q does, cut to its first
// MaxQuote bytes and saying how long it was when longer: a 10 KB name
// must not fill the terminal or the log it is refused in.
func Quote(s string) string {
	if len(s) <= MaxQuote {
		return strconv.Quote(s)
	}
	return fmt.Sprintf("%s… (%d bytes)", strconv.Quote(truncateRunes(s, MaxQuote)), len(s))
}

// truncateRunes cuts s to at most n bytes without splitting a rune.
func truncateRunes(s string, n int) string {
	if len(s) <= n {
		return s
	}
	for n > 0 && !utf8.RuneStart(s[n]) {
		n--
	}
	return s[:n]
}

// hidden reports the runes a terminal does not show as themselves: the
// control characters (C0, DEL, C1), the line and paragraph separators, and
// the format characters (Unicode's Cf: bidirectional embeddings, overrides,
// isolates and marks, zero-width spaces and joiners, the byte-order mark,
// tags), any of which can make a terminal show text other than what is
// there.
func hidden(r rune) bool {
	return unicode.IsControl(r) || r == '\u2028' || r == '\u2029' || unicode.Is(unicode.Cf, r)
}

// EscapeText makes text from a job, a node or a client safe to print on a
// terminal: what hidden reports and invalid UTF-8 become visible escapes
// (\x1b, \n, \u202e), so the text cannot move the cursor, clear the
// screen, set the window title or show itself reordered. Text with none
// of them is returned as it is.
func EscapeText(s string) string {
	if !needsEscape(s, false) {
		return s
	}
	return string(appendEscaped(make([]byte, 0, len(s)+16), s, false))
}

// EscapeLines is EscapeText for output read line by line (a rank's log):
// line breaks and tabs are kept, everything else EscapeText escapes is
// escaped, carriage returns included (one could hide a line behind
// another).
func EscapeLines(s string) string {
	if !needsEscape(s, true) {
		return s
	}
	return string(appendEscaped(make([]byte, 0, len(s)+16), s, true))
}

func needsEscape(s string, lines bool) bool {
	for _, r := range s {
		if r == utf8.RuneError || (hidden(r) && !(lines && (r == '\n' || r == '\t'))) {
			return true
		}
	}
	return false
}

func appendEscaped(b []byte, s string, lines bool) []byte {
	for i := 0; i < len(s); {
		r, n := utf8.DecodeRuneInString(s[i:])
		switch {
		case r == utf8.RuneError && n == 1:
			b = fmt.Appendf(b, `\x%02x`, s[i])
		case lines && (r == '\n' || r == '\t'):
			b = append(b, byte(r))
		case r == '\n':
			b = append(b, `\n`...)
		case r == '\t':
			b = append(b, `\t`...)
		case r == '\r':
			b = append(b, `\r`...)
		case r < 0x80 && hidden(r):
			b = fmt.Appendf(b, `\x%02x`, r)
		case r <= 0xffff && hidden(r):
			b = fmt.Appendf(b, `\u%04x`, r)
		case hidden(r):
			b = fmt.Appendf(b, `\U%08x`, r)
		default:
			b = append(b, s[i:i+n]...)
		}
		i += n
	}
	return b
}
