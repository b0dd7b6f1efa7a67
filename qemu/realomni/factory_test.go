package realomni_test

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
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
