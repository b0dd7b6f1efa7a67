package guestinit_test

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/outpost-metal/outpost/qemu/guestinit"
)

// qemuOEM is a type-11 structure as QEMU writes it for -smbios type=11,value=outpost.agent=real,value=x=1.
var qemuOEM = append([]byte{11, 5, 0x00, 0x0b, 2}, []byte("outpost.agent=real\x00x=1\x00\x00")...)

func TestParseOEMStrings(t *testing.T) {
	t.Parallel()

	for _, tc := range []struct {
		name    string
		raw     []byte
		want    []string
		wantErr bool
	}{
		{name: "qemu", raw: qemuOEM, want: []string{"outpost.agent=real", "x=1"}},
		{name: "none", raw: []byte{11, 5, 0, 0, 0, 0, 0}, want: []string{}},
		{name: "other type", raw: []byte{1, 5, 0, 0, 0, 0, 0}, wantErr: true},
		{name: "short", raw: []byte{11, 5, 0}, wantErr: true},
		{name: "length past the end", raw: []byte{11, 40, 0, 0, 1}, wantErr: true},
		{name: "fewer strings than counted", raw: append([]byte{11, 5, 0, 0, 3}, "a\x00\x00"...), wantErr: true},
		{name: "unterminated", raw: append([]byte{11, 5, 0, 0, 1}, "abc"...), wantErr: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()

			got, err := guestinit.ParseOEMStrings(tc.raw)
			if tc.wantErr {
				require.Error(t, err)

				return
			}

			require.NoError(t, err)
			require.Equal(t, tc.want, got)
		})
	}
}

func TestOEMStrings(t *testing.T) {
	t.Parallel()

	root := t.TempDir()
	dir := filepath.Join(root, "firmware", "dmi", "entries", "11-0")
	require.NoError(t, os.MkdirAll(dir, 0o755))
	require.NoError(t, os.WriteFile(filepath.Join(dir, "raw"), qemuOEM, 0o644))

	oem, err := guestinit.OEMStrings(root)
	require.NoError(t, err)

	v, ok := guestinit.OEMValue(oem, "outpost.agent")
	require.True(t, ok)
	require.Equal(t, "real", v)

	_, ok = guestinit.OEMValue(oem, "outpost.other")
	require.False(t, ok)

	none, err := guestinit.OEMStrings(t.TempDir())
	require.NoError(t, err)
	require.Empty(t, none)
}

func FuzzParseOEMStrings(f *testing.F) {
	f.Add(qemuOEM)
	f.Add([]byte{11, 5, 0, 0, 255})

	f.Fuzz(func(t *testing.T, raw []byte) {
		got, err := guestinit.ParseOEMStrings(raw)
		if err != nil {
			return
		}

		if len(got) > len(raw) {
			t.Fatalf("%d strings from %d bytes", len(got), len(raw))
		}
	})
}
