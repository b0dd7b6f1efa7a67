package bootfiles_test

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/outpost-metal/outpost/edge/bootfiles"
)

func TestLoadCatalog(t *testing.T) {
	t.Parallel()

	dir := t.TempDir()
	require.NoError(t, os.WriteFile(filepath.Join(dir, "ipxe.efi"), []byte("efi"), 0o644))

	c, err := bootfiles.LoadCatalog(dir, []string{"ipxe.efi", "undionly.kpxe"})
	require.NoError(t, err)
	require.Equal(t, []string{"ipxe.efi"}, c.Names())
	require.True(t, c.Has("/ipxe.efi"))
	require.False(t, c.Has("undionly.kpxe"))

	_, err = bootfiles.LoadCatalog(dir, []string{"undionly.kpxe"})
	require.ErrorIs(t, err, bootfiles.ErrNotFound)

	_, err = bootfiles.LoadCatalog(dir, []string{"../x"})
	require.ErrorIs(t, err, bootfiles.ErrBadName)
}

func TestCleanName(t *testing.T) {
	t.Parallel()

	for _, tc := range []struct {
		in, want string
		bad      bool
	}{
		{in: "ipxe.efi", want: "ipxe.efi"},
		{in: "/ipxe.efi", want: "ipxe.efi"},
		{in: "arm64/snp.efi", want: "arm64/snp.efi"},
		{in: "", bad: true},
		{in: "/", bad: true},
		{in: "//etc/passwd", bad: true},
		{in: "../x", bad: true},
		{in: "a/../../x", bad: true},
		{in: "a//b", bad: true},
		{in: "a\\b", bad: true},
		{in: "a\x00b", bad: true},
		{in: string(make([]byte, 300)), bad: true},
	} {
		got, err := bootfiles.CleanName(tc.in)
		if tc.bad {
			require.ErrorIs(t, err, bootfiles.ErrBadName, "%q", tc.in)

			continue
		}

		require.NoError(t, err)
		require.Equal(t, tc.want, got)
	}
}

func FuzzCleanName(f *testing.F) {
	for _, s := range []string{"ipxe.efi", "/undionly.kpxe", "../../etc/shadow", "a/b/c", "", "\x00", "..\\x"} {
		f.Add(s)
	}

	root := "/srv/tftp"

	f.Fuzz(func(t *testing.T, in string) {
		name, err := bootfiles.CleanName(in)
		if err != nil {
			return
		}

		joined := filepath.Join(root, filepath.FromSlash(name))
		rel, err := filepath.Rel(root, joined)
		if err != nil || rel == ".." || len(rel) >= 3 && rel[:3] == "../" || filepath.IsAbs(rel) || joined == root {
			t.Fatalf("%q cleaned to %q escapes to %q", in, name, joined)
		}
	})
}
