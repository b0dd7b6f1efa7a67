package assetcache_test

import (
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/outpost-metal/outpost/edge/assetcache"
)

func TestHandler(t *testing.T) {
	t.Parallel()

	s := newStore(t, t.TempDir(), 1<<30)
	data, sum := blob(t, 10000)
	require.NoError(t, s.Put(t.Context(), assetcache.Ref{Name: "agent/amd64/kernel", SHA256: sum, Size: 10000}, &bytesSource{data: data}))

	// The files directory: a plain file, a file under a name the cache also holds (the cache wins) and a
	// directory (not served).
	files := t.TempDir()
	require.NoError(t, os.MkdirAll(filepath.Join(files, "agent/amd64/dir"), 0o755))
	require.NoError(t, os.WriteFile(filepath.Join(files, "agent/amd64/kernel"), []byte("shadowed"), 0o644))
	require.NoError(t, os.WriteFile(filepath.Join(files, "plain"), []byte("from the directory"), 0o644))

	h, err := assetcache.NewHandler(s, files)
	require.NoError(t, err)
	t.Cleanup(func() { require.NoError(t, h.Close()) })

	for name, want := range map[string]bool{
		"agent/amd64/kernel": true, sum: true, "plain": true, "agent/amd64/dir": false, "agent/arm64/kernel": false, "../plain": false,
	} {
		require.Equal(t, want, h.Has(name), name)
	}

	srv := httptest.NewServer(h)
	t.Cleanup(srv.Close)

	etag := `"sha256:` + sum + `"`

	tests := []struct {
		name       string
		method     string
		path       string
		header     map[string]string
		wantStatus int
		wantBody   []byte
		wantLen    string
		wantETag   string // empty: the cached asset's
	}{
		{name: "by digest", method: http.MethodGet, path: "/assets/" + sum, wantStatus: 200, wantBody: data},
		{name: "by name", method: http.MethodGet, path: "/assets/agent/amd64/kernel", wantStatus: 200, wantBody: data},
		{name: "head", method: http.MethodHead, path: "/assets/" + sum, wantStatus: 200, wantBody: []byte{}, wantLen: "10000"},
		{name: "range", method: http.MethodGet, path: "/assets/" + sum, header: map[string]string{"Range": "bytes=100-199"}, wantStatus: 206, wantBody: data[100:200]},
		{name: "open range", method: http.MethodGet, path: "/assets/" + sum, header: map[string]string{"Range": "bytes=9990-"}, wantStatus: 206, wantBody: data[9990:]},
		{name: "unsatisfiable range", method: http.MethodGet, path: "/assets/" + sum, header: map[string]string{"Range": "bytes=20000-"}, wantStatus: 416},
		{name: "etag matches", method: http.MethodGet, path: "/assets/" + sum, header: map[string]string{"If-None-Match": etag}, wantStatus: 304},
		{name: "if-range stale", method: http.MethodGet, path: "/assets/" + sum, header: map[string]string{"Range": "bytes=0-9", "If-Range": `"sha256:00"`}, wantStatus: 200, wantBody: data},
		{name: "plain file", method: http.MethodGet, path: "/assets/plain", wantStatus: 200, wantBody: []byte("from the directory"), wantETag: "-"},
		{name: "directory", method: http.MethodGet, path: "/assets/agent/amd64/dir", wantStatus: 404},
		{name: "unknown", method: http.MethodGet, path: "/assets/agent/arm64/kernel", wantStatus: 404},
		{name: "traversal", method: http.MethodGet, path: "/assets/agent/..%2f..%2fetc/passwd", wantStatus: 400},
		{name: "hidden segment", method: http.MethodGet, path: "/assets/.manifest", wantStatus: 400},
		{name: "post", method: http.MethodPost, path: "/assets/" + sum, wantStatus: 405},
	}

	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()

			req, err := http.NewRequestWithContext(t.Context(), tt.method, srv.URL+tt.path, nil)
			require.NoError(t, err)

			for k, v := range tt.header {
				req.Header.Set(k, v)
			}

			resp, err := srv.Client().Do(req)
			require.NoError(t, err)

			defer resp.Body.Close() //nolint:errcheck

			body, err := io.ReadAll(resp.Body)
			require.NoError(t, err)
			require.Equal(t, tt.wantStatus, resp.StatusCode, string(body))

			if tt.wantBody != nil {
				require.Equal(t, tt.wantBody, body)
				if tt.wantETag == "" {
					require.Equal(t, etag, resp.Header.Get("ETag"))
				} else {
					require.Contains(t, resp.Header.Get("ETag"), tt.wantETag)
				}
			}

			if tt.wantLen != "" {
				require.Equal(t, tt.wantLen, resp.Header.Get("Content-Length"))
			}
		})
	}
}
