package app_test

import (
	"bytes"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/outpost-metal/outpost/controller/admincli"
	"github.com/outpost-metal/outpost/shared/assetbundle"
)

// stagingFactory is an image factory that creates one schematic and serves a kernel and an initramfs.
type stagingFactory struct {
	images atomic.Int32
}

const stagedSchematic = "376567988ad370138ad8b2698212367b8edcb69b5fd68c80be1f2ec7d603b4ba"

func (f *stagingFactory) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	switch {
	case r.Method == http.MethodPost && r.URL.Path == "/schematics":
		w.Header().Set("Content-Type", "application/json")
		json.NewEncoder(w).Encode(map[string]string{"id": stagedSchematic, "schematic": "customization: {}\n"}) //nolint:errcheck
	case strings.HasPrefix(r.URL.Path, "/image/"+stagedSchematic+"/v1.11.5/"):
		f.images.Add(1)

		magic := "MZ" // a kernel's PE header, an initramfs' xz header
		if strings.Contains(r.URL.Path, "initramfs") {
			magic = "\xfd7zXZ\x00"
		}

		_, _ = w.Write([]byte(magic + " image " + r.URL.Path)) //nolint:errcheck
	default:
		http.NotFound(w, r)
	}
}

// Staging through the admin socket: a profile named by extensions is resolved to its schematic and stored
// with the site; the controller fetches its kernel and initramfs once and names them to the site (which has
// no edge here, so they stay missing there); a passthrough site and a bad version are refused with reasons.
func TestStageAssetsThroughTheAdminSocket(t *testing.T) {
	factory := &stagingFactory{}
	srv := httptest.NewServer(factory)
	t.Cleanup(srv.Close)

	cfg := testConfig(t)
	cfg.ImageFactoryURL = srv.URL

	ctx, admin := runWithAdmin(t, cfg)

	for _, s := range []string{"far", "near"} {
		require.NoError(t, admin.CreateSite(ctx, s, "", admincli.TokenOptions{TTL: time.Hour}, io.Discard, io.Discard))
	}

	require.NoError(t, admin.SetAssetPolicy(ctx, "far", "offline"))
	require.NoError(t, admin.SetAssetPolicy(ctx, "near", "passthrough"))

	profile := admincli.Profile{Site: "far", Extensions: []string{"siderolabs/iscsi-tools"}, TalosVersion: "1.11.5", Arch: "amd64"}

	var out bytes.Buffer
	require.NoError(t, admin.StageAssets(ctx, profile, false, time.Second, &out))
	require.Equal(t, "staged v1.11.5/"+stagedSchematic+"/amd64 at far\n", out.String())

	// the controller fetches the files once and asks the site to hold them
	require.Eventually(t, func() bool {
		out.Reset()
		require.NoError(t, admin.ListAssets(ctx, "far", &out))

		return strings.Count(out.String(), "\nmissing ") == 2 && strings.Contains(out.String(), "\nupstream  image:")
	}, 10*time.Second, 20*time.Millisecond)
	require.Regexp(t, `missing\s+talos/v1\.11\.5/`+stagedSchematic+`/amd64/kernel\s+[0-9a-f]{12}\s+101\s+true`, out.String())
	require.Regexp(t, `missing\s+talos/v1\.11\.5/`+stagedSchematic+`/amd64/initramfs\.xz\s+[0-9a-f]{12}\s+111\s+true`, out.String())
	require.EqualValues(t, 2, factory.images.Load())

	// the installer image is asked for too: the fake factory has no registry, so it is listed with the failure
	require.Regexp(t, `upstream\s+image:127\.0\.0\.1:\d+/installer/`+stagedSchematic+`:v1\.11\.5@amd64\s+controller: pull`, out.String())

	// a bundle for the site holds what the controller holds of it, made by this controller
	bundleDir := filepath.Join(t.TempDir(), "bundle")
	out.Reset()
	require.NoError(t, admin.BundleAssets(ctx, "far", bundleDir, &out))
	require.Contains(t, out.String(), "wrote 2 assets")
	require.Contains(t, out.String(), "not in the bundle (the controller does not hold it yet): image:")

	data, err := os.ReadFile(filepath.Join(bundleDir, assetbundle.ManifestName))
	require.NoError(t, err)

	m, err := assetbundle.Parse(data)
	require.NoError(t, err)
	require.Regexp(t, `^[0-9a-f]{64}$`, m.Controller)
	require.Contains(t, out.String(), "CA sha256:"+m.Controller)
	require.Len(t, m.Assets, 2)
	require.Equal(t, "talos/v1.11.5/"+stagedSchematic+"/amd64/initramfs.xz", m.Assets[0].Name)

	require.ErrorContains(t, admin.BundleAssets(ctx, "far", bundleDir, io.Discard), "already holds a bundle")

	// staging it again changes nothing; unstaging takes it back
	require.NoError(t, admin.StageAssets(ctx, profile, false, time.Second, io.Discard))
	out.Reset()
	require.NoError(t, admin.UnstageAssets(ctx, profile, &out))
	require.Contains(t, out.String(), "staged there now: 0")

	require.Eventually(t, func() bool {
		out.Reset()
		require.NoError(t, admin.ListAssets(ctx, "far", &out))

		return !strings.Contains(out.String(), "\nmissing ")
	}, 10*time.Second, 20*time.Millisecond)

	// refusals say why
	err = admin.StageAssets(ctx, admincli.Profile{Site: "near", SchematicID: stagedSchematic, TalosVersion: "1.11.5"}, false, time.Second, io.Discard)
	require.ErrorContains(t, err, "passthrough")

	err = admin.StageAssets(ctx, admincli.Profile{Site: "far", SchematicID: stagedSchematic, TalosVersion: "1.11"}, false, time.Second, io.Discard)
	require.ErrorContains(t, err, "want major.minor.patch")

	err = admin.StageAssets(ctx, admincli.Profile{Site: "far", SchematicID: "../x", TalosVersion: "1.11.5"}, false, time.Second, io.Discard)
	require.ErrorContains(t, err, "schematic")

	err = admin.StageAssets(ctx, admincli.Profile{Site: "nowhere", SchematicID: stagedSchematic, TalosVersion: "1.11.5"}, false, time.Second, io.Discard)
	require.Error(t, err)
}
