package registry_test

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"testing"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/partial"
	"github.com/google/go-containerregistry/pkg/v1/types"
	"github.com/stretchr/testify/require"

	"github.com/outpost-metal/outpost/edge/assetcache"
	"github.com/outpost-metal/outpost/shared/ocinames"
)

// skopeo runs Debian's skopeo, a registry client this project did not write, with no configuration of the
// host (policy, registries.conf, credentials), or skips the test when it is not installed.
func skopeo(t *testing.T) func(t *testing.T, args ...string) []byte {
	t.Helper()

	bin, err := exec.LookPath("skopeo")
	if err != nil {
		t.Skip("needs skopeo (Debian's skopeo, hack/deps.sh): not in PATH")
	}

	home := t.TempDir()
	conf := filepath.Join(home, "registries.conf")
	require.NoError(t, os.WriteFile(conf, nil, 0o644))

	return func(t *testing.T, args ...string) []byte {
		t.Helper()

		cmd := exec.CommandContext(t.Context(), bin, append([]string{"--insecure-policy"}, args...)...)
		cmd.Env = append(os.Environ(), "HOME="+home, "TMPDIR="+home, "XDG_RUNTIME_DIR="+home,
			"CONTAINERS_REGISTRIES_CONF="+conf, "REGISTRY_AUTH_FILE="+filepath.Join(home, "auth.json"))

		out, err := cmd.Output()

		var (
			stderr []byte
			ee     *exec.ExitError
		)

		if errors.As(err, &ee) {
			stderr = ee.Stderr
		}

		require.NoError(t, err, "skopeo %v: %s", args, stderr)

		return out
	}
}

// ociLayoutDigest returns the digest of the one manifest an OCI image layout's index.json names.
func ociLayoutDigest(t *testing.T, dir string) string {
	t.Helper()

	data, err := os.ReadFile(filepath.Join(dir, "index.json"))
	require.NoError(t, err)

	var idx struct {
		Manifests []struct {
			Digest string `json:"digest"`
		} `json:"manifests"`
	}

	require.NoError(t, json.Unmarshal(data, &idx))
	require.Len(t, idx.Manifests, 1)

	return idx.Manifests[0].Digest
}

// putPlainIndex caches under repo an OCI index of two OCI images, its descriptors without the OCI 1.1 field
// artifactType, which go-containerregistry writes and skopeo 1.9 does not know: skopeo drops it when it
// re-encodes the index, and then refuses to copy it with the digest preserved. It returns the index's digest.
func putPlainIndex(t *testing.T, s *assetcache.Store, repo, tag string) string {
	t.Helper()

	im := v1.IndexManifest{SchemaVersion: 2, MediaType: types.OCIImageIndex}

	for _, arch := range []string{"amd64", "arm64"} {
		img := ociImage(t, arch)
		putImage(t, s, repo, "", img)

		desc, err := partial.Descriptor(img)
		require.NoError(t, err)

		desc.ArtifactType = ""
		desc.Platform = &v1.Platform{OS: "linux", Architecture: arch}
		im.Manifests = append(im.Manifests, *desc)
	}

	raw, err := json.Marshal(im)
	require.NoError(t, err)
	put(t, s, ocinames.BlobName(repo, sha256Hex(raw)), raw)

	return "sha256:" + put(t, s, ocinames.ManifestName(repo, tag), raw)
}

// TestSkopeo: skopeo inspects and copies an image and an index from the registry, and what it reads and
// writes has the digests the cache holds.
func TestSkopeo(t *testing.T) {
	t.Parallel()

	run := skopeo(t)
	e := newEnv(t)

	img := ociImage(t, "amd64")
	putImage(t, e.store, "installer/"+hexA, "v1.9.0", img)

	idxDigest := putPlainIndex(t, e.store, "siderolabs/installer", "v1.9.0")

	imgRef := "docker://" + e.host + "/installer/" + hexA + ":v1.9.0"
	idxRef := "docker://" + e.host + "/siderolabs/installer:v1.9.0"

	t.Run("inspect", func(t *testing.T) {
		var got struct {
			Digest   string   `json:"Digest"`
			RepoTags []string `json:"RepoTags"`
			Layers   []string `json:"Layers"`
		}

		require.NoError(t, json.Unmarshal(run(t, "inspect", "--tls-verify=false", imgRef), &got))
		require.Equal(t, digestOf(t, img), got.Digest)
		require.Equal(t, []string{"v1.9.0"}, got.RepoTags, "read through tags/list")
		require.Len(t, got.Layers, 2)
	})

	t.Run("inspect raw index", func(t *testing.T) {
		raw := run(t, "inspect", "--raw", "--tls-verify=false", idxRef)
		sum := sha256.Sum256(raw)
		require.Equal(t, idxDigest, "sha256:"+hex.EncodeToString(sum[:]))
	})

	t.Run("copy image", func(t *testing.T) {
		dir := t.TempDir()
		run(t, "copy", "--src-tls-verify=false", "--preserve-digests", imgRef, "oci:"+dir+":v1.9.0")
		require.Equal(t, digestOf(t, img), ociLayoutDigest(t, dir))
	})

	t.Run("copy index", func(t *testing.T) {
		dir := t.TempDir()
		run(t, "copy", "--all", "--src-tls-verify=false", "--preserve-digests", idxRef, "oci:"+dir+":v1.9.0")
		require.Equal(t, idxDigest, ociLayoutDigest(t, dir))
	})
}
