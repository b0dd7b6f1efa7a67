package printable_test

import (
	"strings"
	"testing"
	"unicode"

	"github.com/stretchr/testify/require"

	"github.com/outpost-metal/outpost/shared/printable"
)

func TestString(t *testing.T) {
	t.Parallel()

	for _, tc := range []struct {
		name, in, want string
		max            int
	}{
		{name: "plain", in: "v1.2.3", want: "v1.2.3"},
		{name: "terminal escape", in: "v1\x1b[2J\x1b]0;pwned\x07", want: `v1\x1b[2J\x1b]0;pwned\x07`},
		{name: "newline and tab", in: "a\nb\tc", want: `a\x0ab\x09c`},
		{name: "c1 control", in: "a\u009bb", want: `a\u{009b}b`},
		{name: "bidi override", in: "abc\u202edef", want: `abc\u{202e}def`},
		{name: "invalid utf-8", in: "a\xffb", want: `a\xffb`},
		{name: "backslash kept unambiguous", in: `a\x1b`, want: `a\\x1b`},
		{name: "unicode kept", in: "Zürich", want: "Zürich"},
		{name: "cut", in: strings.Repeat("x", 100), max: 10, want: strings.Repeat("x", 10) + "…"},
		{name: "cut never splits an escape", in: "abcdefgh\x1b", max: 10, want: "abcdefgh…"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			require.Equal(t, tc.want, printable.String(tc.in, tc.max))
		})
	}
}

func FuzzString(f *testing.F) {
	f.Add("v1\x1b[2J", 64)
	f.Add("\xff\xfe", 0)

	f.Fuzz(func(t *testing.T, s string, max int) {
		out := printable.String(s, max%1000)
		for _, r := range out {
			require.True(t, unicode.IsPrint(r) || r == ' ', "%q has %q", out, r)
		}
	})
}
