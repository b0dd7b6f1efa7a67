package realomni_test

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	mrand "math/rand/v2"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	"github.com/google/go-containerregistry/pkg/v1/validate"
	"github.com/siderolabs/image-factory/pkg/client"
	"github.com/siderolabs/image-factory/pkg/schematic"
	"github.com/stretchr/testify/require"
	"go.uber.org/zap/zaptest"

	"github.com/outpost-metal/outpost/qemu/realomni"
)

// TestFactoryAnswersRealClients binds the fake to the clients Omni uses: the image factory's own client
// and the OCI distribution API's tag listing (GET /v2/<name>/tags/list, what go-containerregistry's
// remote.List asks).
func TestFactoryAnswersRealClients(t *testing.T) {
	t.Parallel()

	f := realomni.NewFactory(realomni.FactoryConfig{
		TalosVersions: []string{"1.11.5", "v1.12.8"}, KubernetesVersions: []string{"1.34.2"}, Logger: zaptest.NewLogger(t),
	})

	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)

	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan error, 1)

	go func() { done <- f.Serve(ctx, ln) }()

	t.Cleanup(func() {
		cancel()
		require.NoError(t, <-done)
	})

	addr := ln.Addr().String()

	c, err := client.New("http://" + addr)
	require.NoError(t, err)

	versions, err := c.Versions(ctx)
	require.NoError(t, err)
	require.Equal(t, []string{"v1.11.5", "v1.12.8"}, versions)

	broken, err := c.BrokenVersions(ctx)
	require.NoError(t, err)
	require.Empty(t, broken)

	in := schematic.Schematic{Customization: schematic.Customization{
		ExtraKernelArgs:  []string{"console=ttyS0"},
		SystemExtensions: schematic.SystemExtensions{OfficialExtensions: []string{"siderolabs/iscsi-tools"}},
	}}
	wantID, err := in.ID()
	require.NoError(t, err)

	id, normalized, err := c.SchematicCreate(ctx, in)
	require.NoError(t, err)
	require.Equal(t, wantID, id, "the ID is the real factory's: SHA-256 of the normalized schematic")
	require.Equal(t, in.Customization.ExtraKernelArgs, normalized.Customization.ExtraKernelArgs)

	again, _, err := c.SchematicCreate(ctx, in)
	require.NoError(t, err)
	require.Equal(t, id, again, "the same schematic gets the same ID")

	got, err := c.SchematicGet(ctx, id)
	require.NoError(t, err)
	require.Equal(t, in.Customization.SystemExtensions, got.Customization.SystemExtensions)
	require.Equal(t, []string{id}, f.Schematics())

	_, err = c.SchematicGet(ctx, "0000")
	require.Error(t, err)

	exts, err := c.ExtensionsVersions(ctx, "1.11.5")
	require.NoError(t, err)
	require.NotEmpty(t, exts)

	for _, e := range exts {
		require.Contains(t, e.Ref, addr+"/", "extension images are named on the fake's own host")
	}

	overlays, err := c.OverlaysVersions(ctx, "v1.11.5")
	require.NoError(t, err)
	require.Empty(t, overlays)

	for _, tc := range []struct {
		name string
		repo string
		want []string
	}{
		{name: "kubelet", repo: "siderolabs/kubelet", want: []string{"v1.34.2"}},
		{name: "installer", repo: "siderolabs/installer", want: []string{"v1.11.5", "v1.12.8"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			for _, path := range []string{"/v2/", "/v2/" + tc.repo + "/tags/list"} {
				req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+addr+path, nil)
				require.NoError(t, err)

				resp, err := http.DefaultClient.Do(req)
				require.NoError(t, err)

				var list struct {
					Name string   `json:"name"`
					Tags []string `json:"tags"`
				}

				require.NoError(t, json.NewDecoder(resp.Body).Decode(&list))
				require.NoError(t, resp.Body.Close())
				require.Equal(t, http.StatusOK, resp.StatusCode, path)
				require.Equal(t, "registry/2.0", resp.Header.Get("Docker-Distribution-API-Version"))

				if path != "/v2/" {
					require.Equal(t, tc.repo, list.Name)
					require.Equal(t, tc.want, list.Tags)
				}
			}
		})
	}

	require.Empty(t, f.Unanswered())

	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+addr+"/image/abc/v1.11.5/metal-amd64.iso", nil)
	require.NoError(t, err)

	resp, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	require.NoError(t, resp.Body.Close())
	require.Equal(t, http.StatusNotFound, resp.StatusCode)
	require.Equal(t, []string{"GET /image/abc/v1.11.5/metal-amd64.iso"}, f.Unanswered())
}

// serveFactory serves f on loopback until the test ends and returns its address and an HTTP client whose
// idle connections are closed at the end.
func serveFactory(t *testing.T, f *realomni.Factory) (string, *http.Client) {
	t.Helper()

	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)

	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)

	go func() { done <- f.Serve(ctx, ln) }()

	tr := &http.Transport{}

	t.Cleanup(func() {
		tr.CloseIdleConnections()
		cancel()
		require.NoError(t, <-done)
	})

	return ln.Addr().String(), &http.Client{Transport: tr}
}

// imageFactory is a factory serving random kernel and initramfs files for amd64, with one schematic created
// through the image factory's own client.
func imageFactory(t *testing.T) (f *realomni.Factory, addr string, c *http.Client, id string, kernel, initramfs []byte) {
	t.Helper()

	dir := t.TempDir()
	kernel, initramfs = randomBytes(t, 1<<20+17), randomBytes(t, 300<<10)
	files := realomni.ImageFiles{Kernel: filepath.Join(dir, "vmlinuz"), Initramfs: filepath.Join(dir, "initramfs.xz")}
	require.NoError(t, os.WriteFile(files.Kernel, kernel, 0o644))
	require.NoError(t, os.WriteFile(files.Initramfs, initramfs, 0o644))

	f = realomni.NewFactory(realomni.FactoryConfig{
		TalosVersions: []string{"1.11.5", "v1.12.8"}, KubernetesVersions: []string{"1.34.2"},
		Images: map[string]realomni.ImageFiles{"amd64": files}, Logger: zaptest.NewLogger(t),
	})
	addr, c = serveFactory(t, f)

	fc, err := client.New("http://"+addr, client.WithClient(*c))
	require.NoError(t, err)

	id, _, err = fc.SchematicCreate(t.Context(), schematic.Schematic{Customization: schematic.Customization{
		SystemExtensions: schematic.SystemExtensions{OfficialExtensions: []string{"siderolabs/metal-agent"}},
	}})
	require.NoError(t, err)

	return f, addr, c, id, kernel, initramfs
}

func randomBytes(t *testing.T, n int) []byte {
	t.Helper()

	b := make([]byte, n)
	_, err := rand.Read(b)
	require.NoError(t, err)

	return b
}

// get fetches url with optional headers and returns the status, the body read until the first error, the
// response headers and that error.
func get(t *testing.T, c *http.Client, method, url string, header ...string) (int, []byte, http.Header, error) {
	t.Helper()

	req, err := http.NewRequestWithContext(t.Context(), method, url, nil)
	require.NoError(t, err)

	for i := 0; i+1 < len(header); i += 2 {
		req.Header.Set(header[i], header[i+1])
	}

	resp, err := c.Do(req)
	require.NoError(t, err)

	defer resp.Body.Close() //nolint:errcheck

	body, rerr := io.ReadAll(resp.Body)

	return resp.StatusCode, body, resp.Header, rerr
}

// TestFactoryServesImages: a known schematic's kernel and initramfs for a listed version, whole, by range and
// by HEAD, counted by kind; anything else 404.
func TestFactoryServesImages(t *testing.T) {
	t.Parallel()

	f, addr, c, id, kernel, initramfs := imageFactory(t)
	base := "http://" + addr + "/image/" + id

	code, body, hdr, err := get(t, c, http.MethodGet, base+"/v1.11.5/kernel-amd64")
	require.NoError(t, err)
	require.Equal(t, http.StatusOK, code)
	require.Equal(t, kernel, body)
	require.Equal(t, "bytes", hdr.Get("Accept-Ranges"))

	code, body, _, err = get(t, c, http.MethodGet, base+"/1.11.5/kernel-amd64", "Range", "bytes=1000-1999")
	require.NoError(t, err)
	require.Equal(t, http.StatusPartialContent, code, "a version without its v is the same version")
	require.Equal(t, kernel[1000:2000], body)

	code, body, hdr, err = get(t, c, http.MethodHead, base+"/v1.12.8/initramfs-amd64.xz")
	require.NoError(t, err)
	require.Equal(t, http.StatusOK, code)
	require.Empty(t, body)
	require.Equal(t, fmt.Sprint(len(initramfs)), hdr.Get("Content-Length"))

	code, body, _, err = get(t, c, http.MethodGet, base+"/v1.12.8/initramfs-amd64.xz", "Range", fmt.Sprintf("bytes=%d-", len(initramfs)-10))
	require.NoError(t, err)
	require.Equal(t, http.StatusPartialContent, code)
	require.Equal(t, initramfs[len(initramfs)-10:], body)

	for _, tc := range []struct {
		name, path string
	}{
		{name: "unknown schematic", path: "/image/" + strings.Repeat("0", 64) + "/v1.11.5/kernel-amd64"},
		{name: "unlisted version", path: "/image/" + id + "/v1.9.0/kernel-amd64"},
		{name: "no image for the arch", path: "/image/" + id + "/v1.11.5/kernel-arm64"},
		{name: "initramfs without .xz", path: "/image/" + id + "/v1.11.5/initramfs-amd64"},
	} {
		code, _, _, err := get(t, c, http.MethodGet, "http://"+addr+tc.path)
		require.NoError(t, err, tc.name)
		require.Equal(t, http.StatusNotFound, code, tc.name)
	}

	counts := f.Requests()
	require.Equal(t, int64(5), counts[realomni.KindImageKernel].Requests)
	require.Equal(t, int64(3), counts[realomni.KindImageInitramfs].Requests)
	require.Equal(t, int64(1), counts[realomni.KindSchematics].Requests)

	var served int64

	sums := map[realomni.RequestKind]int64{}

	for _, r := range f.RequestLog() {
		sums[r.Kind] += r.Bytes

		if r.Kind == realomni.KindImageKernel && r.Status < 300 {
			served += r.Bytes
		}
	}

	require.Equal(t, int64(len(kernel)+1000), served, "the whole kernel once and one 1000-byte range")

	for kind, c := range counts {
		require.Equal(t, sums[kind], c.Bytes, "%s: the counters add up the log", kind)
	}

	log := f.RequestLog()
	require.NotEmpty(t, log)
	require.Equal(t, realomni.Request{
		Method: http.MethodGet, Path: "/image/" + id + "/v1.11.5/kernel-amd64", Kind: realomni.KindImageKernel,
		Local: addr, Remote: "127.0.0.1", Status: http.StatusOK, Bytes: int64(len(kernel)),
	}, log[1], "the log's first entry is the schematic's creation")
	require.Equal(t, counts, f.RequestsOn(addr), "one listener: all requests came in on it")
	require.Empty(t, f.RequestsOn("127.0.0.1:1"))
}

// TestFactoryServesInstaller pulls a schematic's installer image as a provider does (go-containerregistry's
// remote, what the controller uses): a valid multi-platform index whose digest the factory reports, tagged
// with the Talos version; Omni's tag lists still answer beside it; the registry is read-only.
func TestFactoryServesInstaller(t *testing.T) {
	t.Parallel()

	f, addr, c, id, _, _ := imageFactory(t)
	opt := remote.WithTransport(c.Transport)

	ref, err := name.ParseReference(addr+"/"+realomni.InstallerRepository(id)+":v1.11.5", name.Insecure)
	require.NoError(t, err)

	before := f.Requests()

	idx, err := remote.Index(ref, opt)
	require.NoError(t, err)
	require.NoError(t, validate.Index(idx), "every manifest, config and layer matches its digest")

	got, err := idx.Digest()
	require.NoError(t, err)

	want, err := f.InstallerDigest(id, "1.11.5")
	require.NoError(t, err)
	require.Equal(t, want, got.String())

	mf, err := idx.IndexManifest()
	require.NoError(t, err)
	require.Len(t, mf.Manifests, 2)
	require.Equal(t, "amd64", mf.Manifests[0].Platform.Architecture)

	img, err := remote.Image(ref, opt, remote.WithPlatform(v1.Platform{OS: "linux", Architecture: "amd64"}))
	require.NoError(t, err)

	cfg, err := img.ConfigFile()
	require.NoError(t, err)
	require.Equal(t, "amd64", cfg.Architecture)

	after := f.Requests()
	require.Greater(t, after[realomni.KindRegistryManifest].Requests, before[realomni.KindRegistryManifest].Requests)
	require.Greater(t, after[realomni.KindRegistryBlob].Bytes, before[realomni.KindRegistryBlob].Bytes+200<<10,
		"validating the index read every layer (256 KiB of payload each)")

	// The same inputs give the same image: a second factory serves the same digest.
	other := realomni.NewFactory(realomni.FactoryConfig{TalosVersions: []string{"1.11.5"}})
	otherAddr, otherClient := serveFactory(t, other)
	fc, err := client.New("http://"+otherAddr, client.WithClient(*otherClient))
	require.NoError(t, err)
	_, _, err = fc.SchematicCreate(t.Context(), schematic.Schematic{Customization: schematic.Customization{
		SystemExtensions: schematic.SystemExtensions{OfficialExtensions: []string{"siderolabs/metal-agent"}},
	}})
	require.NoError(t, err)
	again, err := other.InstallerDigest(id, "v1.11.5")
	require.NoError(t, err)
	require.Equal(t, want, again)

	tags, err := remote.List(ref.Context(), opt)
	require.NoError(t, err)
	require.Equal(t, []string{"v1.11.5", "v1.12.8"}, tags)

	omniTags, err := remote.List(mustRepo(t, addr+"/siderolabs/installer"), opt)
	require.NoError(t, err)
	require.Equal(t, []string{"v1.11.5", "v1.12.8"}, omniTags, "Omni's installer tag list beside the images")

	for _, bad := range []string{
		addr + "/" + realomni.InstallerRepository(strings.Repeat("0", 64)) + ":v1.11.5", // unknown schematic
		addr + "/" + realomni.InstallerRepository(id) + ":v1.9.0",                       // unlisted version
	} {
		_, err := remote.Index(mustRef(t, bad), opt)
		require.Error(t, err, bad)
	}

	err = remote.Write(mustRef(t, addr+"/"+realomni.InstallerRepository(id)+":evil"), img, opt)
	require.Error(t, err, "the registry is read-only")

	_, err = f.InstallerDigest(strings.Repeat("0", 64), "1.11.5")
	require.Error(t, err)
	require.Empty(t, f.Unanswered())
}

// TestFactoryInstallerWithSkopeo binds the installer image to the client the lab pulls it with (Debian's
// skopeo): the raw manifest skopeo reads hashes to the digest the factory reports.
func TestFactoryInstallerWithSkopeo(t *testing.T) {
	t.Parallel()

	skopeo, err := exec.LookPath("skopeo")
	if err != nil {
		t.Skip("needs skopeo (Debian's skopeo): not in PATH")
	}

	f, addr, _, id, _, _ := imageFactory(t)

	out, err := exec.CommandContext(t.Context(), skopeo, "inspect", "--raw", "--tls-verify=false",
		"docker://"+addr+"/"+realomni.InstallerRepository(id)+":v1.11.5").Output()
	require.NoError(t, err)

	want, err := f.InstallerDigest(id, "v1.11.5")
	require.NoError(t, err)

	sum := sha256.Sum256(out)
	require.Equal(t, want, "sha256:"+hex.EncodeToString(sum[:]))
}

// TestFactoryFaults: each fault mode, set at run time, spoils image downloads of its kind only, and clearing
// it answers normally again.
func TestFactoryFaults(t *testing.T) {
	t.Parallel()

	f, addr, c, id, kernel, initramfs := imageFactory(t)
	kernelURL := "http://" + addr + "/image/" + id + "/v1.11.5/kernel-amd64"
	initrdURL := "http://" + addr + "/image/" + id + "/v1.11.5/initramfs-amd64.xz"

	for _, tc := range []struct {
		name  string
		fault realomni.Fault
		check func(t *testing.T, code int, body []byte, err error)
	}{
		{name: "not found", fault: realomni.Fault{Mode: realomni.FaultNotFound}, check: func(t *testing.T, code int, _ []byte, err error) {
			require.NoError(t, err)
			require.Equal(t, http.StatusNotFound, code)
		}},
		{name: "server error", fault: realomni.Fault{Mode: realomni.FaultServerError}, check: func(t *testing.T, code int, _ []byte, err error) {
			require.NoError(t, err)
			require.Equal(t, http.StatusInternalServerError, code)
		}},
		{name: "garbage", fault: realomni.Fault{Mode: realomni.FaultGarbage}, check: func(t *testing.T, code int, body []byte, err error) {
			require.NoError(t, err)
			require.Equal(t, http.StatusOK, code)
			require.Len(t, body, len(kernel), "the right length")

			for i := range body {
				if body[i] == kernel[i] {
					require.Failf(t, "garbage", "byte %d is right", i)
				}
			}
		}},
		{name: "slow, cut off", fault: realomni.Fault{Mode: realomni.FaultSlow, Chunk: 1024, Interval: 10 * time.Millisecond, For: 200 * time.Millisecond},
			check: func(t *testing.T, code int, body []byte, err error) {
				require.Error(t, err, "the body is cut short")
				require.Equal(t, http.StatusOK, code)
				require.NotEmpty(t, body, "some of it trickled")
				require.Less(t, len(body), len(kernel))
				require.Equal(t, kernel[:len(body)], body, "what trickled is right")
			}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f.SetFault(realomni.KindImageKernel, tc.fault)

			code, body, _, err := get(t, c, http.MethodGet, kernelURL)
			tc.check(t, code, body, err)

			// Another kind is not touched.
			code, body, _, err = get(t, c, http.MethodGet, initrdURL)
			require.NoError(t, err)
			require.Equal(t, http.StatusOK, code)
			require.Equal(t, initramfs, body)

			f.SetFault(realomni.KindImageKernel, realomni.Fault{})

			code, body, _, err = get(t, c, http.MethodGet, kernelURL)
			require.NoError(t, err)
			require.Equal(t, http.StatusOK, code)
			require.Equal(t, kernel, body)
		})
	}

	require.Equal(t, int64(8), f.Requests()[realomni.KindImageKernel].Requests, "faulty answers are counted too")
}

func mustRef(t *testing.T, s string) name.Reference {
	t.Helper()

	ref, err := name.ParseReference(s, name.Insecure)
	require.NoError(t, err)

	return ref
}

func mustRepo(t *testing.T, s string) name.Repository {
	t.Helper()

	repo, err := name.NewRepository(s, name.Insecure)
	require.NoError(t, err)

	return repo
}

// TestFactoryCountsPerListener: one factory served on two listeners (Omni's and a provider's address) keeps
// one state and counts each listener's requests apart.
func TestFactoryCountsPerListener(t *testing.T) {
	t.Parallel()

	f, first, _, id, kernel, _ := imageFactory(t)
	second, c2 := serveFactory(t, f)

	code, body, _, err := get(t, c2, http.MethodGet, "http://"+second+"/image/"+id+"/v1.11.5/kernel-amd64")
	require.NoError(t, err)
	require.Equal(t, http.StatusOK, code, "the schematic created on the first listener is known on the second")
	require.Equal(t, kernel, body)

	require.Equal(t, map[realomni.RequestKind]realomni.Counter{
		realomni.KindImageKernel: {Requests: 1, Bytes: int64(len(kernel))},
	}, f.RequestsOn(second))
	require.Equal(t, map[realomni.RequestKind]realomni.Counter{
		realomni.KindSchematics: f.Requests()[realomni.KindSchematics],
	}, f.RequestsOn(first))
	require.Equal(t, int64(1), f.Requests()[realomni.KindImageKernel].Requests)
}

// ukiCall is one call of a test's Secure Boot UKI builder.
type ukiCall struct {
	kernelArgs    []string
	version, arch string
}

// ukiBuilder is a Secure Boot UKI builder that notes its calls, fails while fail is set and otherwise returns
// a PE-looking image derived from its inputs.
type ukiBuilder struct {
	mu    sync.Mutex
	calls []ukiCall
	fail  bool
	// release, when set, holds every build until it is closed.
	release chan struct{}
}

func (b *ukiBuilder) build(sc *schematic.Schematic, version, arch string) ([]byte, error) {
	b.mu.Lock()
	b.calls = append(b.calls, ukiCall{kernelArgs: sc.Customization.ExtraKernelArgs, version: version, arch: arch})
	fail, release := b.fail, b.release
	b.mu.Unlock()

	if release != nil {
		<-release
	}

	if fail {
		return nil, errors.New("sbsign: no key")
	}

	return ukiBytes(sc, version, arch), nil
}

func (b *ukiBuilder) set(fail bool, release chan struct{}) {
	b.mu.Lock()
	defer b.mu.Unlock()

	b.fail, b.release = fail, release
}

func (b *ukiBuilder) called() []ukiCall {
	b.mu.Lock()
	defer b.mu.Unlock()

	return slices.Clone(b.calls)
}

// ukiBytes is what the test builder makes: "MZ" and 100 KiB derived from the command line, version and arch.
func ukiBytes(sc *schematic.Schematic, version, arch string) []byte {
	seed := sha256.Sum256([]byte(strings.Join(sc.Customization.ExtraKernelArgs, " ") + "\x00" + version + "\x00" + arch))
	out := make([]byte, 100<<10)
	mrand.NewChaCha8(seed).Read(out) //nolint:errcheck // never fails

	return append([]byte("MZ"), out...)
}

// ukiFactory is imageFactory with a Secure Boot UKI builder and a schematic with kernel arguments, served
// through a handler that counts the requests entering it.
func ukiFactory(t *testing.T) (f *realomni.Factory, b *ukiBuilder, base string, c *http.Client, id string, entered *atomic.Int64) {
	t.Helper()

	f, addr, c, _, _, _ := imageFactory(t)
	b = &ukiBuilder{}
	f.SetSecureBootUKI(b.build)

	fc, err := client.New("http://"+addr, client.WithClient(*c))
	require.NoError(t, err)

	id, _, err = fc.SchematicCreate(t.Context(), schematic.Schematic{Customization: schematic.Customization{
		ExtraKernelArgs:  []string{"console=ttyS0", "talos.platform=metal"},
		SystemExtensions: schematic.SystemExtensions{OfficialExtensions: []string{"siderolabs/metal-agent"}},
	}})
	require.NoError(t, err)

	entered = &atomic.Int64{}
	h := f.Handler()
	addr = serveHandler(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		entered.Add(1)
		h.ServeHTTP(w, r)
	}))

	return f, b, "http://" + addr + "/image/", c, id, entered
}

// serveHandler serves h on loopback until the test ends and returns its address.
func serveHandler(t *testing.T, h http.Handler) string {
	t.Helper()

	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)

	srv := &http.Server{Handler: h, ReadHeaderTimeout: 10 * time.Second}
	done := make(chan error, 1)

	go func() { done <- srv.Serve(ln) }()

	t.Cleanup(func() {
		require.NoError(t, srv.Close())
		require.ErrorIs(t, <-done, http.ErrServerClosed)
	})

	return ln.Addr().String()
}

// TestFactoryServesSecureBootUKI: a schematic's signed UKI is built once from the schematic as created (its
// kernel arguments), served whole, by range and by HEAD, counted as image_uki; anything unknown is 404; a
// failing build is a 500 tried again next time; faults apply.
func TestFactoryServesSecureBootUKI(t *testing.T) {
	t.Parallel()

	f, b, base, c, id, _ := ukiFactory(t)
	url := base + id + "/v1.11.5/metal-amd64-secureboot-uki.efi"
	want := ukiBytes(&schematic.Schematic{Customization: schematic.Customization{
		ExtraKernelArgs: []string{"console=ttyS0", "talos.platform=metal"},
	}}, "v1.11.5", "amd64")

	code, body, hdr, err := get(t, c, http.MethodGet, url)
	require.NoError(t, err)
	require.Equal(t, http.StatusOK, code)
	require.Equal(t, want, body)
	require.Equal(t, "MZ", string(body[:2]))
	require.Equal(t, "bytes", hdr.Get("Accept-Ranges"))
	require.Equal(t, []ukiCall{{
		kernelArgs: []string{"console=ttyS0", "talos.platform=metal"}, version: "v1.11.5", arch: "amd64",
	}}, b.called(), "the builder gets the schematic's kernel arguments and the version with its v")

	code, body, _, err = get(t, c, http.MethodGet, base+id+"/1.11.5/metal-amd64-secureboot-uki.efi")
	require.NoError(t, err)
	require.Equal(t, http.StatusOK, code, "a version without its v is the same version")
	require.Equal(t, want, body)

	code, body, _, err = get(t, c, http.MethodGet, url, "Range", "bytes=0-1")
	require.NoError(t, err)
	require.Equal(t, http.StatusPartialContent, code)
	require.Equal(t, "MZ", string(body))

	code, body, _, err = get(t, c, http.MethodGet, url, "Range", fmt.Sprintf("bytes=%d-", len(want)-100))
	require.NoError(t, err)
	require.Equal(t, http.StatusPartialContent, code)
	require.Equal(t, want[len(want)-100:], body)

	code, body, hdr, err = get(t, c, http.MethodHead, url)
	require.NoError(t, err)
	require.Equal(t, http.StatusOK, code)
	require.Empty(t, body)
	require.Equal(t, fmt.Sprint(len(want)), hdr.Get("Content-Length"))
	require.Len(t, b.called(), 1, "five requests, one build")

	for _, tc := range []struct {
		name, path string
	}{
		{name: "unknown schematic", path: strings.Repeat("0", 64) + "/v1.11.5/metal-amd64-secureboot-uki.efi"},
		{name: "unlisted version", path: id + "/v1.9.0/metal-amd64-secureboot-uki.efi"},
		{name: "no images for the arch", path: id + "/v1.11.5/metal-arm64-secureboot-uki.efi"},
	} {
		code, _, _, err := get(t, c, http.MethodGet, base+tc.path)
		require.NoError(t, err, tc.name)
		require.Equal(t, http.StatusNotFound, code, tc.name)
	}

	require.Len(t, b.called(), 1, "nothing unknown is built")
	require.Empty(t, f.Unanswered())

	// A failed build is a 500, not kept: the next request builds again.
	failURL := base + id + "/v1.12.8/metal-amd64-secureboot-uki.efi"
	b.set(true, nil)

	for range 2 {
		code, _, _, err = get(t, c, http.MethodGet, failURL)
		require.NoError(t, err)
		require.Equal(t, http.StatusInternalServerError, code)
	}

	b.set(false, nil)

	code, body, _, err = get(t, c, http.MethodGet, failURL)
	require.NoError(t, err)
	require.Equal(t, http.StatusOK, code)
	require.Equal(t, "MZ", string(body[:2]))
	require.NotEqual(t, want, body, "another version, another image")
	require.Len(t, b.called(), 4, "two failed builds and one that worked")

	// Faults spoil UKI downloads only.
	f.SetFault(realomni.KindImageUKI, realomni.Fault{Mode: realomni.FaultGarbage})

	code, body, _, err = get(t, c, http.MethodGet, url)
	require.NoError(t, err)
	require.Equal(t, http.StatusOK, code)
	require.Len(t, body, len(want))
	require.Equal(t, []byte{^byte('M'), ^byte('Z')}, body[:2])

	f.SetFault(realomni.KindImageUKI, realomni.Fault{Mode: realomni.FaultNotFound})

	code, _, _, err = get(t, c, http.MethodGet, url)
	require.NoError(t, err)
	require.Equal(t, http.StatusNotFound, code)

	code, _, _, err = get(t, c, http.MethodGet, base+id+"/v1.11.5/kernel-amd64")
	require.NoError(t, err)
	require.Equal(t, http.StatusOK, code, "the kernel is not touched")

	f.SetFault(realomni.KindImageUKI, realomni.Fault{})

	code, body, _, err = get(t, c, http.MethodGet, url)
	require.NoError(t, err)
	require.Equal(t, http.StatusOK, code)
	require.Equal(t, want, body)
	require.Len(t, b.called(), 4)

	counts := f.Requests()
	require.Equal(t, int64(14), counts[realomni.KindImageUKI].Requests)
	require.Equal(t, int64(1), counts[realomni.KindImageKernel].Requests)

	var sent, served int64

	for _, r := range f.RequestLog() {
		if r.Kind != realomni.KindImageUKI {
			continue
		}

		sent += r.Bytes

		if r.Path == "/image/"+id+"/v1.11.5/metal-amd64-secureboot-uki.efi" && r.Status < 300 {
			served += r.Bytes
		}
	}

	require.Equal(t, counts[realomni.KindImageUKI].Bytes, sent, "the counter adds up the log")
	require.Equal(t, int64(3*len(want)+2+100), served, "three whole UKIs (one garbled), two ranges and a HEAD")
}

// TestFactoryBuildsSecureBootUKIOnce: concurrent first requests for a UKI wait for one build.
func TestFactoryBuildsSecureBootUKIOnce(t *testing.T) {
	t.Parallel()

	f, b, base, c, id, entered := ukiFactory(t)
	url := base + id + "/v1.11.5/metal-amd64-secureboot-uki.efi"

	release := make(chan struct{})
	b.set(false, release)

	const n = 8

	type result struct {
		code int
		body []byte
		err  error
	}

	results := make(chan result, n)

	for range n {
		go func() {
			req, err := http.NewRequestWithContext(t.Context(), http.MethodGet, url, nil)
			if err != nil {
				results <- result{err: err}

				return
			}

			resp, err := c.Do(req)
			if err != nil {
				results <- result{err: err}

				return
			}

			body, err := io.ReadAll(resp.Body)
			resp.Body.Close() //nolint:errcheck
			results <- result{code: resp.StatusCode, body: body, err: err}
		}()
	}

	// Every request is in the factory's handler while the first build is held.
	require.Eventually(t, func() bool { return entered.Load() == n }, 10*time.Second, 5*time.Millisecond)
	close(release)

	var first []byte

	for range n {
		r := <-results
		require.NoError(t, r.err)
		require.Equal(t, http.StatusOK, r.code)
		require.Equal(t, "MZ", string(r.body[:2]))

		if first == nil {
			first = r.body
		}

		require.Equal(t, first, r.body)
	}

	require.Len(t, b.called(), 1, "%d concurrent requests, one build", n)
	require.Equal(t, int64(n), f.Requests()[realomni.KindImageUKI].Requests)
}

// TestFactoryWithoutSecureBootUKI: a factory without a UKI builder has no UKI for anyone.
func TestFactoryWithoutSecureBootUKI(t *testing.T) {
	t.Parallel()

	f, addr, c, id, _, _ := imageFactory(t)
	path := "/image/" + id + "/v1.11.5/metal-amd64-secureboot-uki.efi"

	code, _, _, err := get(t, c, http.MethodGet, "http://"+addr+path)
	require.NoError(t, err)
	require.Equal(t, http.StatusNotFound, code)
	require.Equal(t, []string{"GET " + path}, f.Unanswered())
	require.Equal(t, int64(1), f.Requests()[realomni.KindImageUKI].Requests)
}

// TestFactoryServesSecureBootInstaller pulls a schematic's Secure Boot installer as a provider does: a valid
// index with a digest of its own, tagged with the Talos versions, beside the plain installer.
func TestFactoryServesSecureBootInstaller(t *testing.T) {
	t.Parallel()

	f, addr, c, id, _, _ := imageFactory(t)
	opt := remote.WithTransport(c.Transport)
	ref := mustRef(t, addr+"/"+realomni.SecureBootInstallerRepository(id)+":v1.11.5")
	require.Equal(t, "installer-secureboot/"+id, realomni.SecureBootInstallerRepository(id))

	idx, err := remote.Index(ref, opt)
	require.NoError(t, err)
	require.NoError(t, validate.Index(idx), "every manifest, config and layer matches its digest")

	got, err := idx.Digest()
	require.NoError(t, err)

	want, err := f.SecureBootInstallerDigest(id, "1.11.5")
	require.NoError(t, err)
	require.Equal(t, want, got.String())

	plain, err := f.InstallerDigest(id, "1.11.5")
	require.NoError(t, err)
	require.NotEqual(t, plain, want, "the Secure Boot installer is another image")

	plainIdx, err := remote.Index(mustRef(t, addr+"/"+realomni.InstallerRepository(id)+":v1.11.5"), opt)
	require.NoError(t, err)
	plainDigest, err := plainIdx.Digest()
	require.NoError(t, err)
	require.Equal(t, plain, plainDigest.String())

	img, err := remote.Image(ref, opt, remote.WithPlatform(v1.Platform{OS: "linux", Architecture: "arm64"}))
	require.NoError(t, err)
	cfg, err := img.ConfigFile()
	require.NoError(t, err)
	require.Equal(t, "arm64", cfg.Architecture)

	tags, err := remote.List(ref.Context(), opt)
	require.NoError(t, err)
	require.Equal(t, []string{"v1.11.5", "v1.12.8"}, tags)

	for _, bad := range []string{
		addr + "/" + realomni.SecureBootInstallerRepository(strings.Repeat("0", 64)) + ":v1.11.5", // unknown schematic
		addr + "/" + realomni.SecureBootInstallerRepository(id) + ":v1.9.0",                       // unlisted version
	} {
		_, err := remote.Index(mustRef(t, bad), opt)
		require.Error(t, err, bad)
	}

	_, err = f.SecureBootInstallerDigest(id, "1.9.0")
	require.Error(t, err)
	require.Empty(t, f.Unanswered())
}
