package httpd_test

import (
	"bytes"
	"io"
	"net"
	"net/http"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/outpost-metal/outpost/edge/httpd"
)

// TestAssetFetchReported: a whole asset sent is told with its size; a download the machine stopped early is
// told with how much went and why; range requests, revalidations, HEAD and missing assets are not told.
func TestAssetFetchReported(t *testing.T) {
	t.Parallel()

	e := newEnv(t)
	loopback := netip.MustParseAddr("127.0.0.1")

	resp, body := get(t, e.ts.URL+"/assets/agent/x86_64/vmlinuz", nil)
	require.Equal(t, http.StatusOK, resp.StatusCode)
	require.Equal(t, "0123456789abcdef", body)

	require.Eventually(t, func() bool { return len(e.obs.assetFetches()) == 1 }, 5*time.Second, 10*time.Millisecond)
	f := e.obs.assetFetches()[0]
	require.Equal(t, "agent/x86_64/vmlinuz", f.Name)
	require.Equal(t, loopback, f.Remote)
	require.EqualValues(t, 16, f.Sent)
	require.EqualValues(t, 16, f.Size)
	require.NoError(t, f.Err)

	etag := resp.Header.Get("ETag")

	resp, _ = get(t, e.ts.URL+"/assets/agent/x86_64/vmlinuz", map[string]string{"Range": "bytes=0-3"})
	require.Equal(t, http.StatusPartialContent, resp.StatusCode)
	resp, _ = get(t, e.ts.URL+"/assets/agent/x86_64/vmlinuz", map[string]string{"If-None-Match": etag})
	require.Equal(t, http.StatusNotModified, resp.StatusCode)
	resp, _ = get(t, e.ts.URL+"/assets/nope", nil)
	require.Equal(t, http.StatusNotFound, resp.StatusCode)

	head, err := http.Head(e.ts.URL + "/assets/agent/x86_64/vmlinuz")
	require.NoError(t, err)
	head.Body.Close() //nolint:errcheck

	// A big kernel whose download the machine gives up on after 64 KiB.
	big := bytes.Repeat([]byte("kernel"), 8<<20/6)
	require.NoError(t, os.WriteFile(filepath.Join(e.assets, "agent/x86_64/big"), big, 0o644))

	req, err := http.NewRequestWithContext(t.Context(), http.MethodGet, e.ts.URL+"/assets/agent/x86_64/big", nil)
	require.NoError(t, err)
	resp, err = http.DefaultClient.Do(req)
	require.NoError(t, err)
	_, err = io.CopyN(io.Discard, resp.Body, 64<<10)
	require.NoError(t, err)
	require.NoError(t, resp.Body.Close())

	require.Eventually(t, func() bool { return len(e.obs.assetFetches()) == 2 }, 10*time.Second, 10*time.Millisecond,
		"the range, 304, 404 and HEAD are not told; the stopped download is")

	f = e.obs.assetFetches()[1]
	require.Equal(t, "agent/x86_64/big", f.Name)
	require.EqualValues(t, len(big), f.Size)
	require.Less(t, f.Sent, f.Size)
	require.Error(t, f.Err)
}

// TestAssetDownloadStalls: a machine that stops taking its kernel (reset or gone, its connection still open)
// has the download ended once nothing could be sent for the stall timeout: the connection goes back and the
// stop is told, not held for the whole response's half hour.
func TestAssetDownloadStalls(t *testing.T) {
	t.Parallel()

	cfg := httpd.Default()
	cfg.StallTimeout = 300 * time.Millisecond

	e := newEnvWith(t, cfg)

	// Larger than what the sockets' buffers on both ends take.
	big := bytes.Repeat([]byte("kernel"), 64<<20/6)
	require.NoError(t, os.WriteFile(filepath.Join(e.assets, "agent/x86_64/big"), big, 0o644))

	conn, err := net.Dial("tcp", strings.TrimPrefix(e.ts.URL, "http://"))
	require.NoError(t, err)

	t.Cleanup(func() { conn.Close() }) //nolint:errcheck

	_, err = conn.Write([]byte("GET /assets/agent/x86_64/big HTTP/1.1\r\nHost: edge\r\n\r\n"))
	require.NoError(t, err)

	// Nothing read from here on.
	require.Eventually(t, func() bool { return len(e.obs.assetFetches()) == 1 }, 20*time.Second, 20*time.Millisecond)

	f := e.obs.assetFetches()[0]
	require.Less(t, f.Sent, f.Size)
	require.ErrorIs(t, f.Err, os.ErrDeadlineExceeded)
}
