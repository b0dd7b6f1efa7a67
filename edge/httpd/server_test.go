package httpd_test

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/stretchr/testify/require"
	"go.uber.org/zap/zaptest"

	"github.com/outpost-metal/outpost/edge/assetcache"
	"github.com/outpost-metal/outpost/edge/boot"
	"github.com/outpost-metal/outpost/edge/bootfiles"
	"github.com/outpost-metal/outpost/edge/httpd"
	"github.com/outpost-metal/outpost/edge/registry"
	bootpb "github.com/outpost-metal/outpost/shared/api/boot"
	"github.com/outpost-metal/outpost/shared/ocinames"
)

const (
	uuidDisk    = "11111111-2222-3333-4444-000000000001"
	uuidSanboot = "11111111-2222-3333-4444-000000000002"
	uuid404     = "11111111-2222-3333-4444-000000000003"
	uuidDeny    = "11111111-2222-3333-4444-000000000004"
	uuidInstall = "11111111-2222-3333-4444-000000000005"
	uuidUnknown = "11111111-2222-3333-4444-0000000000ff"
)

type recorder struct {
	mu      sync.Mutex
	served  []httpd.BootServed
	fetches []bootfiles.Fetch
	assets  []httpd.AssetFetch
}

func (r *recorder) AssetFetch(f httpd.AssetFetch) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.assets = append(r.assets, f)
}

// assetFetches returns the asset fetches told so far.
func (r *recorder) assetFetches() []httpd.AssetFetch {
	r.mu.Lock()
	defer r.mu.Unlock()

	return append([]httpd.AssetFetch(nil), r.assets...)
}

func (r *recorder) BootServed(b httpd.BootServed) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.served = append(r.served, b)
}

// modes returns the modes of the boots served to uuid, in order.
func (r *recorder) modes(uuid string) []string {
	r.mu.Lock()
	defer r.mu.Unlock()

	var out []string

	for _, b := range r.served {
		if b.UUID.String() == uuid {
			out = append(out, string(b.Mode))
		}
	}

	return out
}

func (r *recorder) HTTPFetch(f bootfiles.Fetch) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.fetches = append(r.fetches, f)
}

type env struct {
	srv    *httpd.Server
	ts     *httptest.Server
	reg    *prometheus.Registry
	obs    *recorder
	assets string
	tbl    *boot.Table
	cache  *assetIndex
}

func newEnv(t *testing.T) *env {
	t.Helper()

	return newEnvWith(t, httpd.Default())
}

// newEnvWith is newEnv with cfg.
func newEnvWith(t *testing.T, cfg httpd.Config) *env {
	t.Helper()

	tbl, err := boot.Open(boot.Config{StateDir: t.TempDir()}, zaptest.NewLogger(t))
	require.NoError(t, err)

	_, err = tbl.Apply(&bootpb.ApplyRequest{Change: &bootpb.ApplyRequest_Snapshot{Snapshot: &bootpb.Table{
		Version: 3,
		Plans: []*bootpb.Plan{
			{Uuid: uuidDisk, Mode: bootpb.Mode_MODE_DISK},
			{Uuid: uuidSanboot, Mode: bootpb.Mode_MODE_DISK, DiskMethod: bootpb.DiskMethod_DISK_METHOD_IPXE_SANBOOT},
			{Uuid: uuid404, Mode: bootpb.Mode_MODE_DISK, DiskMethod: bootpb.DiskMethod_DISK_METHOD_HTTP_404},
			{Uuid: uuidDeny, Mode: bootpb.Mode_MODE_DENY},
			{
				Uuid: uuidInstall, Mode: bootpb.Mode_MODE_INSTALL, ExtraArgs: []string{"talos.dashboard.disabled=1"},
				Install: &bootpb.Kernel{KernelUrl: "https://factory.example/vmlinuz", InitrdUrl: "/assets/talos/initramfs.xz", Args: []string{"talos.platform=metal"}},
			},
		},
		Config: []byte("machine: {}\n"),
	}}})
	require.NoError(t, err)

	assets := t.TempDir()
	require.NoError(t, os.MkdirAll(filepath.Join(assets, "agent/x86_64"), 0o755))
	require.NoError(t, os.WriteFile(filepath.Join(assets, "agent/x86_64/vmlinuz"), []byte("0123456789abcdef"), 0o644))

	// The other files the table's scripts name; agent/arm64 is in the cache (fake index) rather than the directory.
	require.NoError(t, os.WriteFile(filepath.Join(assets, "agent/x86_64/initramfs.xz"), []byte("initrd"), 0o644))
	require.NoError(t, os.MkdirAll(filepath.Join(assets, "talos"), 0o755))
	require.NoError(t, os.WriteFile(filepath.Join(assets, "talos/initramfs.xz"), []byte("talos initrd"), 0o644))

	cache := &assetIndex{Handler: newAssets(t, assets), names: map[string]bool{"agent/arm64/vmlinuz": true, "agent/arm64/initramfs.xz": true}}

	reg := prometheus.NewRegistry()
	obs := &recorder{}

	srv, err := httpd.New(cfg, zaptest.NewLogger(t), httpd.Deps{
		Table: tbl, Catalog: bootfiles.NewCatalog(map[string][]byte{"ipxe.efi": []byte("EFI-BINARY")}),
		Observer: obs, Registerer: reg, Gatherer: reg, Assets: cache,
	})
	require.NoError(t, err)
	t.Cleanup(func() { srv.Close() }) //nolint:errcheck

	ts := httptest.NewServer(srv.Handler())
	t.Cleanup(ts.Close)

	return &env{srv: srv, ts: ts, reg: reg, obs: obs, assets: assets, tbl: tbl, cache: cache}
}

// newAssets is the edge's /assets/ over an empty cache and a files directory.
func newAssets(t *testing.T, files string) *assetcache.Handler {
	t.Helper()

	store, err := assetcache.New(assetcache.Config{Dir: t.TempDir(), MaxBytes: 1 << 20, Attempts: 1}, zaptest.NewLogger(t), nil)
	require.NoError(t, err)

	h, err := assetcache.NewHandler(store, files)
	require.NoError(t, err)
	t.Cleanup(func() { require.NoError(t, h.Close()) })

	return h
}

// assetIndex is the edge's /assets/ over a files directory, with names the boot scripts are told the cache
// holds besides.
type assetIndex struct {
	*assetcache.Handler

	mu    sync.Mutex
	names map[string]bool
}

func (a *assetIndex) Has(name string) bool {
	a.mu.Lock()
	defer a.mu.Unlock()

	return a.names[name] || a.Handler.Has(name)
}

func (a *assetIndex) add(name string) {
	a.mu.Lock()
	defer a.mu.Unlock()

	a.names[name] = true
}

func get(t *testing.T, url string, hdr map[string]string) (*http.Response, string) {
	t.Helper()

	req, err := http.NewRequest(http.MethodGet, url, nil)
	require.NoError(t, err)

	for k, v := range hdr {
		req.Header.Set(k, v)
	}

	resp, err := http.DefaultClient.Do(req)
	require.NoError(t, err)

	defer resp.Body.Close() //nolint:errcheck

	body, err := io.ReadAll(resp.Body)
	require.NoError(t, err)

	return resp, string(body)
}

func TestInitScript(t *testing.T) {
	t.Parallel()

	e := newEnv(t)
	resp, body := get(t, e.ts.URL+"/ipxe/init.ipxe", nil)
	require.Equal(t, http.StatusOK, resp.StatusCode)
	require.EqualValues(t, len(body), resp.ContentLength, "Content-Length set")
	require.True(t, strings.HasPrefix(body, "#!ipxe\n"))
	require.Contains(t, body, e.ts.URL+"/ipxe/boot.ipxe?uuid=${uuid}&mac=${net${idx}/mac:hexhyp}&arch=${buildarch}")
	require.Contains(t, body, "dhcp net${idx}")
	require.Contains(t, body, "set retries:int32 5")
	require.Contains(t, body, "reboot")
}

func TestBootScript(t *testing.T) {
	t.Parallel()

	e := newEnv(t)
	host := strings.TrimPrefix(e.ts.URL, "http://")
	hostOnly, _, err := net.SplitHostPort(host)
	require.NoError(t, err)

	for _, tc := range []struct {
		name     string
		query    string
		code     int
		contains []string
		mode     string
	}{
		{
			name: "unknown machine gets agent mode", query: "uuid=" + uuidUnknown + "&mac=52-54-00-12-34-56&arch=x86_64", code: 200, mode: "agent",
			contains: []string{
				"kernel " + e.ts.URL + "/assets/agent/x86_64/vmlinuz initrd=initrd metal.provider.address=" + hostOnly + ":50042",
				"talos.config=" + e.ts.URL + "/config?u=${uuid}", "console=ttyS0",
				"initrd --name initrd " + e.ts.URL + "/assets/agent/x86_64/initramfs.xz",
			},
		},
		{name: "bios ipxe (i386 build) gets the x86_64 kernel", query: "uuid=" + uuidUnknown + "&arch=i386", code: 200, mode: "agent", contains: []string{"/assets/agent/x86_64/vmlinuz"}},
		{name: "no uuid still boots agent", query: "mac=52:54:00:12:34:56&arch=arm64", code: 200, mode: "agent", contains: []string{"/assets/agent/arm64/vmlinuz"}},
		{name: "disk via exit", query: "uuid=" + uuidDisk, code: 200, mode: "disk", contains: []string{"exit 1"}},
		{name: "disk via sanboot", query: "uuid=" + uuidSanboot, code: 200, mode: "disk", contains: []string{"sanboot --no-describe --drive 0x80"}},
		{name: "disk via http 404", query: "uuid=" + uuid404, code: 404, mode: "disk"},
		{name: "deny", query: "uuid=" + strings.ToUpper(uuidDeny), code: 404, mode: "deny"},
		{
			name: "install", query: "uuid=" + uuidInstall + "&arch=x86_64", code: 200, mode: "install",
			contains: []string{
				"kernel https://factory.example/vmlinuz initrd=initrd talos.config=" + e.ts.URL + "/config?u=${uuid} talos.platform=metal console=tty0 console=ttyS0 talos.dashboard.disabled=1",
				"initrd --name initrd " + e.ts.URL + "/assets/talos/initramfs.xz",
			},
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()

			resp, body := get(t, e.ts.URL+"/ipxe/boot.ipxe?"+tc.query, nil)
			require.Equal(t, tc.code, resp.StatusCode, body)

			if tc.code == 200 {
				require.EqualValues(t, len(body), resp.ContentLength)
				require.True(t, strings.HasPrefix(body, "#!ipxe\n"))
			}

			for _, c := range tc.contains {
				require.Contains(t, body, c)
			}

			// The answer is flushed before it is counted: the counter may trail the response a moment.
			require.Eventually(t, func() bool { return testutil.ToFloat64(e.srv.ServedCounter(tc.mode)) >= 1 },
				5*time.Second, time.Millisecond)
		})
	}
}

// An install plan whose assets have not reached the site: the machine gets a script that waits and asks for
// its boot script again (never a kernel that is not there, never something else); once the asset is in the
// cache, the same request boots it.
func TestBootWaitsForAssetsTheSiteLacks(t *testing.T) {
	t.Parallel()

	e := newEnv(t)

	const uuid = "11111111-2222-3333-4444-00000000000a"

	_, err := e.tbl.Apply(&bootpb.ApplyRequest{Change: &bootpb.ApplyRequest_Delta{Delta: &bootpb.Delta{
		BaseVersion: 3, Version: 4,
		Upsert: []*bootpb.Plan{{Uuid: uuid, Mode: bootpb.Mode_MODE_INSTALL, Install: &bootpb.Kernel{
			KernelUrl: "/assets/install/abc/v1.11.0/kernel-amd64", InitrdUrl: "/assets/talos/initramfs.xz",
		}}},
	}}})
	require.NoError(t, err)

	query := "uuid=" + uuid + "&mac=52-54-00-12-34-0a&arch=x86_64"

	resp, body := get(t, e.ts.URL+"/ipxe/boot.ipxe?"+query, nil)
	require.Equal(t, http.StatusOK, resp.StatusCode)
	require.True(t, strings.HasPrefix(body, "#!ipxe\n"))
	require.NotContains(t, body, "kernel ")
	require.Contains(t, body, "waits for 1 boot asset(s)")
	require.Contains(t, body, "sleep 30\nchain --replace "+e.ts.URL+"/ipxe/boot.ipxe?arch=x86_64&mac=52-54-00-12-34-0a&uuid="+uuid+" ||")
	require.Eventually(t, func() bool { return testutil.ToFloat64(e.srv.ServedCounter("wait")) == 1 }, 5*time.Second, time.Millisecond)

	require.Contains(t, body, " ||\necho outpost: no boot script for this machine now, leaving it to the firmware\nexit 1\n")

	// Asking again while still waiting: the same answer, but not reported (or logged) at every retry.
	_, again2 := get(t, e.ts.URL+"/ipxe/boot.ipxe?"+query, nil)
	require.Equal(t, body, again2)
	require.Eventually(t, func() bool { return testutil.ToFloat64(e.srv.ServedCounter("wait")) == 2 }, 5*time.Second, time.Millisecond)
	require.Eventually(t, func() bool { return slices.Equal([]string{"wait"}, e.obs.modes(uuid)) }, 5*time.Second, time.Millisecond)

	// The chain back parses to the same request.
	again := body[strings.Index(body, "boot.ipxe?")+len("boot.ipxe?") : strings.Index(body, " ||")]
	q, err := httpd.ParseBootQuery(again)
	require.NoError(t, err)
	require.EqualValues(t, uuid, q.UUID)
	require.Equal(t, "52:54:00:12:34:0a", q.MAC.String())

	e.cache.add("install/abc/v1.11.0/kernel-amd64")

	_, body = get(t, e.ts.URL+"/ipxe/boot.ipxe?"+query, nil)
	require.Contains(t, body, "kernel "+e.ts.URL+"/assets/install/abc/v1.11.0/kernel-amd64 initrd=initrd")
	require.Contains(t, body, "initrd --name initrd "+e.ts.URL+"/assets/talos/initramfs.xz")
	require.Eventually(t, func() bool { return slices.Equal([]string{"wait", "install"}, e.obs.modes(uuid)) },
		5*time.Second, time.Millisecond)
}

func TestBootScriptBadInput(t *testing.T) {
	t.Parallel()

	e := newEnv(t)

	for _, q := range []string{
		"uuid=not-a-uuid", "mac=zz", "arch=mips", "uuid=" + uuidDisk + "&uuid=" + uuidDeny, "%zz",
		"uuid=" + strings.Repeat("a", 600),
	} {
		resp, _ := get(t, e.ts.URL+"/ipxe/boot.ipxe?"+q, nil)
		require.Equal(t, http.StatusBadRequest, resp.StatusCode, q)
	}

	require.InDelta(t, 6, testutil.ToFloat64(e.srv.RejectedCounter("bad_query")), 0)

	req, err := http.NewRequest(http.MethodGet, e.ts.URL+"/ipxe/init.ipxe", nil)
	require.NoError(t, err)
	req.Host = "evil\" host"
	resp, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	resp.Body.Close() //nolint:errcheck
	require.Equal(t, http.StatusBadRequest, resp.StatusCode)
}

func TestBootServedEvent(t *testing.T) {
	t.Parallel()

	e := newEnv(t)
	resp, _ := get(t, e.ts.URL+"/ipxe/boot.ipxe?uuid="+uuidDisk+"&mac=52-54-00-12-34-56&arch=x86_64", nil)
	require.Equal(t, http.StatusOK, resp.StatusCode)

	// The event is recorded after the answer is flushed.
	require.Eventually(t, func() bool { return len(e.obs.modes(uuidDisk)) == 1 }, 5*time.Second, time.Millisecond)

	e.obs.mu.Lock()
	defer e.obs.mu.Unlock()

	require.Len(t, e.obs.served, 1)
	require.EqualValues(t, uuidDisk, e.obs.served[0].UUID)
	require.Equal(t, httpd.Mode("disk"), e.obs.served[0].Mode)
	require.EqualValues(t, 3, e.obs.served[0].TableVersion)
	require.Equal(t, "52:54:00:12:34:56", e.obs.served[0].MAC.String())
}

func TestBinariesOverHTTP(t *testing.T) {
	t.Parallel()

	e := newEnv(t)
	resp, body := get(t, e.ts.URL+"/tftp/ipxe.efi", nil)
	require.Equal(t, http.StatusOK, resp.StatusCode)
	require.Equal(t, "EFI-BINARY", body)
	etag := resp.Header.Get("ETag")
	require.NotEmpty(t, etag)

	resp, _ = get(t, e.ts.URL+"/tftp/ipxe.efi", map[string]string{"If-None-Match": etag})
	require.Equal(t, http.StatusNotModified, resp.StatusCode)

	resp, body = get(t, e.ts.URL+"/tftp/ipxe.efi", map[string]string{"Range": "bytes=4-"})
	require.Equal(t, http.StatusPartialContent, resp.StatusCode)
	require.Equal(t, "BINARY", body)

	for _, p := range []string{"/tftp/missing.efi", "/tftp/..%2f..%2fetc%2fpasswd", "/tftp/a//b"} {
		resp, _ = get(t, e.ts.URL+p, nil)
		require.Equal(t, http.StatusNotFound, resp.StatusCode, p)
	}
}

func TestAssets(t *testing.T) {
	t.Parallel()

	e := newEnv(t)
	url := e.ts.URL + "/assets/agent/x86_64/vmlinuz"

	resp, body := get(t, url, nil)
	require.Equal(t, http.StatusOK, resp.StatusCode)
	require.Equal(t, "0123456789abcdef", body)
	require.Equal(t, "bytes", resp.Header.Get("Accept-Ranges"))
	etag := resp.Header.Get("ETag")
	require.NotEmpty(t, etag)

	resp, body = get(t, url, map[string]string{"Range": "bytes=10-13"})
	require.Equal(t, http.StatusPartialContent, resp.StatusCode)
	require.Equal(t, "abcd", body)

	resp, _ = get(t, url, map[string]string{"If-None-Match": etag})
	require.Equal(t, http.StatusNotModified, resp.StatusCode)

	head, err := http.Head(url)
	require.NoError(t, err)
	head.Body.Close() //nolint:errcheck
	require.Equal(t, http.StatusOK, head.StatusCode)
	require.EqualValues(t, 16, head.ContentLength)

	// Outside the directory (cleaned away by the router, or not a name at all), a directory itself, a
	// symlink out: none served.
	require.NoError(t, os.Symlink("/etc/passwd", filepath.Join(e.assets, "link")))

	for p, want := range map[string]int{
		"/assets/../../etc/passwd": http.StatusNotFound, "/assets/..%2f..%2fetc%2fpasswd": http.StatusBadRequest,
		"/assets/agent": http.StatusNotFound, "/assets/link": http.StatusNotFound, "/assets/nope": http.StatusNotFound,
	} {
		resp, _ = get(t, e.ts.URL+p, nil)
		require.Equal(t, want, resp.StatusCode, p)
	}
}

func TestConfigMetricsHealth(t *testing.T) {
	t.Parallel()

	e := newEnv(t)

	resp, body := get(t, e.ts.URL+"/config?u="+uuidUnknown, nil)
	require.Equal(t, http.StatusOK, resp.StatusCode)
	require.Equal(t, "machine: {}\n", body)

	resp, body = get(t, e.ts.URL+"/healthz", nil)
	require.Equal(t, http.StatusOK, resp.StatusCode)
	require.Equal(t, "ok\n", body)

	resp, body = get(t, e.ts.URL+"/metrics", nil)
	require.Equal(t, http.StatusOK, resp.StatusCode)
	require.Contains(t, body, `outpost_http_requests_total{code="200",handler="config"} 1`)
}

func TestConfigBeforeController(t *testing.T) {
	t.Parallel()

	tbl, err := boot.Open(boot.Config{StateDir: t.TempDir()}, zaptest.NewLogger(t))
	require.NoError(t, err)

	srv, err := httpd.New(httpd.Default(), zaptest.NewLogger(t), httpd.Deps{Table: tbl, Catalog: bootfiles.NewCatalog(nil)})
	require.NoError(t, err)

	defer srv.Close() //nolint:errcheck

	rec := httptest.NewRecorder()
	srv.Handler().ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/config?u=x", nil))
	require.Equal(t, http.StatusServiceUnavailable, rec.Code)
}

func FuzzParseBootQuery(f *testing.F) {
	for _, s := range []string{
		"uuid=" + uuidDisk + "&mac=52-54-00-12-34-56&arch=x86_64", "", "uuid=&mac=&arch=", "%", "a=b&a=c",
		"mac=52:54:00:12:34:56:78:9a", strings.Repeat("&", 600), "arch=x86_64&platform=efi", "platform=uboot",
	} {
		f.Add(s)
	}

	f.Fuzz(func(t *testing.T, raw string) {
		q, err := httpd.ParseBootQuery(raw)
		if err != nil {
			return
		}

		if q.UUID != "" && len(q.UUID) != 36 {
			t.Fatalf("uuid %q accepted", q.UUID)
		}

		if q.MAC != nil && len(q.MAC) != 6 {
			t.Fatalf("mac %v accepted", q.MAC)
		}

		for _, s := range []string{q.UUID.String(), q.Build.Name(), q.Platform.Name()} {
			if strings.ContainsAny(s, "\n\r &${}") || bytes.ContainsRune([]byte(s), 0) {
				t.Fatalf("unsafe value %q accepted", s)
			}
		}

		// What the wait script chains back to is safe in a script line and parses to the same request.
		enc := q.Encode()
		if strings.ContainsAny(enc, "\n\r ${}") {
			t.Fatalf("unsafe encoding %q", enc)
		}

		back, err := httpd.ParseBootQuery(enc)
		if err != nil || back.UUID != q.UUID || back.MAC.String() != q.MAC.String() || back.Build != q.Build || back.Platform != q.Platform {
			t.Fatalf("%q -> %q -> %+v, %v; want %+v", raw, enc, back, err, q)
		}
	})
}

// manifestSource hands the cache a manifest's bytes.
type manifestSource []byte

func (manifestSource) Name() string { return "test" }

func (m manifestSource) Open(context.Context, assetcache.Ref, int64) (io.ReadCloser, error) {
	return io.NopCloser(bytes.NewReader(m)), nil
}

// TestRegistryMount: /v2/ goes to Deps.Registry for every method (writes get the registry's own error),
// counted under the handler "registry"; without a registry nothing is served there.
func TestRegistryMount(t *testing.T) {
	t.Parallel()

	tbl, err := boot.Open(boot.Config{StateDir: t.TempDir()}, zaptest.NewLogger(t))
	require.NoError(t, err)

	store, err := assetcache.New(assetcache.Config{Dir: t.TempDir(), MaxBytes: 1 << 20, Attempts: 1}, zaptest.NewLogger(t), nil)
	require.NoError(t, err)

	manifest := []byte(`{"schemaVersion":2,"mediaType":"application/vnd.oci.image.manifest.v1+json","config":{},"layers":[]}`)
	sum := sha256.Sum256(manifest)
	digest := hex.EncodeToString(sum[:])
	require.NoError(t, store.Put(t.Context(), assetcache.Ref{Name: ocinames.ManifestName("siderolabs/installer", "v1"), SHA256: digest, Size: int64(len(manifest))}, manifestSource(manifest)))

	serve := func(deps httpd.Deps) string {
		srv, err := httpd.New(httpd.Default(), zaptest.NewLogger(t), deps)
		require.NoError(t, err)
		t.Cleanup(func() { srv.Close() }) //nolint:errcheck

		ts := httptest.NewServer(srv.Handler())
		t.Cleanup(ts.Close)

		return ts.URL
	}

	reg := prometheus.NewRegistry()
	url := serve(httpd.Deps{
		Table: tbl, Catalog: bootfiles.NewCatalog(nil), Registry: registry.New(store, zaptest.NewLogger(t)),
		Registerer: reg, Gatherer: reg,
	})

	for _, tc := range []struct {
		method, path string
		want         int
	}{
		{method: http.MethodGet, path: "/v2/", want: http.StatusOK},
		{method: http.MethodHead, path: "/v2/", want: http.StatusOK},
		{method: http.MethodGet, path: "/v2/siderolabs/installer/manifests/v1?ns=upstream.invalid", want: http.StatusOK},
		{method: http.MethodGet, path: "/v2/siderolabs/installer/manifests/v2", want: http.StatusNotFound},
		{method: http.MethodGet, path: "/v2/siderolabs%2Finstaller/manifests/v1", want: http.StatusBadRequest},
		{method: http.MethodPut, path: "/v2/siderolabs/installer/manifests/v1", want: http.StatusMethodNotAllowed},
		{method: http.MethodPost, path: "/v2/siderolabs/installer/blobs/uploads/", want: http.StatusMethodNotAllowed},
		{method: http.MethodDelete, path: "/v2/siderolabs/installer/blobs/sha256:" + digest, want: http.StatusMethodNotAllowed},
	} {
		req, err := http.NewRequestWithContext(t.Context(), tc.method, url+tc.path, nil)
		require.NoError(t, err)

		resp, err := http.DefaultClient.Do(req)
		require.NoError(t, err)

		body, err := io.ReadAll(resp.Body)
		require.NoError(t, err)
		require.NoError(t, resp.Body.Close())
		require.Equal(t, tc.want, resp.StatusCode, "%s %s: %s", tc.method, tc.path, body)
		require.Equal(t, "registry/2.0", resp.Header.Get("Docker-Distribution-API-Version"), "%s %s", tc.method, tc.path)

		if tc.want == http.StatusOK && strings.Contains(tc.path, "/manifests/") {
			require.Equal(t, manifest, body)
			require.Equal(t, "sha256:"+digest, resp.Header.Get("Docker-Content-Digest"))
		}
	}

	_, metrics := get(t, url+"/metrics", nil)
	require.Contains(t, metrics, `outpost_http_requests_total{code="405",handler="registry"} 3`)
	require.Contains(t, metrics, `outpost_http_requests_total{code="200",handler="registry"} 3`)

	resp, _ := get(t, serve(httpd.Deps{Table: tbl, Catalog: bootfiles.NewCatalog(nil)})+"/v2/", nil)
	require.Equal(t, http.StatusNotFound, resp.StatusCode)
	require.Empty(t, resp.Header.Get("Docker-Distribution-API-Version"))
}

// TestBootScriptNoArchAssets: an arm64 machine at an edge holding the x86_64 agent assets only is refused by
// name (http_rejected{reason="no_agent_assets_for_arch"}), given no script, and no boot is reported for it.
func TestBootScriptNoArchAssets(t *testing.T) {
	t.Parallel()

	e := newEnv(t)

	e.cache.mu.Lock()
	e.cache.names = map[string]bool{}
	e.cache.mu.Unlock()

	const uuid = "11111111-2222-3333-4444-0000000000a4"

	resp, body := get(t, e.ts.URL+"/ipxe/boot.ipxe?uuid="+uuid+"&mac=52-54-00-12-34-a4&arch=arm64&platform=efi", nil)
	require.Equal(t, http.StatusNotFound, resp.StatusCode)
	require.NotContains(t, body, "kernel ")
	require.InDelta(t, 1, testutil.ToFloat64(e.srv.RejectedCounter(httpd.ReasonNoArchAssets)), 0)
	require.InDelta(t, 0, testutil.ToFloat64(e.srv.ServedCounter("agent")), 0)
	require.Empty(t, e.obs.modes(uuid))

	// The x86_64 machine beside it boots its own.
	_, body = get(t, e.ts.URL+"/ipxe/boot.ipxe?uuid="+uuid+"&mac=52-54-00-12-34-a5&arch=x86_64&platform=efi", nil)
	require.Contains(t, body, "kernel "+e.ts.URL+"/assets/agent/x86_64/vmlinuz initrd=initrd")
}
