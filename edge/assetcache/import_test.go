package assetcache_test

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"encoding/json"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
	"go.uber.org/zap/zaptest"

	"github.com/outpost-metal/outpost/edge/assetcache"
	"github.com/outpost-metal/outpost/shared/assetbundle"
)

type tarEntry struct {
	name     string
	body     []byte
	typeflag byte
	link     string
}

func writeTar(t *testing.T, path string, gz bool, entries []tarEntry) {
	t.Helper()

	var buf bytes.Buffer

	var w io.Writer = &buf

	var zw *gzip.Writer
	if gz {
		zw = gzip.NewWriter(&buf)
		w = zw
	}

	tw := tar.NewWriter(w)

	for _, e := range entries {
		tf := e.typeflag
		if tf == 0 {
			tf = tar.TypeReg
		}

		require.NoError(t, tw.WriteHeader(&tar.Header{Name: e.name, Typeflag: tf, Size: int64(len(e.body)), Mode: 0o644, Linkname: e.link}))
		_, err := tw.Write(e.body)
		require.NoError(t, err)
	}

	require.NoError(t, tw.Close())

	if zw != nil {
		require.NoError(t, zw.Close())
	}

	require.NoError(t, os.WriteFile(path, buf.Bytes(), 0o644))
}

func bundleJSON(t *testing.T, items ...assetcache.BundleAsset) []byte {
	t.Helper()

	b, err := json.Marshal(assetcache.Bundle{Version: 1, Assets: items})
	require.NoError(t, err)

	return b
}

func TestImportTarball(t *testing.T) {
	t.Parallel()

	kernel, kSum := blob(t, 5000)
	initrd, iSum := blob(t, 7000)
	good := []assetcache.BundleAsset{
		{Name: "agent/amd64/kernel", SHA256: kSum, Size: 5000, Path: "agent/vmlinuz"},
		{Name: "agent/amd64/initramfs", SHA256: iSum, Size: 7000, Path: "./agent/initramfs.xz"},
	}

	for _, gz := range []bool{false, true} {
		t.Run(map[bool]string{false: "tar", true: "tar.gz"}[gz], func(t *testing.T) {
			t.Parallel()

			dir := t.TempDir()
			s := newStore(t, filepath.Join(dir, "cache"), 1<<30)
			file := filepath.Join(dir, "bundle.tar")
			// files before the manifest, and a directory entry
			writeTar(t, file, gz, []tarEntry{
				{name: "agent/", typeflag: tar.TypeDir},
				{name: "agent/vmlinuz", body: kernel},
				{name: "agent/initramfs.xz", body: initrd},
				{name: assetcache.BundleManifestName, body: bundleJSON(t, good...)},
			})

			refs, err := s.Import(t.Context(), file)
			require.NoError(t, err)
			require.Len(t, refs, 2)

			require.Equal(t, initrd, readAsset(t, s, "agent/amd64/initramfs"))
			require.Empty(t, visibleTmp(t, filepath.Join(dir, "cache")))
		})
	}
}

func visibleTmp(t *testing.T, cache string) []os.DirEntry {
	t.Helper()

	items, err := os.ReadDir(filepath.Join(cache, "tmp"))
	require.NoError(t, err)

	return items
}

func TestImportTarballRefused(t *testing.T) {
	t.Parallel()

	kernel, kSum := blob(t, 5000)
	entry := assetcache.BundleAsset{Name: "agent/amd64/kernel", SHA256: kSum, Size: 5000, Path: "vmlinuz"}

	tests := []struct {
		name    string
		entries []tarEntry
		want    error
		msg     string
	}{
		{
			name: "entry escaping with dotdot",
			entries: []tarEntry{
				{name: "../../escape", body: kernel},
				{name: assetcache.BundleManifestName, body: bundleJSON(t, entry)},
			},
			want: assetcache.ErrTraversal,
		},
		{
			name:    "absolute entry",
			entries: []tarEntry{{name: "/etc/cron.d/x", body: kernel}},
			want:    assetcache.ErrTraversal,
		},
		{
			name: "symlink entry",
			entries: []tarEntry{
				{name: "vmlinuz", typeflag: tar.TypeSymlink, link: "/etc/shadow"},
				{name: assetcache.BundleManifestName, body: bundleJSON(t, entry)},
			},
			want: assetcache.ErrTraversal,
		},
		{
			name: "manifest path escaping",
			entries: []tarEntry{
				{name: "vmlinuz", body: kernel},
				{name: assetcache.BundleManifestName, body: bundleJSON(t, assetcache.BundleAsset{Name: entry.Name, SHA256: kSum, Size: 5000, Path: "../vmlinuz"})},
			},
			want: assetcache.ErrTraversal,
		},
		{
			name: "asset name with dotdot",
			entries: []tarEntry{
				{name: "vmlinuz", body: kernel},
				{name: assetcache.BundleManifestName, body: bundleJSON(t, assetcache.BundleAsset{Name: "agent/../../x", SHA256: kSum, Size: 5000, Path: "vmlinuz"})},
			},
			want: assetcache.ErrBadName,
		},
		{
			name: "manifest lying about size",
			entries: []tarEntry{
				{name: "vmlinuz", body: kernel},
				{name: assetcache.BundleManifestName, body: bundleJSON(t, assetcache.BundleAsset{Name: entry.Name, SHA256: kSum, Size: 4000, Path: "vmlinuz"})},
			},
			want: assetcache.ErrSizeMismatch,
			msg:  "manifest says 4000 bytes, vmlinuz has 5000",
		},
		{
			name: "manifest lying about digest",
			entries: []tarEntry{
				{name: "vmlinuz", body: append([]byte{kernel[0] ^ 0xff}, kernel[1:]...)}, // a byte changed, whatever it was
				{name: assetcache.BundleManifestName, body: bundleJSON(t, entry)},
			},
			want: assetcache.ErrDigestMismatch,
		},
		{
			name:    "no manifest",
			entries: []tarEntry{{name: "vmlinuz", body: kernel}},
			msg:     "outpost-assets.json missing",
		},
	}

	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()

			dir := t.TempDir()
			cache := filepath.Join(dir, "cache")
			s := newStore(t, cache, 1<<30)

			// something already cached must survive a refused import
			old, oldSum := blob(t, 100)
			require.NoError(t, s.Put(t.Context(), assetcache.Ref{Name: "agent/arm64/cmdline", SHA256: oldSum, Size: 100}, &bytesSource{data: old}))

			file := filepath.Join(dir, "bad.tar")
			writeTar(t, file, false, tt.entries)

			_, err := s.Import(t.Context(), file)
			require.Error(t, err)

			if tt.want != nil {
				require.ErrorIs(t, err, tt.want)
			}

			if tt.msg != "" {
				require.Contains(t, err.Error(), tt.msg)
			}

			entries, _ := s.List()
			require.Len(t, entries, 1)
			require.Equal(t, oldSum, entries[0].SHA256)
			require.False(t, s.Has(kSum))
			require.Empty(t, visibleTmp(t, cache))
			_, err = os.Stat(filepath.Join(dir, "escape"))
			require.ErrorIs(t, err, os.ErrNotExist)
		})
	}
}

func TestImportDirectory(t *testing.T) {
	t.Parallel()

	kernel, kSum := blob(t, 3000)

	tests := []struct {
		name  string
		setup func(t *testing.T, dir string) []assetcache.BundleAsset
		want  error
	}{
		{
			name: "good",
			setup: func(t *testing.T, dir string) []assetcache.BundleAsset {
				require.NoError(t, os.WriteFile(filepath.Join(dir, "vmlinuz"), kernel, 0o644))

				return []assetcache.BundleAsset{{Name: "agent/amd64/kernel", SHA256: kSum, Size: 3000, Path: "vmlinuz"}}
			},
		},
		{
			name: "symlink out of the directory",
			setup: func(t *testing.T, dir string) []assetcache.BundleAsset {
				outside := filepath.Join(t.TempDir(), "secret")
				require.NoError(t, os.WriteFile(outside, kernel, 0o644))
				require.NoError(t, os.Symlink(outside, filepath.Join(dir, "vmlinuz")))

				return []assetcache.BundleAsset{{Name: "agent/amd64/kernel", SHA256: kSum, Size: 3000, Path: "vmlinuz"}}
			},
			want: assetcache.ErrTraversal,
		},
		{
			name: "directory symlink out",
			setup: func(t *testing.T, dir string) []assetcache.BundleAsset {
				outside := t.TempDir()
				require.NoError(t, os.WriteFile(filepath.Join(outside, "vmlinuz"), kernel, 0o644))
				require.NoError(t, os.Symlink(outside, filepath.Join(dir, "sub")))

				return []assetcache.BundleAsset{{Name: "agent/amd64/kernel", SHA256: kSum, Size: 3000, Path: "sub/vmlinuz"}}
			},
			want: assetcache.ErrTraversal,
		},
		{
			name: "size lie",
			setup: func(t *testing.T, dir string) []assetcache.BundleAsset {
				require.NoError(t, os.WriteFile(filepath.Join(dir, "vmlinuz"), kernel, 0o644))

				return []assetcache.BundleAsset{{Name: "agent/amd64/kernel", SHA256: kSum, Size: 30000, Path: "vmlinuz"}}
			},
			want: assetcache.ErrSizeMismatch,
		},
	}

	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()

			src := t.TempDir()
			items := tt.setup(t, src)
			require.NoError(t, os.WriteFile(filepath.Join(src, assetcache.BundleManifestName), bundleJSON(t, items...), 0o644))

			s := newStore(t, t.TempDir(), 1<<30)
			_, err := s.Import(t.Context(), src)

			if tt.want != nil {
				require.ErrorIs(t, err, tt.want)
				require.False(t, s.Has(kSum))

				return
			}

			require.NoError(t, err)
			require.True(t, s.Has(kSum))
		})
	}
}

func FuzzParseBundle(f *testing.F) {
	f.Add([]byte(`{"version":1,"assets":[{"name":"agent/amd64/kernel","sha256":"` + string(bytes.Repeat([]byte("a"), 64)) + `","size":1,"path":"k"}]}`))
	f.Add([]byte(`{"version":1,"assets":[{"name":"x","path":"../k"}]}`))

	f.Fuzz(func(t *testing.T, data []byte) {
		b, err := assetcache.ParseBundle(data)
		if err != nil {
			return
		}

		for _, a := range b.Assets {
			if !filepath.IsLocal(filepath.Clean(a.Path)) {
				t.Fatalf("accepted escaping path %q", a.Path)
			}
		}
	})
}

func FuzzImportTarball(f *testing.F) {
	var buf bytes.Buffer

	tw := tar.NewWriter(&buf)
	_ = tw.WriteHeader(&tar.Header{Name: "k", Typeflag: tar.TypeReg, Size: 1, Mode: 0o644})
	_, _ = tw.Write([]byte("k"))
	_ = tw.Close()

	f.Add(buf.Bytes())
	f.Add([]byte{0x1f, 0x8b, 0, 0})

	f.Fuzz(func(t *testing.T, data []byte) {
		dir := t.TempDir()
		file := filepath.Join(dir, "in.tar")
		require.NoError(t, os.WriteFile(file, data, 0o644))

		s := newStore(t, filepath.Join(dir, "cache"), 1<<20)
		_, _ = s.Import(t.Context(), file)

		// whatever happened, nothing may be left outside the cache or half-written inside it
		require.Empty(t, visibleTmp(t, filepath.Join(dir, "cache")))

		entries, _ := s.List()
		for _, e := range entries {
			require.NoError(t, s.Check(e.SHA256, true))
		}
	})
}

// A bundle names the controller that made it: an edge enrolled with another refuses it, whole; an edge not
// enrolled yet (pre-seeding an appliance) and one of the same controller take it; a bundle made by hand
// names none and is taken everywhere.
func TestBundleOfAnotherControllerIsRefused(t *testing.T) {
	t.Parallel()

	ours, theirs := strings.Repeat("a", 64), strings.Repeat("b", 64)
	src := filepath.Join(t.TempDir(), "vmlinuz")
	require.NoError(t, os.WriteFile(src, []byte("kernel"), 0o644))

	made := func(controller string) string {
		dir := filepath.Join(t.TempDir(), "bundle")
		_, err := assetbundle.Write(dir, []assetbundle.File{{Name: "agent/amd64/kernel", Source: src}}, controller)
		require.NoError(t, err)

		return dir
	}

	store := func(controller string) *assetcache.Store {
		cfg := assetcache.Default()
		cfg.Dir, cfg.Controller = t.TempDir(), controller

		s, err := assetcache.New(cfg, zaptest.NewLogger(t), nil)
		require.NoError(t, err)

		return s
	}

	s := store(ours)
	_, err := s.Import(t.Context(), made(theirs))
	require.ErrorIs(t, err, assetcache.ErrForeignBundle)
	require.ErrorContains(t, err, "sha256:"+theirs)
	require.False(t, s.Has("agent/amd64/kernel"), "nothing imported")

	for _, tc := range []struct{ edge, bundle string }{{ours, ours}, {"", theirs}, {ours, ""}} {
		s := store(tc.edge)
		refs, err := s.Import(t.Context(), made(tc.bundle))
		require.NoError(t, err, "edge %q, bundle %q", tc.edge, tc.bundle)
		require.Len(t, refs, 1)
	}
}
