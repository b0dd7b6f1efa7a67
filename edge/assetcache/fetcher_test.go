package assetcache_test

import (
	"bytes"
	"context"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"
	"go.uber.org/zap/zaptest"

	"github.com/outpost-metal/outpost/edge/assetcache"
	"github.com/outpost-metal/outpost/shared/metal"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

func startFetcher(t *testing.T, s *assetcache.Store, policy assetcache.Policy, client *http.Client) *assetcache.Fetcher {
	t.Helper()

	cfg := assetcache.DefaultFetcher()
	cfg.Policy = policy

	var src assetcache.Source
	if client != nil {
		src = assetcache.HTTPSource{Client: client}
	}

	f, err := assetcache.NewFetcher(cfg, s, src, zaptest.NewLogger(t))
	require.NoError(t, err)

	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)

	go func() { done <- f.Run(ctx) }()

	t.Cleanup(func() {
		cancel()
		require.NoError(t, <-done)
	})

	return f
}

func waitState(t *testing.T, f *assetcache.Fetcher, digest string, want assetcache.State) {
	t.Helper()

	require.Eventually(t, func() bool {
		for _, st := range f.Statuses() {
			if st.Ref.SHA256 == digest {
				return st.State == want
			}
		}

		return false
	}, 10*time.Second, 5*time.Millisecond, "asset never reached %s", want)
}

func TestCorruptAssetIsRefetched(t *testing.T) {
	t.Parallel()

	data, sum := blob(t, 64<<10)

	var gets atomic.Int32

	factory := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		gets.Add(1)
		http.ServeContent(w, r, "", time.Time{}, bytes.NewReader(data))
	}))
	t.Cleanup(factory.Close)

	dir := t.TempDir()
	s := newStore(t, dir, 1<<30)
	f := startFetcher(t, s, assetcache.PolicyCache, factory.Client())
	ref := assetcache.Ref{Name: assetcache.TalosName("v1.9.3", "abc123", "amd64", assetcache.KindKernel), SHA256: sum, Size: int64(len(data)), URLs: []string{factory.URL + "/image/kernel-amd64"}}

	sts, err := f.Ensure(assetcache.PolicyCache, []assetcache.Ref{ref})
	require.NoError(t, err)
	require.Equal(t, assetcache.StateFetching, sts[0].State)
	waitState(t, f, sum, assetcache.StatePresent)

	require.True(t, s.Has(ref.Name), "held under its logical name")

	corrupt(t, filepath.Join(dir, "blobs", "sha256", sum))

	sts, err = f.Ensure(assetcache.PolicyCache, []assetcache.Ref{ref})
	require.NoError(t, err)
	require.Equal(t, assetcache.StateFetching, sts[0].State, "corruption not detected")
	waitState(t, f, sum, assetcache.StatePresent)
	require.Equal(t, int32(2), gets.Load())
	require.NoError(t, s.Check(sum, true))
	require.Equal(t, 1.0, s.ErrorCount("corrupt"))
}

func TestOfflinePolicy(t *testing.T) {
	t.Parallel()

	var gets atomic.Int32

	factory := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		gets.Add(1)
		w.WriteHeader(http.StatusInternalServerError)
	}))
	t.Cleanup(factory.Close)

	s := newStore(t, t.TempDir(), 1<<30)
	f := startFetcher(t, s, assetcache.PolicyOffline, factory.Client())
	data, sum := blob(t, 1000)
	ref := assetcache.Ref{Name: "agent/amd64/kernel", SHA256: sum, Size: 1000, URLs: []string{factory.URL}}

	other, otherSum := blob(t, 10)

	sts, err := f.Ensure(assetcache.PolicyOffline, []assetcache.Ref{ref, {Name: "agent/arm64/kernel", SHA256: otherSum, Size: 10}})
	require.NoError(t, err)
	require.Equal(t, assetcache.StateMissing, sts[0].State)
	require.Equal(t, assetcache.StateMissing, sts[1].State)

	rep := f.Report()
	require.Len(t, rep.GetAssets(), 2) // sorted by name: agent/amd64/kernel, agent/arm64/kernel

	for i, want := range []string{sum, otherSum} {
		require.Equal(t, want, rep.GetAssets()[i].GetRef().GetSha256())
		require.Equal(t, "ASSET_STATE_MISSING", rep.GetAssets()[i].GetState().String())
	}

	// a relay appears (uplink session): the missing assets are fetched through it, never from the factory
	f.SetRelay(&multiSource{byDigest: map[string][]byte{sum: data, otherSum: other}})
	waitState(t, f, sum, assetcache.StatePresent)
	waitState(t, f, otherSum, assetcache.StatePresent)
	require.Zero(t, gets.Load())
}

// multiSource serves several assets by digest.
type multiSource struct {
	byDigest map[string][]byte
}

func (m *multiSource) Name() string { return "relay" }

func (m *multiSource) Open(_ context.Context, ref assetcache.Ref, offset int64) (io.ReadCloser, error) {
	b, ok := m.byDigest[ref.SHA256]
	if !ok {
		return nil, assetcache.PermanentError(errors.New("unknown asset"))
	}

	return io.NopCloser(bytes.NewReader(b[offset:])), nil
}

// TestOneContentUnderTwoNames: an image's top manifest is asked for as a blob and as its tag, one digest under
// two names; one download serves both names.
func TestOneContentUnderTwoNames(t *testing.T) {
	t.Parallel()

	s := newStore(t, t.TempDir(), 1<<30)
	f := startFetcher(t, s, assetcache.PolicyOffline, nil)
	data, sum := blob(t, 2000)
	asBlob := assetcache.Ref{Name: "oci/siderolabs/installer/blobs/" + sum, SHA256: sum, Size: int64(len(data))}
	asTag := assetcache.Ref{Name: "oci/siderolabs/installer/manifests/v1.11.5", SHA256: sum, Size: int64(len(data))}

	sts, err := f.Ensure(assetcache.PolicyOffline, []assetcache.Ref{asBlob, asTag})
	require.NoError(t, err)
	require.Equal(t, assetcache.StateMissing, sts[1].State)

	src := &multiSource{byDigest: map[string][]byte{sum: data}}
	f.SetRelay(src)
	waitState(t, f, sum, assetcache.StatePresent)

	for _, name := range []string{asBlob.Name, asTag.Name} {
		e, err := s.Lookup(name)
		require.NoError(t, err, "%s not held after the download", name)
		require.Equal(t, sum, e.SHA256)
	}
}

// An asset is coming while it is being fetched, and no longer once it is here; one the fetcher cannot fetch
// (offline, no relay) or was never asked for is not coming.
func TestComing(t *testing.T) {
	t.Parallel()

	data, sum := blob(t, 4096)
	release := make(chan struct{})

	factory := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		select {
		case <-release:
		case <-r.Context().Done():
			return
		}

		http.ServeContent(w, r, "", time.Time{}, bytes.NewReader(data))
	}))
	t.Cleanup(factory.Close)

	s := newStore(t, t.TempDir(), 1<<30)
	f := startFetcher(t, s, assetcache.PolicyCache, factory.Client())
	name := assetcache.AgentName(metal.ARM64, "vmlinuz")

	require.False(t, f.Coming(name), "not asked for yet")

	_, err := f.Ensure(assetcache.PolicyCache, []assetcache.Ref{{Name: name, SHA256: sum, Size: int64(len(data)), URLs: []string{factory.URL}}})
	require.NoError(t, err)
	require.True(t, f.Coming(name), "being fetched")
	require.False(t, f.Coming(assetcache.AgentName(metal.AMD64, "vmlinuz")), "another name")

	close(release)
	waitState(t, f, sum, assetcache.StatePresent)
	require.False(t, f.Coming(name), "here, no longer coming")

	offline := startFetcher(t, newStore(t, t.TempDir(), 1<<30), assetcache.PolicyOffline, nil)
	_, other := blob(t, 10)
	sts, err := offline.Ensure(assetcache.PolicyOffline, []assetcache.Ref{{Name: name, SHA256: other, Size: 10}})
	require.NoError(t, err)
	require.Equal(t, assetcache.StateMissing, sts[0].State)
	require.False(t, offline.Coming(name), "missing with no source to fetch it from")
}
