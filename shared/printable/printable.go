// Package printable makes strings a peer supplied safe to show on a terminal: control characters (terminal
// escape sequences among them) and invalid UTF-8 are shown escaped, never interpreted, and the length is
// bounded.
package printable

import (
	"fmt"
	"strings"
	"unicode"
	"unicode/utf8"
)

// String returns s with every control or non-printing character written as \xNN or \u{NNNN}, invalid UTF-8
// bytes as \xNN, and at most max runes of the result kept (an ellipsis marks the cut; max <= 0 keeps all).
func String(s string, max int) string {
	var b strings.Builder

	runes := 0

	for i := 0; i < len(s); {
		r, size := utf8.DecodeRuneInString(s[i:])

		var piece string

		switch {
		case r == utf8.RuneError && size <= 1:
			piece = fmt.Sprintf(`\x%02x`, s[i])
		case r < 0x80 && (r < 0x20 || r == 0x7f):
			piece = fmt.Sprintf(`\x%02x`, r)
		case r == '\\':
			piece = `\\`
		case !unicode.IsPrint(r) && r != ' ':
			piece = fmt.Sprintf(`\u{%04x}`, r)
		default:
			piece = string(r)
		}

		if max > 0 && runes+utf8.RuneCountInString(piece) > max {
			b.WriteString("…")

			break
		}

		b.WriteString(piece)
		runes += utf8.RuneCountInString(piece)
		i += size
	}

	return b.String()
}
