package assets_test

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

	"github.com/outpost-metal/outpost/edge/assets"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

func startFetcher(t *testing.T, s *assets.Store, policy assets.Policy, client *http.Client) *assets.Fetcher {
	t.Helper()

	cfg := assets.DefaultFetcher()
	cfg.Policy = policy

	var src assets.Source
	if client != nil {
		src = assets.HTTPSource{Client: client}
	}

	f, err := assets.NewFetcher(cfg, s, src, zaptest.NewLogger(t))
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

func waitState(t *testing.T, f *assets.Fetcher, digest string, want assets.State) {
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
	s := newStore(t, dir, 1<<30, nil)
	f := startFetcher(t, s, assets.PolicyCache, factory.Client())
	ref := assets.Ref{Name: assets.TalosName("v1.9.3", "abc123", "amd64", assets.KindKernel), SHA256: sum, Size: int64(len(data)), URLs: []string{factory.URL + "/image/kernel-amd64"}}

	// before it is cached, boot scripts pass through to the factory
	loc, err := f.Locate(ref)
	require.NoError(t, err)
	require.Equal(t, ref.URLs[0], loc.URL)

	sts, err := f.Ensure(assets.PolicyCache, []assets.Ref{ref})
	require.NoError(t, err)
	require.Equal(t, assets.StateFetching, sts[0].State)
	waitState(t, f, sum, assets.StatePresent)

	loc, err = f.Locate(ref)
	require.NoError(t, err)
	require.Equal(t, assets.Location{Local: true, Path: "/assets/" + sum}, loc)

	corrupt(t, filepath.Join(dir, "blobs", "sha256", sum))

	sts, err = f.Ensure(assets.PolicyCache, []assets.Ref{ref})
	require.NoError(t, err)
	require.Equal(t, assets.StateFetching, sts[0].State, "corruption not detected")
	waitState(t, f, sum, assets.StatePresent)
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

	s := newStore(t, t.TempDir(), 1<<30, nil)
	f := startFetcher(t, s, assets.PolicyOffline, factory.Client())
	data, sum := blob(t, 1000)
	ref := assets.Ref{Name: "agent/amd64/kernel", SHA256: sum, Size: 1000, URLs: []string{factory.URL}}

	sts, err := f.Ensure(assets.PolicyOffline, []assets.Ref{ref})
	require.NoError(t, err)
	require.Equal(t, assets.StateMissing, sts[0].State)

	_, err = f.Locate(ref)
	require.ErrorIs(t, err, assets.ErrUnavailable)

	// a boot plan asking for another missing asset gets it reported too
	other, otherSum := blob(t, 10)
	_, err = f.Locate(assets.Ref{Name: "agent/arm64/kernel", SHA256: otherSum, Size: 10})
	require.ErrorIs(t, err, assets.ErrUnavailable)

	rep := f.Report()
	require.Len(t, rep.GetAssets(), 2) // sorted by name: agent/amd64/kernel, agent/arm64/kernel

	for i, want := range []string{sum, otherSum} {
		require.Equal(t, want, rep.GetAssets()[i].GetRef().GetSha256())
		require.Equal(t, "ASSET_STATE_MISSING", rep.GetAssets()[i].GetState().String())
	}

	// a relay appears (uplink session): the missing assets are fetched through it, never from the factory
	f.SetRelay(&multiSource{byDigest: map[string][]byte{sum: data, otherSum: other}})
	waitState(t, f, sum, assets.StatePresent)
	waitState(t, f, otherSum, assets.StatePresent)
	require.Zero(t, gets.Load())
}

// multiSource serves several assets by digest.
type multiSource struct {
	byDigest map[string][]byte
}

func (m *multiSource) Name() string { return "relay" }

func (m *multiSource) Open(_ context.Context, ref assets.Ref, offset int64) (io.ReadCloser, error) {
	b, ok := m.byDigest[ref.SHA256]
	if !ok {
		return nil, assets.PermanentError(errors.New("unknown asset"))
	}

	return io.NopCloser(bytes.NewReader(b[offset:])), nil
}
