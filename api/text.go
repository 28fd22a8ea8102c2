package api

import (
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
// characters (C0, DEL, C1) and the bidirectional overrides that can make a
// terminal show text other than what is stored are dropped, runs of spaces
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
		case unicode.IsControl(r) || isBidiControl(r):
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

// isBidiControl reports the Unicode bidirectional embedding, override and
// isolate controls and the marks that steer them.
func isBidiControl(r rune) bool {
	switch {
	case r >= 0x202A && r <= 0x202E, r >= 0x2066 && r <= 0x2069:
		return true
	case r == 0x200E || r == 0x200F || r == 0x061C:
		return true
	}
	return false
}
