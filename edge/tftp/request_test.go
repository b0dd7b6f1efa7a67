package tftp_test

import (
	"bytes"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/outpost-metal/outpost/edge/tftp"
)

func TestNormalizeRequest(t *testing.T) {
	t.Parallel()

	for _, tc := range []struct {
		name string
		in   []byte
		want []byte
		err  bool
	}{
		{name: "plain", in: rrq("ipxe.efi", "octet"), want: rrq("ipxe.efi", "octet")},
		{
			name: "names and mode lower case", in: rrq("ipxe.efi", "OCTET", "BLKSIZE", "1024", "TSize", "0"),
			want: rrq("ipxe.efi", "octet", "blksize", "1024", "tsize", "0"),
		},
		{name: "blksize clamped", in: rrq("a", "octet", "blksize", "65464"), want: rrq("a", "octet", "blksize", "1468")},
		{name: "blksize below 512 left out", in: rrq("a", "octet", "blksize", "8"), want: rrq("a", "octet")},
		{name: "blksize not a number left out", in: rrq("a", "octet", "blksize", "x", "tsize", "0"), want: rrq("a", "octet", "tsize", "0")},
		{name: "first of a repeated option", in: rrq("a", "netascii", "blksize", "1024", "blksize", "4096"), want: rrq("a", "netascii", "blksize", "1024")},
		{name: "NUL padding after the options", in: append(rrq("a", "octet", "tsize", "0"), 0, 0, 0), want: rrq("a", "octet", "tsize", "0")},
		{name: "options not acknowledged left out", in: rrq("a", "octet", "windowsize", "8", "timeout", "1"), want: rrq("a", "octet")},
		{name: "option without a value", in: rrq("a", "octet", "tsize"), want: rrq("a", "octet")},
		{name: "write request", in: append([]byte{0, 2}, "x\x00octet\x00"...), want: append([]byte{0, 2}, "x\x00octet\x00"...)},
		{name: "empty", in: nil, err: true},
		{name: "ack", in: []byte{0, 4, 0, 1}, err: true},
		{name: "unknown opcode", in: []byte{0, 9, 'a', 0}, err: true},
		{name: "mode not terminated", in: append([]byte{0, 1}, "a\x00octet"...), err: true},
		{name: "mail mode", in: rrq("a", "mail"), err: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()

			got, err := tftp.NormalizeRequest(tc.in, 1468)
			if tc.err {
				require.ErrorIs(t, err, tftp.ErrMalformed)

				return
			}

			require.NoError(t, err)
			require.Equal(t, tc.want, got)
		})
	}
}

func FuzzNormalizeRequest(f *testing.F) {
	for _, seed := range [][]byte{
		rrq("ipxe.efi", "octet", "blksize", "1468", "tsize", "0"),
		rrq("../etc/passwd", "NetASCII", "BLKSIZE", "99999"),
		append(rrq("a", "octet"), 0, 0),
		{0, 2, 0, 0},
		{0, 4, 0, 1},
		{0, 1},
	} {
		f.Add(seed)
	}

	f.Fuzz(func(t *testing.T, b []byte) {
		got, err := tftp.NormalizeRequest(b, 1468)
		if err != nil {
			return
		}

		// What the library is given parses the same, and is given again unchanged.
		again, err := tftp.NormalizeRequest(got, 1468)
		require.NoError(t, err)
		require.Equal(t, got, again)

		fields := bytes.Split(got[2:], []byte{0})
		require.Contains(t, []string{"octet", "netascii"}, string(fields[1]))
		require.LessOrEqual(t, len(got), len(b)+len("blksize\x001468\x00tsize\x000\x00"), "grew beyond its options")
	})
}
