package registry_test

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"testing"

	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/random"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	"github.com/google/go-containerregistry/pkg/v1/types"
	"github.com/google/go-containerregistry/pkg/v1/validate"
	"github.com/stretchr/testify/require"
	"go.uber.org/zap/zaptest"

	"github.com/outpost-metal/outpost/edge/assetcache"
	"github.com/outpost-metal/outpost/edge/registry"
	"github.com/outpost-metal/outpost/shared/ocinames"
)

// bytesSource hands the cache one asset's bytes.
type bytesSource struct{ data []byte }

func (b bytesSource) Name() string { return "test" }

func (b bytesSource) Open(_ context.Context, _ assetcache.Ref, offset int64) (io.ReadCloser, error) {
	return io.NopCloser(bytes.NewReader(b.data[offset:])), nil
}

func newStore(t *testing.T) *assetcache.Store {
	t.Helper()

	s, err := assetcache.New(assetcache.Config{Dir: t.TempDir(), MaxBytes: 1 << 30, Attempts: 1}, zaptest.NewLogger(t), nil)
	require.NoError(t, err)

	return s
}

// put caches data under a logical name and returns its hex digest.
func put(t *testing.T, s *assetcache.Store, name string, data []byte) string {
	t.Helper()

	sum := sha256.Sum256(data)
	digest := hex.EncodeToString(sum[:])
	require.NoError(t, s.Put(t.Context(), assetcache.Ref{Name: name, SHA256: digest, Size: int64(len(data))}, bytesSource{data: data}))

	return digest
}

// putImage caches an image under repo as the controller relays it: its manifest by tag (when tag is set) and
// by digest, its config and its layers by digest.
func putImage(t *testing.T, s *assetcache.Store, repo, tag string, img v1.Image) {
	t.Helper()

	raw, err := img.RawManifest()
	require.NoError(t, err)

	digest := put(t, s, ocinames.BlobName(repo, sha256Hex(raw)), raw)
	if tag != "" {
		put(t, s, ocinames.ManifestName(repo, tag), raw)
	}

	cfg, err := img.RawConfigFile()
	require.NoError(t, err)
	put(t, s, ocinames.BlobName(repo, sha256Hex(cfg)), cfg)

	layers, err := img.Layers()
	require.NoError(t, err)

	for _, l := range layers {
		rc, err := l.Compressed()
		require.NoError(t, err)

		data, err := io.ReadAll(rc)
		require.NoError(t, err)
		require.NoError(t, rc.Close())
		put(t, s, ocinames.BlobName(repo, sha256Hex(data)), data)
	}

	d, err := img.Digest()
	require.NoError(t, err)
	require.Equal(t, d.Hex, digest)
}

// putIndex caches an index under repo by tag and digest, and every image it lists.
func putIndex(t *testing.T, s *assetcache.Store, repo, tag string, idx v1.ImageIndex) {
	t.Helper()

	raw, err := idx.RawManifest()
	require.NoError(t, err)
	put(t, s, ocinames.ManifestName(repo, tag), raw)
	put(t, s, ocinames.BlobName(repo, sha256Hex(raw)), raw)

	im, err := idx.IndexManifest()
	require.NoError(t, err)

	for _, desc := range im.Manifests {
		img, err := idx.Image(desc.Digest)
		require.NoError(t, err)
		putImage(t, s, repo, "", img)
	}
}

func sha256Hex(data []byte) string {
	sum := sha256.Sum256(data)

	return hex.EncodeToString(sum[:])
}

// ociImage is a random linux image for arch in OCI formats throughout (manifest, config and layers).
func ociImage(t *testing.T, arch string) v1.Image {
	t.Helper()

	img, err := mutate.ConfigFile(empty.Image, &v1.ConfigFile{OS: "linux", Architecture: arch, RootFS: v1.RootFS{Type: "layers"}})
	require.NoError(t, err)

	img = mutate.ConfigMediaType(mutate.MediaType(img, types.OCIManifestSchema1), types.OCIConfigJSON)

	for range 2 {
		l, err := random.Layer(2048, types.OCILayer)
		require.NoError(t, err)

		img, err = mutate.AppendLayers(img, l)
		require.NoError(t, err)
	}

	return img
}

// ociIndex is an OCI index of two OCI images.
func ociIndex(t *testing.T) v1.ImageIndex {
	t.Helper()

	idx := mutate.IndexMediaType(empty.Index, types.OCIImageIndex)
	for _, arch := range []string{"amd64", "arm64"} {
		idx = mutate.AppendManifests(idx, mutate.IndexAddendum{
			Add:        ociImage(t, arch),
			Descriptor: v1.Descriptor{Platform: &v1.Platform{OS: "linux", Architecture: arch}},
		})
	}

	return idx
}

type env struct {
	store *assetcache.Store
	reg   *registry.Handler
	ts    *httptest.Server
	host  string // 127.0.0.1:port
}

func newEnv(t *testing.T) *env {
	t.Helper()

	s := newStore(t)
	reg := registry.New(s, zaptest.NewLogger(t))
	ts := httptest.NewServer(reg)
	t.Cleanup(ts.Close)

	return &env{store: s, reg: reg, ts: ts, host: strings.TrimPrefix(ts.URL, "http://")}
}

func (e *env) ref(t *testing.T, s string) name.Reference {
	t.Helper()

	ref, err := name.ParseReference(e.host+"/"+s, name.Insecure)
	require.NoError(t, err)

	return ref
}

func (e *env) do(t *testing.T, method, path string, hdr map[string]string) (*http.Response, []byte) {
	t.Helper()

	req, err := http.NewRequestWithContext(t.Context(), method, e.ts.URL+path, nil)
	require.NoError(t, err)

	for k, v := range hdr {
		req.Header.Set(k, v)
	}

	resp, err := e.ts.Client().Do(req)
	require.NoError(t, err)

	defer resp.Body.Close() //nolint:errcheck

	body, err := io.ReadAll(resp.Body)
	require.NoError(t, err)

	return resp, body
}

// errorCode returns the code of the spec's error body, checking its shape.
func errorCode(t *testing.T, resp *http.Response, body []byte) string {
	t.Helper()

	require.Equal(t, "application/json", resp.Header.Get("Content-Type"))

	var e struct {
		Errors []struct {
			Code    string `json:"code"`
			Message string `json:"message"`
		} `json:"errors"`
	}

	require.NoError(t, json.Unmarshal(body, &e), string(body))
	require.Len(t, e.Errors, 1)
	require.NotEmpty(t, e.Errors[0].Message)

	return e.Errors[0].Code
}

func TestPullThroughRegistry(t *testing.T) {
	t.Parallel()

	e := newEnv(t)

	dockerImg, err := random.Image(4096, 3) // Docker schema 2
	require.NoError(t, err)
	putImage(t, e.store, "siderolabs/installer", "v1.9.0", dockerImg)

	ociImg := ociImage(t, "amd64")
	putImage(t, e.store, "installer/"+hexA, "v1.9.0", ociImg)

	idx, err := random.Index(1024, 2, 2) // OCI index of Docker images
	require.NoError(t, err)
	putIndex(t, e.store, "multi/arch", "latest", idx)

	for _, tc := range []struct {
		name, ref string
		img       v1.Image
	}{
		{name: "docker by tag", ref: "siderolabs/installer:v1.9.0", img: dockerImg},
		{name: "oci by tag", ref: "installer/" + hexA + ":v1.9.0", img: ociImg},
		{name: "oci by digest", ref: "installer/" + hexA + "@" + digestOf(t, ociImg), img: ociImg},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()

			got, err := remote.Image(e.ref(t, tc.ref), remote.WithContext(t.Context()))
			require.NoError(t, err)
			require.Equal(t, digestOf(t, tc.img), digestOf(t, got))
			require.NoError(t, validate.Image(got)) // every blob fetched and checked against its digest
		})
	}

	ociIdx := ociIndex(t)
	putIndex(t, e.store, "multi/oci", "latest", ociIdx)

	for _, tc := range []struct {
		name, ref string
		idx       v1.ImageIndex
	}{
		{name: "index of docker images", ref: "multi/arch:latest", idx: idx},
		{name: "oci index", ref: "multi/oci:latest", idx: ociIdx},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()

			got, err := remote.Index(e.ref(t, tc.ref), remote.WithContext(t.Context()))
			require.NoError(t, err)

			want, err := tc.idx.Digest()
			require.NoError(t, err)

			gotDigest, err := got.Digest()
			require.NoError(t, err)
			require.Equal(t, want, gotDigest)
			require.NoError(t, validate.Index(got)) // every child manifest and blob fetched by digest and checked
		})
	}

	t.Run("head", func(t *testing.T) {
		t.Parallel()

		desc, err := remote.Head(e.ref(t, "siderolabs/installer:v1.9.0"), remote.WithContext(t.Context()))
		require.NoError(t, err)
		require.Equal(t, digestOf(t, dockerImg), desc.Digest.String())
		require.Equal(t, types.DockerManifestSchema2, desc.MediaType)
	})

	t.Run("tags", func(t *testing.T) {
		t.Parallel()

		tags, err := remote.List(e.ref(t, "siderolabs/installer:v1.9.0").Context(), remote.WithContext(t.Context()))
		require.NoError(t, err)
		require.Equal(t, []string{"v1.9.0"}, tags)
	})
}

func digestOf(t *testing.T, img v1.Image) string {
	t.Helper()

	d, err := img.Digest()
	require.NoError(t, err)

	return d.String()
}

func TestManifestAndBlobHeaders(t *testing.T) {
	t.Parallel()

	e := newEnv(t)
	img := ociImage(t, "amd64")
	putImage(t, e.store, "a/b", "v1", img)

	raw, err := img.RawManifest()
	require.NoError(t, err)

	digest := digestOf(t, img)
	etag := `"` + digest + `"`

	layers, err := img.Layers()
	require.NoError(t, err)

	layerDigest, err := layers[0].Digest()
	require.NoError(t, err)

	rc, err := layers[0].Compressed()
	require.NoError(t, err)

	layer, err := io.ReadAll(rc)
	require.NoError(t, err)
	require.NoError(t, rc.Close())

	resp, body := e.do(t, http.MethodGet, "/v2/", nil)
	require.Equal(t, http.StatusOK, resp.StatusCode)
	require.Equal(t, "registry/2.0", resp.Header.Get("Docker-Distribution-API-Version"))
	require.JSONEq(t, "{}", string(body))

	for _, method := range []string{http.MethodGet, http.MethodHead} {
		for _, path := range []string{"/v2/a/b/manifests/v1", "/v2/a/b/manifests/" + digest, "/v2/a/b/manifests/v1?ns=upstream.invalid"} {
			resp, body := e.do(t, method, path, map[string]string{"Accept": "application/vnd.docker.distribution.manifest.v2+json, application/vnd.oci.image.manifest.v1+json;q=0.9"})
			require.Equal(t, http.StatusOK, resp.StatusCode, "%s %s", method, path)
			require.Equal(t, string(types.OCIManifestSchema1), resp.Header.Get("Content-Type"))
			require.Equal(t, digest, resp.Header.Get("Docker-Content-Digest"))
			require.Equal(t, etag, resp.Header.Get("ETag"))
			require.Equal(t, "registry/2.0", resp.Header.Get("Docker-Distribution-API-Version"))
			require.EqualValues(t, len(raw), resp.ContentLength)

			if method == http.MethodGet {
				require.Equal(t, raw, body)
			} else {
				require.Empty(t, body)
			}
		}
	}

	resp, _ = e.do(t, http.MethodGet, "/v2/a/b/manifests/v1", map[string]string{"If-None-Match": etag})
	require.Equal(t, http.StatusNotModified, resp.StatusCode)

	blobPath := "/v2/a/b/blobs/" + layerDigest.String()

	resp, body = e.do(t, http.MethodGet, blobPath, nil)
	require.Equal(t, http.StatusOK, resp.StatusCode)
	require.Equal(t, layer, body)
	require.Equal(t, "application/octet-stream", resp.Header.Get("Content-Type"))
	require.Equal(t, layerDigest.String(), resp.Header.Get("Docker-Content-Digest"))

	resp, body = e.do(t, http.MethodHead, blobPath, nil)
	require.Equal(t, http.StatusOK, resp.StatusCode)
	require.Empty(t, body)
	require.EqualValues(t, len(layer), resp.ContentLength)
	require.Equal(t, layerDigest.String(), resp.Header.Get("Docker-Content-Digest"))

	resp, body = e.do(t, http.MethodGet, blobPath, map[string]string{"Range": "bytes=10-99"})
	require.Equal(t, http.StatusPartialContent, resp.StatusCode)
	require.Equal(t, layer[10:100], body)
	require.Equal(t, "bytes 10-99/"+strconv.Itoa(len(layer)), resp.Header.Get("Content-Range"))

	resp, _ = e.do(t, http.MethodGet, blobPath, map[string]string{"Range": "bytes=1000000-"})
	require.Equal(t, http.StatusRequestedRangeNotSatisfiable, resp.StatusCode)

	resp, _ = e.do(t, http.MethodGet, blobPath, map[string]string{"If-None-Match": `"` + layerDigest.String() + `"`})
	require.Equal(t, http.StatusNotModified, resp.StatusCode)

	require.Equal(t, 5.0, e.reg.Requests("blob", "served")) // 200, HEAD, 206, 416, 304
	require.Equal(t, 7.0, e.reg.Requests("manifest", "served"))
}

func TestRefusals(t *testing.T) {
	t.Parallel()

	e := newEnv(t)
	img := ociImage(t, "amd64")
	putImage(t, e.store, "a/b", "v1", img)
	putImage(t, e.store, "other", "v1", ociImage(t, "amd64"))

	layers, err := img.Layers()
	require.NoError(t, err)

	layerDigest, err := layers[0].Digest()
	require.NoError(t, err)

	// A machine's kernel, held by the cache under its own name only.
	kernel := put(t, e.store, "agent/amd64/kernel", bytes.Repeat([]byte("k"), 4096))
	// A blob name pointing at content of another digest (a broken or hostile relay).
	require.NoError(t, e.store.Link(assetcache.Ref{Name: ocinames.BlobName("a/b", hexA), SHA256: kernel, Size: 4096}))
	// Content too large for a manifest, and a manifest tag on a layer.
	put(t, e.store, ocinames.ManifestName("a/b", "huge"), bytes.Repeat([]byte(" "), registry.MaxManifestBytes+1))
	put(t, e.store, ocinames.ManifestName("a/b", "layer"), []byte("not json"))
	put(t, e.store, ocinames.ManifestName("a/b", "schema1"), []byte(`{"schemaVersion":1,"name":"a/b","tag":"schema1"}`))

	digest := digestOf(t, img)
	ociOnly := map[string]string{"Accept": "application/vnd.docker.distribution.manifest.v2+json"}

	for _, tc := range []struct {
		name, method, path string
		header             map[string]string
		status             int
		code               string
	}{
		{name: "put manifest", method: http.MethodPut, path: "/v2/a/b/manifests/v1", status: 405, code: "UNSUPPORTED"},
		{name: "delete manifest", method: http.MethodDelete, path: "/v2/a/b/manifests/" + digest, status: 405, code: "UNSUPPORTED"},
		{name: "start upload", method: http.MethodPost, path: "/v2/a/b/blobs/uploads/", status: 405, code: "UNSUPPORTED"},
		{name: "patch upload", method: http.MethodPatch, path: "/v2/a/b/blobs/uploads/123", status: 405, code: "UNSUPPORTED"},
		{name: "delete blob", method: http.MethodDelete, path: "/v2/a/b/blobs/" + layerDigest.String(), status: 405, code: "UNSUPPORTED"},
		{name: "post base", method: http.MethodPost, path: "/v2/", status: 405, code: "UNSUPPORTED"},
		{name: "catalog", method: http.MethodGet, path: "/v2/_catalog", status: 404, code: "UNSUPPORTED"},
		{name: "upload status", method: http.MethodGet, path: "/v2/a/b/blobs/uploads/123", status: 404, code: "UNSUPPORTED"},
		{name: "unknown endpoint", method: http.MethodGet, path: "/v2/a/b/referrers/" + digest, status: 404, code: "UNSUPPORTED"},
		{name: "unknown tag", method: http.MethodGet, path: "/v2/a/b/manifests/v2", status: 404, code: "MANIFEST_UNKNOWN"},
		{name: "unknown repository", method: http.MethodGet, path: "/v2/c/manifests/v1", status: 404, code: "MANIFEST_UNKNOWN"},
		{name: "unknown digest", method: http.MethodGet, path: "/v2/a/b/blobs/sha256:" + strings.Repeat("0", 64), status: 404, code: "BLOB_UNKNOWN"},
		{name: "another repository's blob", method: http.MethodGet, path: "/v2/other/blobs/" + layerDigest.String(), status: 404, code: "BLOB_UNKNOWN"},
		{name: "another repository's manifest", method: http.MethodGet, path: "/v2/other/manifests/" + digest, status: 404, code: "MANIFEST_UNKNOWN"},
		{name: "kernel by digest", method: http.MethodGet, path: "/v2/a/b/blobs/sha256:" + kernel, status: 404, code: "BLOB_UNKNOWN"},
		{name: "kernel as manifest", method: http.MethodGet, path: "/v2/a/b/manifests/sha256:" + kernel, status: 404, code: "MANIFEST_UNKNOWN"},
		{name: "name at another digest", method: http.MethodGet, path: "/v2/a/b/blobs/sha256:" + hexA, status: 404, code: "BLOB_UNKNOWN"},
		{name: "layer as manifest", method: http.MethodGet, path: "/v2/a/b/manifests/" + layerDigest.String(), status: 404, code: "MANIFEST_UNKNOWN"},
		{name: "too large", method: http.MethodGet, path: "/v2/a/b/manifests/huge", status: 404, code: "MANIFEST_UNKNOWN"},
		{name: "not json", method: http.MethodGet, path: "/v2/a/b/manifests/layer", status: 404, code: "MANIFEST_UNKNOWN"},
		{name: "schema 1", method: http.MethodGet, path: "/v2/a/b/manifests/schema1", status: 404, code: "MANIFEST_UNKNOWN"},
		{name: "not accepted", method: http.MethodGet, path: "/v2/a/b/manifests/v1", header: ociOnly, status: 404, code: "MANIFEST_UNKNOWN"},
		{name: "dot dot", method: http.MethodGet, path: "/v2/a/../a/b/manifests/v1", status: 400, code: "NAME_INVALID"},
		{name: "dot dot to the store", method: http.MethodGet, path: "/v2/../../manifest.json/manifests/v1", status: 400, code: "NAME_INVALID"},
		{name: "encoded slash", method: http.MethodGet, path: "/v2/a%2Fb/manifests/v1", status: 400, code: "NAME_INVALID"},
		{name: "encoded dot dot", method: http.MethodGet, path: "/v2/a/%2E%2E/b/manifests/v1", status: 400, code: "NAME_INVALID"},
		{name: "overlong", method: http.MethodGet, path: "/v2/" + strings.Repeat("a/", 300) + "manifests/v1", status: 400, code: "NAME_INVALID"},
		{name: "upper case repository", method: http.MethodGet, path: "/v2/A/B/manifests/v1", status: 400, code: "NAME_INVALID"},
		{name: "bad tag", method: http.MethodGet, path: "/v2/a/b/manifests/-v1", status: 400, code: "MANIFEST_UNKNOWN"},
		{name: "sha512", method: http.MethodGet, path: "/v2/a/b/blobs/sha512:" + hexA + hexA, status: 400, code: "DIGEST_INVALID"},
		{name: "upper-case hex", method: http.MethodGet, path: "/v2/a/b/blobs/sha256:" + strings.ToUpper(hexA), status: 400, code: "DIGEST_INVALID"},
		{name: "short digest", method: http.MethodGet, path: "/v2/a/b/manifests/sha256:abc", status: 400, code: "DIGEST_INVALID"},
		{name: "blob by tag", method: http.MethodGet, path: "/v2/a/b/blobs/v1", status: 400, code: "DIGEST_INVALID"},
		{name: "tags of unknown repository", method: http.MethodGet, path: "/v2/c/tags/list", status: 404, code: "NAME_UNKNOWN"},
		{name: "tags bad n", method: http.MethodGet, path: "/v2/a/b/tags/list?n=-1", status: 400, code: "UNSUPPORTED"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()

			resp, body := e.do(t, tc.method, tc.path, tc.header)
			require.Equal(t, tc.status, resp.StatusCode, string(body))
			require.Equal(t, tc.code, errorCode(t, resp, body))
			require.Empty(t, resp.Header.Get("Docker-Content-Digest"))

			if tc.status == http.StatusMethodNotAllowed {
				require.Equal(t, "GET, HEAD", resp.Header.Get("Allow"))
			}
		})
	}
}

func TestTagsList(t *testing.T) {
	t.Parallel()

	e := newEnv(t)
	img := ociImage(t, "amd64")

	for _, tag := range []string{"v1", "v2", "v3", "latest"} {
		putImage(t, e.store, "a/b", tag, img)
	}

	putImage(t, e.store, "a/b/c", "other", img) // a repository below is not listed with a/b

	list := func(query string) ([]string, string) {
		resp, body := e.do(t, http.MethodGet, "/v2/a/b/tags/list"+query, nil)
		require.Equal(t, http.StatusOK, resp.StatusCode, string(body))

		var got struct {
			Name string   `json:"name"`
			Tags []string `json:"tags"`
		}

		require.NoError(t, json.Unmarshal(body, &got))
		require.Equal(t, "a/b", got.Name)

		return got.Tags, resp.Header.Get("Link")
	}

	tags, link := list("")
	require.Equal(t, []string{"latest", "v1", "v2", "v3"}, tags)
	require.Empty(t, link)

	tags, link = list("?n=2")
	require.Equal(t, []string{"latest", "v1"}, tags)
	require.Equal(t, `</v2/a/b/tags/list?last=v1&n=2>; rel="next"`, link)

	tags, link = list("?n=2&last=v1")
	require.Equal(t, []string{"v2", "v3"}, tags)
	require.Empty(t, link)

	tags, _ = list("?n=0")
	require.Empty(t, tags)
	require.NotNil(t, tags)
}

// TestManifestByDigestOfATag: a manifest the cache holds under a tag only is served by its digest in that
// repository (containerd resolves the tag, then fetches by digest), and in no other.
func TestManifestByDigestOfATag(t *testing.T) {
	t.Parallel()

	e := newEnv(t)
	putImage(t, e.store, "other", "v1", ociImage(t, "amd64"))

	img := ociImage(t, "amd64")
	raw, err := img.RawManifest()
	require.NoError(t, err)
	put(t, e.store, ocinames.ManifestName("a/b", "v1"), raw) // no blob name for the manifest itself

	digest := digestOf(t, img)

	resp, body := e.do(t, http.MethodGet, "/v2/a/b/manifests/"+digest, nil)
	require.Equal(t, http.StatusOK, resp.StatusCode, string(body))
	require.Equal(t, raw, body)
	require.Equal(t, digest, resp.Header.Get("Docker-Content-Digest"))

	for _, path := range []string{"/v2/other/manifests/" + digest, "/v2/a/b/blobs/" + digest, "/v2/a/manifests/" + digest} {
		resp, body = e.do(t, http.MethodGet, path, nil)
		require.Equal(t, http.StatusNotFound, resp.StatusCode, path)
		require.Contains(t, []string{"MANIFEST_UNKNOWN", "BLOB_UNKNOWN"}, errorCode(t, resp, body))
	}

	// A client that resolves the tag and then fetches by digest.
	desc, err := remote.Head(e.ref(t, "a/b:v1"), remote.WithContext(t.Context()))
	require.NoError(t, err)

	got, err := remote.Get(e.ref(t, "a/b@"+desc.Digest.String()), remote.WithContext(t.Context()))
	require.NoError(t, err)
	require.Equal(t, raw, got.Manifest)
}
