package tftp_test

import (
	"bytes"
	"encoding/binary"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/outpost-metal/outpost/edge/tftp"
)

// rrq builds a read request: the name, the mode, then option name/value pairs.
func rrq(name, mode string, opts ...string) []byte {
	b := binary.BigEndian.AppendUint16(nil, 1)
	for _, f := range append([]string{name, mode}, opts...) {
		b = append(append(b, f...), 0)
	}

	return b
}

func TestParseRequest(t *testing.T) {
	t.Parallel()

	for _, tc := range []struct {
		name    string
		in      []byte
		want    tftp.Request
		err     error
		blksize int // BlockSize(1468)
	}{
		{name: "plain", in: rrq("ipxe.efi", "octet"), want: tftp.Request{Filename: "ipxe.efi", Mode: "octet"}},
		{
			name: "options, mode and names case-insensitive", in: rrq("ipxe.efi", "OCTET", "BLKSIZE", "1468", "tsize", "0"),
			want:    tftp.Request{Filename: "ipxe.efi", Mode: "octet", Options: map[string]string{"blksize": "1468", "tsize": "0"}},
			blksize: 1468,
		},
		{
			name: "blksize clamped", in: rrq("a", "octet", "blksize", "65464"),
			want: tftp.Request{Filename: "a", Mode: "octet", Options: map[string]string{"blksize": "65464"}}, blksize: 1468,
		},
		{
			name: "blksize below 512 not granted", in: rrq("a", "octet", "blksize", "8"),
			want: tftp.Request{Filename: "a", Mode: "octet", Options: map[string]string{"blksize": "8"}},
		},
		{
			name: "first of a repeated option", in: rrq("a", "netascii", "blksize", "1024", "blksize", "4096"),
			want: tftp.Request{Filename: "a", Mode: "netascii", Options: map[string]string{"blksize": "1024"}}, blksize: 1024,
		},
		{
			name: "NUL padding after the options", in: append(rrq("a", "octet", "tsize", "0"), 0, 0, 0),
			want: tftp.Request{Filename: "a", Mode: "octet", Options: map[string]string{"tsize": "0"}},
		},
		{name: "option without a value is ignored", in: rrq("a", "octet", "tsize"), want: tftp.Request{Filename: "a", Mode: "octet"}},
		{name: "write request", in: append([]byte{0, 2}, "x\x00octet\x00"...), want: tftp.Request{Write: true, Filename: "x", Mode: "octet"}},
		{name: "empty", in: nil, err: tftp.ErrMalformed},
		{name: "unknown opcode", in: []byte{0, 9, 'a', 0}, err: tftp.ErrMalformed},
		{name: "ack to the server port", in: []byte{0, 4, 0, 1}, err: tftp.ErrNotRequest},
		{name: "error to the server port", in: []byte{0, 5, 0, 0, 0}, err: tftp.ErrNotRequest},
		{name: "mode not terminated", in: append([]byte{0, 1}, "a\x00octet"...), err: tftp.ErrMalformed},
		{name: "mail mode", in: rrq("a", "mail"), err: tftp.ErrMalformed},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()

			got, err := tftp.ParseRequest(tc.in)
			if tc.err != nil {
				require.ErrorIs(t, err, tc.err)

				return
			}

			require.NoError(t, err)
			require.Equal(t, tc.want, got)
			require.Equal(t, tc.blksize, got.BlockSize(1468))
		})
	}
}

func FuzzParseRequest(f *testing.F) {
	for _, seed := range [][]byte{
		rrq("ipxe.efi", "octet", "blksize", "1468", "tsize", "0"),
		rrq("../etc/passwd", "netascii"),
		append(rrq("a", "octet"), 0, 0),
		{0, 2, 0, 0},
		{0, 4, 0, 1},
		{0, 1},
	} {
		f.Add(seed)
	}

	f.Fuzz(func(t *testing.T, b []byte) {
		req, err := tftp.ParseRequest(b)
		if err != nil {
			return
		}

		require.NotContains(t, req.Filename, "\x00")
		require.Contains(t, []string{"octet", "netascii"}, req.Mode)
		require.LessOrEqual(t, len(req.Options), 16)

		if n := req.BlockSize(1468); n != 0 {
			require.True(t, n >= 512 && n <= 1468, "blksize %d", n)
		}

		// What was parsed parses the same when sent again.
		var opts []string
		for k, v := range req.Options {
			require.Equal(t, bytes.ToLower([]byte(k)), []byte(k))
			require.NotContains(t, k+v, "\x00")
			opts = append(opts, k, v)
		}

		sent := rrq(req.Filename, req.Mode, opts...)
		if req.Write {
			sent[1] = 2
		}

		again, err := tftp.ParseRequest(sent)
		require.NoError(t, err)
		require.Equal(t, req, again)
	})
}
