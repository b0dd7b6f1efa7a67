package registry_test

import (
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/outpost-metal/outpost/edge/assetcache"
	"github.com/outpost-metal/outpost/edge/registry"
	"github.com/outpost-metal/outpost/shared/ocinames"
)

const hexA = "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef"

func TestParsePath(t *testing.T) {
	t.Parallel()

	longRepo := strings.Repeat("a/", ocinames.MaxRepositoryLen/2) + "a"
	longTag := strings.Repeat("T", ocinames.MaxTagLen)

	for _, tc := range []struct {
		name, path string
		want       registry.Target
		ok         bool
	}{
		{name: "base", path: "/v2/", want: registry.Target{Route: "base"}, ok: true},
		{name: "manifest by tag", path: "/v2/siderolabs/installer/manifests/v1.9.0", want: registry.Target{Route: "manifest", Repo: "siderolabs/installer", Tag: "v1.9.0"}, ok: true},
		{name: "manifest by digest", path: "/v2/installer/" + hexA + "/manifests/sha256:" + hexA, want: registry.Target{Route: "manifest", Repo: "installer/" + hexA, Hex: hexA}, ok: true},
		{name: "blob", path: "/v2/a/blobs/sha256:" + hexA, want: registry.Target{Route: "blob", Repo: "a", Hex: hexA}, ok: true},
		{name: "tags", path: "/v2/a/b/tags/list", want: registry.Target{Route: "tags", Repo: "a/b"}, ok: true},
		{name: "repository named like endpoints", path: "/v2/blobs/manifests/tags/manifests/x", want: registry.Target{Route: "manifest", Repo: "blobs/manifests/tags", Tag: "x"}, ok: true},
		{name: "longest", path: "/v2/" + longRepo + "/manifests/" + longTag, want: registry.Target{Route: "manifest", Repo: longRepo, Tag: longTag}, ok: true},
		{name: "no prefix", path: "/v1/a/manifests/x"},
		{name: "no v2 slash", path: "/v2"},
		{name: "only repository", path: "/v2/a"},
		{name: "no reference", path: "/v2/a/manifests/"},
		{name: "no repository", path: "/v2/manifests/x"},
		{name: "unknown endpoint", path: "/v2/a/things/x"},
		{name: "tags not list", path: "/v2/a/tags/all"},
		{name: "catalog", path: "/v2/_catalog"},
		{name: "upload", path: "/v2/a/blobs/uploads/"},
		{name: "upload session", path: "/v2/a/blobs/uploads/0f0f"},
		{name: "dot dot repository", path: "/v2/a/../b/manifests/x"},
		{name: "dot dot only", path: "/v2/../manifests/x"},
		{name: "dot dot tag", path: "/v2/a/manifests/.."},
		{name: "encoded slash", path: "/v2/a%2Fb/manifests/x"},
		{name: "encoded dot dot", path: "/v2/a/%2e%2e/manifests/x"},
		{name: "encoded colon", path: "/v2/a/blobs/sha256%3A" + hexA},
		{name: "double slash", path: "/v2/a//b/manifests/x"},
		{name: "upper case repository", path: "/v2/A/manifests/x"},
		{name: "backslash", path: `/v2/a\b/manifests/x`},
		{name: "space", path: "/v2/a b/manifests/x"},
		{name: "nul", path: "/v2/a\x00/manifests/x"},
		{name: "non-ascii", path: "/v2/ä/manifests/x"},
		{name: "overlong", path: "/v2/" + strings.Repeat("a", 600) + "/manifests/x"},
		{name: "repository too long", path: "/v2/" + strings.Repeat("a", ocinames.MaxRepositoryLen+1) + "/manifests/x"},
		{name: "tag too long", path: "/v2/a/manifests/" + longTag + "x"},
		{name: "sha512", path: "/v2/a/blobs/sha512:" + hexA + hexA},
		{name: "upper-case digest", path: "/v2/a/blobs/sha256:" + strings.ToUpper(hexA)},
		{name: "short digest", path: "/v2/a/blobs/sha256:abc"},
		{name: "blob by tag", path: "/v2/a/blobs/latest"},
		{name: "manifest odd digest", path: "/v2/a/manifests/sha256:" + hexA + ":x"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()

			got, err := registry.ParsePath(tc.path)
			if !tc.ok {
				require.Error(t, err)

				return
			}

			require.NoError(t, err)
			require.Equal(t, tc.want, got)
		})
	}
}

// FuzzParsePath checks that whatever the parser accepts names a valid logical name of the edge's cache, within
// the repository's own names, and nothing else.
func FuzzParsePath(f *testing.F) {
	for _, p := range []string{
		"/v2/", "/v2/siderolabs/installer/manifests/v1.9.0", "/v2/a/blobs/sha256:" + hexA, "/v2/a/tags/list",
		"/v2/a/manifests/sha256:" + hexA, "/v2/a/../b/manifests/x", "/v2/a%2Fb/manifests/x", "/v2/a//b/blobs/x",
	} {
		f.Add(p)
	}

	f.Fuzz(func(t *testing.T, path string) {
		got, err := registry.ParsePath(path)
		if err != nil {
			return
		}

		require.True(t, strings.HasPrefix(path, registry.Prefix))
		require.NotContains(t, path, "%")

		for seg := range strings.SplitSeq(path, "/") {
			require.NotContains(t, []string{".", ".."}, seg)
		}

		if got.Route == "base" {
			require.Equal(t, registry.Prefix, path)

			return
		}

		require.NoError(t, ocinames.ValidateRepository(got.Repo))

		var name string

		switch {
		case got.Tag != "":
			require.Equal(t, "manifest", got.Route)
			require.Empty(t, got.Hex)
			name = ocinames.ManifestName(got.Repo, got.Tag)
		case got.Hex != "":
			require.Contains(t, []string{"manifest", "blob"}, got.Route)
			name = ocinames.BlobName(got.Repo, got.Hex)
		default:
			require.Equal(t, "tags", got.Route)

			return
		}

		require.NoError(t, assetcache.ValidateName(name))
		require.True(t, strings.HasPrefix(name, ocinames.Prefix+got.Repo+"/"))
	})
}

// TestNamesFitTheCache binds the naming contract to the cache's own check: the longest repository with the
// longest tag, and with a digest, are valid logical names.
func TestNamesFitTheCache(t *testing.T) {
	t.Parallel()

	repo := strings.Repeat("a/", ocinames.MaxRepositoryLen/2) + "a"
	require.NoError(t, assetcache.ValidateName(ocinames.ManifestName(repo, strings.Repeat("_", ocinames.MaxTagLen))))
	require.NoError(t, assetcache.ValidateName(ocinames.BlobName(repo, hexA)))
}
