package ocinames_test

import (
	"regexp"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/outpost-metal/outpost/shared/assetbundle"
	"github.com/outpost-metal/outpost/shared/ocinames"
)

const hex = "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef"

func TestNames(t *testing.T) {
	t.Parallel()

	require.Equal(t, "oci/siderolabs/installer/manifests/v1.9.0", ocinames.ManifestName("siderolabs/installer", "v1.9.0"))
	require.Equal(t, "oci/installer/abc/blobs/"+hex, ocinames.BlobName("installer/abc", hex))

	tag, ok := ocinames.TagOf("siderolabs/installer", "oci/siderolabs/installer/manifests/v1.9.0")
	require.True(t, ok)
	require.Equal(t, "v1.9.0", tag)

	for _, name := range []string{
		"oci/siderolabs/installer/blobs/" + hex,
		"oci/siderolabs/installer/manifests/a/manifests/b", // another repository's tag
		"oci/siderolabs/installer/manifests/",
		"oci/siderolabs/installerx/manifests/v1",
		"agent/amd64/kernel",
	} {
		_, ok := ocinames.TagOf("siderolabs/installer", name)
		require.False(t, ok, name)
	}
}

// The edge cache's grammar of logical names (edge/assetcache.ValidateName; shared/ may not import the edge, so
// edge/registry checks the same against the real function).
var segmentRe = regexp.MustCompile(`^[A-Za-z0-9_][A-Za-z0-9._+-]*$`)

func validAssetName(name string) bool {
	if name == "" || len(name) > ocinames.MaxNameLen {
		return false
	}

	for seg := range strings.SplitSeq(name, "/") {
		if !segmentRe.MatchString(seg) {
			return false
		}
	}

	return true
}

func TestLongestNamesFit(t *testing.T) {
	t.Parallel()

	repo := strings.Repeat("a/", ocinames.MaxRepositoryLen/2) + "a"
	require.Len(t, repo, ocinames.MaxRepositoryLen)
	require.NoError(t, ocinames.ValidateRepository(repo))

	tag := strings.Repeat("T", ocinames.MaxTagLen)
	require.NoError(t, ocinames.ValidateTag(tag))

	require.True(t, validAssetName(ocinames.ManifestName(repo, tag)))
	require.True(t, validAssetName(ocinames.BlobName(repo, hex)))
	require.Len(t, ocinames.ManifestName(repo, tag), ocinames.MaxNameLen)
}

func TestValidateRepository(t *testing.T) {
	t.Parallel()

	for _, tc := range []struct {
		name, repo string
		ok         bool
	}{
		{name: "plain", repo: "siderolabs/installer", ok: true},
		{name: "schematic", repo: "installer/" + hex, ok: true},
		{name: "separators", repo: "a.b_c__d---e/f", ok: true},
		{name: "single", repo: "a", ok: true},
		{name: "longest", repo: strings.Repeat("a", ocinames.MaxRepositoryLen), ok: true},
		{name: "too long", repo: strings.Repeat("a", ocinames.MaxRepositoryLen+1)},
		{name: "empty", repo: ""},
		{name: "upper case", repo: "Siderolabs/installer"},
		{name: "dot dot", repo: "a/../b"},
		{name: "dot", repo: "a/./b"},
		{name: "leading slash", repo: "/a"},
		{name: "trailing slash", repo: "a/"},
		{name: "double slash", repo: "a//b"},
		{name: "triple underscore", repo: "a___b"},
		{name: "leading separator", repo: "-a"},
		{name: "trailing separator", repo: "a-"},
		{name: "plus", repo: "a+b"},
		{name: "colon", repo: "a:b"},
		{name: "backslash", repo: `a\b`},
		{name: "percent", repo: "a%2fb"},
		{name: "space", repo: "a b"},
		{name: "nul", repo: "a\x00b"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()

			err := ocinames.ValidateRepository(tc.repo)
			if tc.ok {
				require.NoError(t, err)
				require.True(t, validAssetName(ocinames.BlobName(tc.repo, hex)))
			} else {
				require.ErrorIs(t, err, ocinames.ErrBadRepository)
			}
		})
	}
}

func TestValidateTag(t *testing.T) {
	t.Parallel()

	for _, tc := range []struct {
		name, tag string
		ok        bool
	}{
		{name: "version", tag: "v1.9.0", ok: true},
		{name: "latest", tag: "latest", ok: true},
		{name: "underscore first", tag: "_x", ok: true},
		{name: "longest", tag: strings.Repeat("x", ocinames.MaxTagLen), ok: true},
		{name: "too long", tag: strings.Repeat("x", ocinames.MaxTagLen+1)},
		{name: "empty", tag: ""},
		{name: "dot first", tag: ".x"},
		{name: "dot dot", tag: ".."},
		{name: "dash first", tag: "-x"},
		{name: "slash", tag: "a/b"},
		{name: "plus", tag: "v1+build"},
		{name: "digest", tag: "sha256:" + hex},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()

			err := ocinames.ValidateTag(tc.tag)
			if tc.ok {
				require.NoError(t, err)
			} else {
				require.ErrorIs(t, err, ocinames.ErrBadTag)
			}
		})
	}
}

func TestParseDigest(t *testing.T) {
	t.Parallel()

	for _, tc := range []struct {
		name, digest string
		ok           bool
	}{
		{name: "sha256", digest: "sha256:" + hex, ok: true},
		{name: "upper case", digest: "sha256:" + strings.ToUpper(hex)},
		{name: "short", digest: "sha256:" + hex[1:]},
		{name: "long", digest: "sha256:" + hex + "0"},
		{name: "not hex", digest: "sha256:" + hex[1:] + "g"},
		{name: "sha512", digest: "sha512:" + hex + hex},
		{name: "no algorithm", digest: hex},
		{name: "upper algorithm", digest: "SHA256:" + hex},
		{name: "empty", digest: ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()

			got, err := ocinames.ParseDigest(tc.digest)
			if tc.ok {
				require.NoError(t, err)
				require.Equal(t, hex, got)
			} else {
				require.ErrorIs(t, err, ocinames.ErrBadDigest)
			}
		})
	}
}

// FuzzNames: repositories, tags and digests come from a registry's answers and from registry clients at a
// site. Whatever passes validation builds names the edge's cache accepts, at most MaxNameLen long, and a
// manifest name gives its tag back; nothing panics on any input.
func FuzzNames(f *testing.F) {
	f.Add("siderolabs/installer", "v1.11.5", "sha256:"+hex)
	f.Add("installer/376567988ad370138ad8b2698212367b8edcb69b5fd68c80be1f2ec7d603b4ba", "latest", "sha512:00")
	f.Add("a__b--c/d.e", "-bad", "sha256:ABC")

	f.Fuzz(func(t *testing.T, repo, tag, digest string) {
		repoErr, tagErr := ocinames.ValidateRepository(repo), ocinames.ValidateTag(tag)

		digestHex, digestErr := ocinames.ParseDigest(digest)
		if digestErr == nil {
			require.NoError(t, ocinames.ValidateHex(digestHex))
			require.Equal(t, "sha256:"+digestHex, digest)
		}

		if repoErr != nil {
			return
		}

		if tagErr == nil {
			name := ocinames.ManifestName(repo, tag)
			require.LessOrEqual(t, len(name), ocinames.MaxNameLen)
			require.NoError(t, assetbundle.ValidateName(name), "manifest name %q", name)

			got, ok := ocinames.TagOf(repo, name)
			require.True(t, ok)
			require.Equal(t, tag, got)
		}

		if digestErr == nil {
			name := ocinames.BlobName(repo, digestHex)
			require.LessOrEqual(t, len(name), ocinames.MaxNameLen)
			require.NoError(t, assetbundle.ValidateName(name), "blob name %q", name)

			_, ok := ocinames.TagOf(repo, name)
			require.False(t, ok, "a blob name read as a tag")
		}
	})
}
