package bmc_test

import (
	"strings"
	"testing"
	"unicode"
	"unicode/utf8"

	"github.com/stretchr/testify/require"

	"github.com/outpost-metal/outpost/edge/bmc"
)

func TestClean(t *testing.T) {
	t.Parallel()

	for _, tc := range []struct{ name, in, want string }{
		{name: "plain", in: "Dell Inc.", want: "Dell Inc."},
		{name: "padding and control characters", in: "  Super\x00Micro\r\n\t ", want: "Super Micro"},
		{name: "terminal escapes", in: "\x1b[31mred\x1b[0m", want: "[31mred [0m"},
		{name: "invalid utf-8", in: "ab\xff\xfecd", want: "abcd"},
		{name: "long", in: strings.Repeat("é", 1000), want: strings.Repeat("é", bmc.MaxInventoryString)},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			require.Equal(t, tc.want, bmc.Clean(tc.in))
		})
	}
}

// FuzzClean: whatever a BMC sends, an inventory string is valid, printable, trimmed and bounded.
func FuzzClean(f *testing.F) {
	f.Add("Dell Inc.")
	f.Add("\x1b[2J\x00\xff")
	f.Add(strings.Repeat("x ", 500))

	f.Fuzz(func(t *testing.T, s string) {
		out := bmc.Clean(s)
		require.True(t, utf8.ValidString(out))
		require.LessOrEqual(t, utf8.RuneCountInString(out), bmc.MaxInventoryString)
		require.Equal(t, strings.TrimSpace(out), out)

		for _, r := range out {
			require.True(t, unicode.IsPrint(r), "%q", r)
		}
	})
}
