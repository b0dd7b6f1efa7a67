package assets_test

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"io"
	"log"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/go-containerregistry/pkg/name"
	"github.com/google/go-containerregistry/pkg/registry"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/random"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/require"
	"go.uber.org/zap/zaptest"

	"github.com/outpost-metal/outpost/controller/assets"
	assetsapi "github.com/outpost-metal/outpost/shared/api/assets"
	"github.com/outpost-metal/outpost/shared/ocinames"
)

// upstream is a fake image factory serving one body per path, counting requests.
type upstream struct {
	mu     sync.Mutex
	bodies map[string][]byte
	status int
	gets   atomic.Int32
}

func (u *upstream) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	u.gets.Add(1)

	u.mu.Lock()
	body, ok := u.bodies[r.URL.Path]
	status := u.status
	u.mu.Unlock()

	switch {
	case status != 0:
		w.WriteHeader(status)
	case !ok:
		http.NotFound(w, r)
	default:
		_, _ = w.Write(body) //nolint:errcheck
	}
}

func (u *upstream) set(path string, body []byte, status int) {
	u.mu.Lock()
	defer u.mu.Unlock()

	if u.bodies == nil {
		u.bodies = map[string][]byte{}
	}

	u.bodies[path], u.status = body, status
}

// serveUpstream serves a fake factory until the test ends.
func serveUpstream(t *testing.T) (*upstream, *httptest.Server) {
	t.Helper()

	up := &upstream{}
	srv := httptest.NewServer(up)
	t.Cleanup(srv.Close)

	return up, srv
}

func randomBytes(t *testing.T, n int) ([]byte, string) {
	t.Helper()

	b := make([]byte, n)
	_, err := rand.Read(b)
	require.NoError(t, err)
	copy(b, "MZ") // a PE/EFI image's start, as kernels have

	sum := sha256.Sum256(b)

	return b, hex.EncodeToString(sum[:])
}

func startLibrary(t *testing.T, cfg assets.LibraryConfig) *assets.Library {
	t.Helper()

	l, err := assets.NewLibrary(cfg, zaptest.NewLogger(t))
	require.NoError(t, err)

	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan error, 1)

	go func() { done <- l.Run(ctx) }()

	t.Cleanup(func() {
		cancel()
		require.NoError(t, <-done)
	})

	return l
}

// waitSettled waits until w is held or has failed, and returns its progress.
func waitSettled(t *testing.T, l *assets.Library, w assets.Want) assets.Progress {
	t.Helper()

	var p assets.Progress

	require.Eventually(t, func() bool {
		l.Want(w)
		p, _ = l.Progress(w)

		return p.Held || p.Err != ""
	}, 10*time.Second, 5*time.Millisecond)

	return p
}

func TestLibraryFetchesOnceAndRemembersDigests(t *testing.T) {
	t.Parallel()

	up, srv := serveUpstream(t)
	kernel, sum := randomBytes(t, 100_000)
	up.set("/image/s/v1.11.0/kernel-amd64", kernel, 0)

	dir := t.TempDir()
	cfg := assets.DefaultLibrary(dir, srv.Client())
	cfg.Metrics = assets.NewMetrics()
	l := startLibrary(t, cfg)
	w := assets.Want{Name: "talos/v1.11.0/s/amd64/kernel", URL: srv.URL + "/image/s/v1.11.0/kernel-amd64"}

	_, held := l.Refs(w)
	require.False(t, held)

	p := waitSettled(t, l, w)
	require.True(t, p.Held, p.Err)
	require.EqualValues(t, len(kernel), p.Done)

	refs, held := l.Refs(w)
	require.True(t, held)
	require.Len(t, refs, 1)
	require.Equal(t, &assetsapi.AssetRef{Name: w.Name, Sha256: sum, Size: int64(len(kernel)), Urls: []string{w.URL}}, refs[0])

	got, err := os.ReadFile(filepath.Join(dir, sum))
	require.NoError(t, err)
	require.Equal(t, kernel, got, "stored by digest in the relay directory")

	for range 3 {
		require.True(t, l.Want(w))
	}

	require.EqualValues(t, 1, up.gets.Load(), "fetched once")
	require.Equal(t, `outpost_install_asset_fetched_bytes_total 100000
outpost_install_asset_fetches_total{outcome="held"} 1
`, gathered(t, cfg.Metrics), "fetched, nothing relayed")

	// a restarted controller holds it without asking upstream
	again := startLibrary(t, assets.DefaultLibrary(dir, srv.Client()))
	refs2, held := again.Refs(w)
	require.True(t, held)
	require.Equal(t, refs[0].GetSha256(), refs2[0].GetSha256())
	require.EqualValues(t, 1, up.gets.Load())
}

func TestLibraryRefusesWhatUpstreamGetsWrong(t *testing.T) {
	t.Parallel()

	up, srv := serveUpstream(t)

	cfg := assets.DefaultLibrary(t.TempDir(), srv.Client())
	cfg.MaxSize = 1 << 20
	l := startLibrary(t, cfg)

	for _, tc := range []struct {
		name   string
		body   []byte
		status int
		want   string
	}{
		{name: "not found", status: http.StatusNotFound, want: "404"},
		{name: "server error", status: http.StatusInternalServerError, want: "500"},
		{name: "empty", body: []byte{}, want: "empty answer"},
		{name: "too large", body: make([]byte, 1<<20+1), want: "more than"},
		{name: "garbage kernel", body: []byte("<html>rate limited</html>"), want: "not a kernel image"},
		{name: "garbage initramfs", body: []byte("<html>rate limited</html>"), want: "not an initramfs"},
	} {
		up.set("/"+tc.name, tc.body, tc.status)

		file := strings.ReplaceAll(tc.name, " ", "-")
		switch tc.name {
		case "garbage kernel":
			file = "kernel"
		case "garbage initramfs":
			file = "initramfs.xz"
		}

		w := assets.Want{Name: "talos/v1.11.0/" + strings.ReplaceAll(tc.name, " ", "-") + "/amd64/" + file, URL: srv.URL + "/" + tc.name}
		p := waitSettled(t, l, w)
		require.False(t, p.Held, tc.name)
		require.Contains(t, p.Err, tc.want, tc.name)

		_, held := l.Refs(w)
		require.False(t, held, tc.name)
	}
}

func TestLibraryCutsAStalledDownload(t *testing.T) {
	t.Parallel()

	release := make(chan struct{})
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Length", "1000000")
		_, _ = w.Write([]byte("MZ"))              //nolint:errcheck
		_ = http.NewResponseController(w).Flush() //nolint:errcheck
		select {
		case <-release:
		case <-r.Context().Done():
		} // then nothing more
	}))
	t.Cleanup(srv.Close)
	t.Cleanup(func() { close(release) })

	cfg := assets.DefaultLibrary(t.TempDir(), srv.Client())
	cfg.IdleTimeout = 100 * time.Millisecond
	l := startLibrary(t, cfg)

	p := waitSettled(t, l, assets.Want{Name: "talos/v1.11.0/s/amd64/kernel", URL: srv.URL})
	require.False(t, p.Held)
	require.Contains(t, p.Err, "nothing received for 100ms")
	require.EqualValues(t, 2, p.Done, "the bytes that came are counted")
}

func TestLibraryRefusesASecondDownloadThatDiffers(t *testing.T) {
	t.Parallel()

	up, srv := serveUpstream(t)
	first, sum := randomBytes(t, 1000)
	up.set("/k", first, 0)

	dir := t.TempDir()
	l := startLibrary(t, assets.DefaultLibrary(dir, srv.Client()))
	w := assets.Want{Name: "talos/v1.11.0/s/amd64/kernel", URL: srv.URL + "/k"}
	require.True(t, waitSettled(t, l, w).Held)

	// the held copy is lost, and upstream now answers something else under the same name
	require.NoError(t, os.Remove(filepath.Join(dir, sum)))

	second, _ := randomBytes(t, 1000)
	up.set("/k", second, 0)

	again := startLibrary(t, assets.DefaultLibrary(dir, srv.Client()))
	p := waitSettled(t, again, w)
	require.False(t, p.Held)
	require.Contains(t, p.Err, assets.ErrContentChanged.Error())

	_, held := again.Refs(w)
	require.False(t, held, "two downloads that disagree: refused, not served")
}

func TestLibraryPullsAnInstallerImageForItsArch(t *testing.T) {
	t.Parallel()

	reg := httptest.NewServer(registry.New(registry.Logger(log.New(io.Discard, "", 0))))
	t.Cleanup(reg.Close)

	u, err := url.Parse(reg.URL)
	require.NoError(t, err)

	ref := u.Host + "/installer/abc:v1.11.0"
	tag, err := name.NewTag(ref)
	require.NoError(t, err)

	// an index of two images, for amd64 and arm64
	var addenda []mutate.IndexAddendum

	for _, arch := range []string{"amd64", "arm64"} {
		img, err := random.Image(1024, 2)
		require.NoError(t, err)

		addenda = append(addenda, mutate.IndexAddendum{Add: img, Descriptor: v1.Descriptor{Platform: &v1.Platform{OS: "linux", Architecture: arch}}})
	}

	idx := mutate.AppendManifests(empty.Index, addenda...)
	require.NoError(t, remote.WriteIndex(tag, idx, remote.WithTransport(reg.Client().Transport)))

	im, err := idx.IndexManifest()
	require.NoError(t, err)

	dir := t.TempDir()
	l := startLibrary(t, assets.DefaultLibrary(dir, reg.Client()))
	w := assets.Want{Image: ref, Arch: "amd64"}

	p := waitSettled(t, l, w)
	require.True(t, p.Held, p.Err)

	refs, held := l.Refs(w)
	require.True(t, held)

	amd64, err := idx.Image(im.Manifests[0].Digest)
	require.NoError(t, err)

	layers, err := amd64.Layers()
	require.NoError(t, err)

	cfgName, err := amd64.ConfigName()
	require.NoError(t, err)

	topDigest, err := remote.Head(tag, remote.WithTransport(reg.Client().Transport))
	require.NoError(t, err)

	byName := map[string]string{}
	for _, r := range refs {
		byName[r.GetName()] = r.GetSha256()

		data, err := os.ReadFile(filepath.Join(dir, r.GetSha256()))
		require.NoError(t, err)

		sum := sha256.Sum256(data)
		require.Equal(t, r.GetSha256(), hex.EncodeToString(sum[:]), "%s stored by its digest", r.GetName())
		require.EqualValues(t, len(data), r.GetSize())
	}

	want := map[string]string{
		ocinames.ManifestName("installer/abc", "v1.11.0"):              topDigest.Digest.Hex,
		ocinames.BlobName("installer/abc", topDigest.Digest.Hex):       topDigest.Digest.Hex,
		ocinames.BlobName("installer/abc", im.Manifests[0].Digest.Hex): im.Manifests[0].Digest.Hex,
		ocinames.BlobName("installer/abc", cfgName.Hex):                cfgName.Hex,
	}

	for _, layer := range layers {
		d, err := layer.Digest()
		require.NoError(t, err)

		want[ocinames.BlobName("installer/abc", d.Hex)] = d.Hex
	}

	require.Equal(t, want, byName, "the tag, the index, the amd64 manifest, its config and layers; nothing of arm64")

	// an arch the index lacks is a clear failure
	p = waitSettled(t, l, assets.Want{Image: ref, Arch: "riscv64"})
	require.Contains(t, p.Err, "no manifest for linux/riscv64")
}

// gathered is the metrics' samples in the text format, one per line without help or type lines.
func gathered(t *testing.T, m *assets.Metrics) string {
	t.Helper()

	reg := prometheus.NewPedanticRegistry()
	require.NoError(t, reg.Register(m))

	families, err := reg.Gather()
	require.NoError(t, err)

	var b strings.Builder

	for _, f := range families {
		for _, s := range f.GetMetric() {
			b.WriteString(f.GetName())

			if labels := s.GetLabel(); len(labels) > 0 {
				b.WriteString("{")

				for i, l := range labels {
					if i > 0 {
						b.WriteString(",")
					}

					fmt.Fprintf(&b, "%s=%q", l.GetName(), l.GetValue())
				}

				b.WriteString("}")
			}

			fmt.Fprintf(&b, " %g\n", s.GetCounter().GetValue())
		}
	}

	return b.String()
}
