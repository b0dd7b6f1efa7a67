package assetcache_test

import (
	"bytes"
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.uber.org/zap/zaptest"

	"github.com/outpost-metal/outpost/edge/assetcache"
	"github.com/outpost-metal/outpost/shared/metal"
)

func blob(t testing.TB, n int) ([]byte, string) {
	t.Helper()

	b := make([]byte, n)
	_, err := rand.Read(b)
	require.NoError(t, err)

	sum := sha256.Sum256(b)

	return b, hex.EncodeToString(sum[:])
}

func newStore(t testing.TB, dir string, maxBytes int64) *assetcache.Store {
	t.Helper()

	cfg := assetcache.Default()
	cfg.Dir = dir
	cfg.MaxBytes = maxBytes
	cfg.RetryBackoff = time.Millisecond
	cfg.Attempts = 3

	s, err := assetcache.New(cfg, zaptest.NewLogger(t), nil)
	require.NoError(t, err)

	return s
}

// bytesSource serves a byte slice, optionally breaking off after cut bytes on its first Open calls.
type bytesSource struct {
	data    []byte
	mu      sync.Mutex
	cuts    int   // how many Opens break off early
	cutAt   int64 // bytes served per broken Open
	offsets []int64
}

func (b *bytesSource) Name() string { return "test" }

func (b *bytesSource) Open(_ context.Context, _ assetcache.Ref, offset int64) (io.ReadCloser, error) {
	b.mu.Lock()
	defer b.mu.Unlock()

	b.offsets = append(b.offsets, offset)
	rest := b.data[offset:]

	if b.cuts > 0 {
		b.cuts--

		n := min(b.cutAt, int64(len(rest)))

		return io.NopCloser(io.MultiReader(bytes.NewReader(rest[:n]), errReader{})), nil
	}

	return io.NopCloser(bytes.NewReader(rest)), nil
}

type errReader struct{}

func (errReader) Read([]byte) (int, error) { return 0, errors.New("connection reset") }

// blockingSource serves half the content, then blocks until the context ends.
type blockingSource struct {
	data    []byte
	started chan struct{}
}

func (b *blockingSource) Name() string { return "blocking" }

func (b *blockingSource) Open(ctx context.Context, _ assetcache.Ref, offset int64) (io.ReadCloser, error) {
	pr, pw := io.Pipe()

	go func() {
		pw.Write(b.data[offset : len(b.data)/2]) //nolint:errcheck
		close(b.started)
		<-ctx.Done()
		pw.CloseWithError(ctx.Err())
	}()

	return pr, nil
}

// readAsset returns what the store serves under name.
func readAsset(t *testing.T, s *assetcache.Store, name string) []byte {
	t.Helper()

	f, _, err := s.Open(name)
	require.NoError(t, err)

	got, err := io.ReadAll(f)
	require.NoError(t, err)
	require.NoError(t, f.Close())

	return got
}

func visibleFiles(t *testing.T, dir string) []string {
	t.Helper()

	var files []string

	for _, sub := range []string{"blobs/sha256", "tmp"} {
		items, err := os.ReadDir(filepath.Join(dir, sub))
		require.NoError(t, err)

		for _, it := range items {
			files = append(files, filepath.Join(sub, it.Name()))
		}
	}

	return files
}

// An interrupted download leaves no visible asset; its partial file stays in the temporary directory, and the
// next download of the asset, also by a new store over the same directory (an edge restart), resumes it.
func TestInterruptedDownloadLeavesNoVisibleAsset(t *testing.T) {
	t.Parallel()

	dir := t.TempDir()
	s := newStore(t, dir, 1<<30)
	data, sum := blob(t, 1<<20)
	ref := assetcache.Ref{Name: assetcache.AgentName(metal.AMD64, "vmlinuz"), SHA256: sum, Size: int64(len(data))}

	ctx, cancel := context.WithCancel(t.Context())
	src := &blockingSource{data: data, started: make(chan struct{})}
	errc := make(chan error, 1)

	go func() { errc <- s.Put(ctx, ref, src) }()

	<-src.started
	cancel()

	err := <-errc
	require.ErrorIs(t, err, context.Canceled)
	require.False(t, s.Has(sum))

	_, _, err = s.Open(ref.Name)
	require.ErrorIs(t, err, assetcache.ErrNotFound)
	require.Equal(t, []string{filepath.Join("tmp", sum+".partial")}, visibleFiles(t, dir), "only the partial file, outside the cache")

	// a new store over the same directory (the edge restarted) shows nothing of it...
	s2 := newStore(t, dir, 1<<30)
	entries, used := s2.List()
	require.Empty(t, entries)
	require.Zero(t, used)

	// ...and resumes it where it stopped
	resumed := &bytesSource{data: data}
	require.NoError(t, s2.Put(t.Context(), ref, resumed))
	require.Equal(t, []int64{int64(len(data) / 2)}, resumed.offsets)
	require.Equal(t, []string{filepath.Join("blobs/sha256", sum)}, visibleFiles(t, dir))

	require.Equal(t, data, readAsset(t, s2, ref.Name))
}

// A partial file that is already complete (the edge stopped between the last byte and the rename) is
// verified and renamed in without asking the source for anything.
func TestCompletePartialDownloadIsCommitted(t *testing.T) {
	t.Parallel()

	dir := t.TempDir()
	s := newStore(t, dir, 1<<30)
	data, sum := blob(t, 64<<10)
	ref := assetcache.Ref{Name: "agent/amd64/initramfs", SHA256: sum, Size: int64(len(data))}

	require.NoError(t, os.WriteFile(filepath.Join(dir, "tmp", sum+".partial"), data, 0o600))

	src := &bytesSource{data: data}
	require.NoError(t, s.Put(t.Context(), ref, src))
	require.Empty(t, src.offsets, "nothing asked of the source")
	require.Equal(t, []string{filepath.Join("blobs/sha256", sum)}, visibleFiles(t, dir))
}

// While another process holds an asset's partial file, a download of it works in a private file, which is
// not kept when the download is cut short (it could never be resumed).
func TestBusyPartialDownloadUsesAPrivateFile(t *testing.T) {
	t.Parallel()

	dir := t.TempDir()
	s := newStore(t, dir, 1<<30)
	data, sum := blob(t, 64<<10)
	ref := assetcache.Ref{Name: "agent/amd64/initramfs", SHA256: sum, Size: int64(len(data))}

	held, err := os.OpenFile(filepath.Join(dir, "tmp", sum+".partial"), os.O_RDWR|os.O_CREATE, 0o600)
	require.NoError(t, err)
	require.NoError(t, syscall.Flock(int(held.Fd()), syscall.LOCK_EX|syscall.LOCK_NB))

	ctx, cancel := context.WithCancel(t.Context())
	src := &blockingSource{data: data, started: make(chan struct{})}
	errc := make(chan error, 1)

	go func() { errc <- s.Put(ctx, ref, src) }()

	<-src.started
	cancel()
	require.ErrorIs(t, <-errc, context.Canceled)
	require.Equal(t, []string{filepath.Join("tmp", sum+".partial")}, visibleFiles(t, dir), "no private file left")
	require.NoError(t, held.Close())

	// Released: the next download uses the shared file and completes.
	require.NoError(t, s.Put(t.Context(), ref, &bytesSource{data: data}))
	require.True(t, s.Has(sum))
	require.True(t, s.Has(ref.Name), "by name too")
}

// A partial file whose bytes went bad is caught by the digest check at the end, removed, and the next download
// starts from the beginning.
func TestCorruptPartialDownloadStartsAfresh(t *testing.T) {
	t.Parallel()

	dir := t.TempDir()
	s := newStore(t, dir, 1<<30)
	data, sum := blob(t, 256<<10)
	ref := assetcache.Ref{Name: "agent/amd64/initramfs", SHA256: sum, Size: int64(len(data))}

	bad := append([]byte(nil), data[:100<<10]...)
	bad[10] ^= 0xff
	require.NoError(t, os.WriteFile(filepath.Join(dir, "tmp", sum+".partial"), bad, 0o600))

	first := &bytesSource{data: data}
	require.ErrorIs(t, s.Put(t.Context(), ref, first), assetcache.ErrDigestMismatch)
	require.Equal(t, []int64{100 << 10}, first.offsets)
	require.Empty(t, visibleFiles(t, dir), "the bad partial is gone")

	again := &bytesSource{data: data}
	require.NoError(t, s.Put(t.Context(), ref, again))
	require.Equal(t, []int64{0}, again.offsets)
	require.True(t, s.Has(sum))
}

func TestPutResumesAfterCut(t *testing.T) {
	t.Parallel()

	s := newStore(t, t.TempDir(), 1<<30)
	data, sum := blob(t, 300<<10)
	src := &bytesSource{data: data, cuts: 3, cutAt: 64 << 10}
	ref := assetcache.Ref{Name: "agent/amd64/initramfs", SHA256: sum, Size: int64(len(data))}

	require.NoError(t, s.Put(t.Context(), ref, src))
	require.Equal(t, []int64{0, 64 << 10, 128 << 10, 192 << 10}, src.offsets)

	require.Equal(t, data, readAsset(t, s, ref.Name))

	f, digest, err := s.Open(ref.Name)
	require.NoError(t, err)
	require.NoError(t, f.Close())
	require.Equal(t, sum, digest)

	e, err := s.Lookup(ref.Name)
	require.NoError(t, err)
	require.Equal(t, []string{ref.Name}, e.Names)
}

func TestPutRefusesBadContent(t *testing.T) {
	t.Parallel()

	data, sum := blob(t, 4096)

	// one byte changed, whatever it was (the blob is random: setting it to a fixed value left it alone 1 time in 256)
	changed := slices.Clone(data)
	changed[0] ^= 0xff

	tests := []struct {
		name   string
		ref    assetcache.Ref
		src    []byte
		want   error
		reason string
	}{
		{name: "digest mismatch", ref: assetcache.Ref{Name: "a/kernel", SHA256: sum, Size: 4096}, src: changed, want: assetcache.ErrDigestMismatch, reason: "digest_mismatch"},
		{name: "source longer than size", ref: assetcache.Ref{Name: "a/kernel", SHA256: sum, Size: 4000}, src: data, want: assetcache.ErrSizeMismatch, reason: "size_mismatch"},
		{name: "traversal in name", ref: assetcache.Ref{Name: "../../etc/passwd", SHA256: sum, Size: 4096}, src: data, want: assetcache.ErrBadName, reason: "bad_ref"},
		{name: "bad digest", ref: assetcache.Ref{Name: "a/kernel", SHA256: "abc", Size: 4096}, src: data, want: assetcache.ErrBadDigest, reason: "bad_ref"},
	}

	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()

			dir := t.TempDir()
			s := newStore(t, dir, 1<<30)

			err := s.Put(t.Context(), tt.ref, &bytesSource{data: tt.src})
			require.ErrorIs(t, err, tt.want)
			require.Equal(t, 1.0, s.ErrorCount(tt.reason))
			require.Empty(t, visibleFiles(t, dir))

			entries, _ := s.List()
			require.Empty(t, entries)
		})
	}
}

func TestEvictionNeverRemovesNeeded(t *testing.T) {
	t.Parallel()

	now := time.Unix(1_700_000_000, 0)
	clock := func() time.Time { now = now.Add(time.Second); return now }

	cfg := assetcache.Default()
	cfg.Dir = t.TempDir()
	cfg.MaxBytes = 3 << 20

	s, err := assetcache.New(cfg, zaptest.NewLogger(t), clock)
	require.NoError(t, err)

	put := func(name string) string {
		data, sum := blob(t, 1<<20)
		require.NoError(t, s.Put(t.Context(), assetcache.Ref{Name: name, SHA256: sum, Size: int64(len(data))}, &bytesSource{data: data}))

		return sum
	}

	a := put("agent/amd64/kernel") // oldest
	b := put("agent/amd64/initramfs")
	c := put("agent/arm64/kernel")

	s.Hold(a) // what the controller asked the site to hold for its plans

	// touch b so that c is the least recently used evictable asset after a
	f, _, err := s.Open(b)
	require.NoError(t, err)
	f.Close() //nolint:errcheck

	d := put("agent/arm64/initramfs")

	require.True(t, s.Has(a), "needed asset evicted")
	require.True(t, s.Has(b))
	require.False(t, s.Has(c), "least recently used evictable asset kept")
	require.True(t, s.Has(d))

	// everything held: a new asset does not fit and nothing is evicted
	s.Hold(b)
	s.Hold(d)
	data, sum := blob(t, 1<<20)
	err = s.Put(t.Context(), assetcache.Ref{Name: "talos/v1.9.3/abc/amd64/kernel", SHA256: sum, Size: int64(len(data))}, &bytesSource{data: data})
	require.ErrorIs(t, err, assetcache.ErrNoSpace)
	require.True(t, s.Has(a) && s.Has(b) && s.Has(d))

	// explicit eviction of a needed asset is refused
	evicted, refused, err := s.Evict(a, c)
	require.NoError(t, err)
	require.Empty(t, evicted)
	require.ErrorIs(t, refused[a], assetcache.ErrNeeded)
	require.ErrorIs(t, refused[c], assetcache.ErrNotFound)
}

func TestCheckDetectsCorruption(t *testing.T) {
	t.Parallel()

	dir := t.TempDir()
	s := newStore(t, dir, 1<<30)
	data, sum := blob(t, 8192)
	require.NoError(t, s.Put(t.Context(), assetcache.Ref{Name: "a/k", SHA256: sum, Size: 8192}, &bytesSource{data: data}))
	require.NoError(t, s.Check(sum, false))

	corrupt(t, filepath.Join(dir, "blobs", "sha256", sum))

	require.ErrorIs(t, s.Check(sum, false), assetcache.ErrCorrupt)
	require.False(t, s.Has(sum))
	require.Equal(t, 1.0, s.ErrorCount("corrupt"))
}

// corrupt flips the first byte of a (read-only) cached file, keeping its size.
func corrupt(t *testing.T, path string) {
	t.Helper()

	require.NoError(t, os.Chmod(path, 0o644))
	f, err := os.OpenFile(path, os.O_RDWR, 0)
	require.NoError(t, err)

	b := make([]byte, 1)
	_, err = f.ReadAt(b, 0)
	require.NoError(t, err)
	_, err = f.WriteAt([]byte{b[0] ^ 0xff}, 0)
	require.NoError(t, err)
	require.NoError(t, f.Close())
	// make sure the modification time differs even on coarse clocks
	require.NoError(t, os.Chtimes(path, time.Now(), time.Now().Add(time.Hour)))
}

func TestDiskFullMidDownload(t *testing.T) {
	t.Parallel()

	if testing.Short() {
		t.Skip("mounts a tmpfs; skipped under -short")
	}

	if os.Geteuid() != 0 {
		t.Skip("needs root to mount a small tmpfs")
	}

	dir := t.TempDir()
	out, err := exec.Command("mount", "-t", "tmpfs", "-o", "size=1m", "oa-assets-test", dir).CombinedOutput()
	if err != nil {
		t.Skipf("cannot mount tmpfs: %v: %s", err, out)
	}

	t.Cleanup(func() { _ = exec.Command("umount", dir).Run() })

	s := newStore(t, dir, 1<<30)

	small, smallSum := blob(t, 100<<10)
	require.NoError(t, s.Put(t.Context(), assetcache.Ref{Name: "agent/amd64/cmdline", SHA256: smallSum, Size: int64(len(small))}, &bytesSource{data: small}))

	big, bigSum := blob(t, 2<<20)
	err = s.Put(t.Context(), assetcache.Ref{Name: "agent/amd64/initramfs", SHA256: bigSum, Size: int64(len(big))}, &bytesSource{data: big})
	require.Error(t, err)
	require.True(t, assetcache.IsDiskFull(err), "want a disk-full error, got %v", err)
	require.Contains(t, err.Error(), "no space left on device")
	require.Equal(t, 1.0, s.ErrorCount("disk_full"))
	require.False(t, s.Has(bigSum))
	require.ElementsMatch(t, []string{filepath.Join("blobs/sha256", smallSum)}, visibleFiles(t, dir))

	// the cache keeps serving what it has
	require.Equal(t, small, readAsset(t, s, "agent/amd64/cmdline"))
}

func TestSecondProcessSeesImport(t *testing.T) {
	t.Parallel()

	dir := t.TempDir()
	edge := newStore(t, dir, 1<<30)
	tool := newStore(t, dir, 1<<30)

	data, sum := blob(t, 1000)
	require.NoError(t, tool.Put(t.Context(), assetcache.Ref{Name: "agent/amd64/kernel", SHA256: sum, Size: 1000}, &bytesSource{data: data}))

	e, err := edge.Lookup("agent/amd64/kernel")
	require.NoError(t, err)
	require.Equal(t, sum, e.SHA256)
}

func TestValidateName(t *testing.T) {
	t.Parallel()

	tests := []struct {
		name string
		in   string
		ok   bool
	}{
		{name: "agent", in: "agent/amd64/kernel", ok: true},
		{name: "talos", in: "talos/v1.9.3/376567988ad370138ad8b2698212367b8edcb69b5fd68c80be1f2ec7d603b4ba/arm64/initramfs", ok: true},
		{name: "dotdot", in: "agent/../../etc/passwd"},
		{name: "only dotdot", in: ".."},
		{name: "absolute", in: "/etc/passwd"},
		{name: "hidden", in: "agent/.x"},
		{name: "empty segment", in: "agent//kernel"},
		{name: "backslash", in: `agent\..\kernel`},
		{name: "trailing slash", in: "agent/"},
		{name: "empty", in: ""},
		{name: "nul", in: "agent/\x00"},
		{name: "percent encoding", in: "agent/%2e%2e"},
	}

	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()

			err := assetcache.ValidateName(tt.in)
			if tt.ok {
				require.NoError(t, err)
			} else {
				require.ErrorIs(t, err, assetcache.ErrBadName)
			}
		})
	}
}

func FuzzValidateName(f *testing.F) {
	for _, s := range []string{"agent/amd64/kernel", "../x", "a/./b", "a/b/"} {
		f.Add(s)
	}

	f.Fuzz(func(t *testing.T, name string) {
		if assetcache.ValidateName(name) != nil {
			return
		}

		if !filepath.IsLocal(name) || filepath.Clean(name) != name {
			t.Fatalf("accepted name %q is not a clean local path", name)
		}
	})
}

// refusingSource refuses every asset for good, as the relay does one it does not know.
type refusingSource struct{}

func (refusingSource) Name() string { return "relay" }

func (refusingSource) Open(context.Context, assetcache.Ref, int64) (io.ReadCloser, error) {
	return nil, assetcache.PermanentError(errors.New("relay: asset unknown"))
}

// A source refusing an asset is the source's error, not the cache's: counted as such, tried once.
func TestRefusedBySourceCountedAsSource(t *testing.T) {
	t.Parallel()

	s := newStore(t, t.TempDir(), 1<<20)
	_, sum := blob(t, 100)

	err := s.Put(t.Context(), assetcache.Ref{Name: "agent/amd64/kernel", SHA256: sum, Size: 100}, refusingSource{})
	require.ErrorContains(t, err, "asset unknown")
	require.Equal(t, 1.0, s.ErrorCount("source"))
	require.Zero(t, s.ErrorCount("write"))
	require.False(t, s.Has(sum))
}
