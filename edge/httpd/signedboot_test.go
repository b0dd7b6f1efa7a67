package httpd_test

import (
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/require"
	"go.uber.org/zap"

	"github.com/outpost-metal/outpost/edge/assetcache"
	"github.com/outpost-metal/outpost/edge/boot"
	"github.com/outpost-metal/outpost/edge/bootfiles"
	"github.com/outpost-metal/outpost/edge/httpd"
	bootpb "github.com/outpost-metal/outpost/shared/api/boot"
)

// A machine that enforces Secure Boot runs no boot script: the fetch of its own signed image, named for it by
// its DHCP answer (boot.SignedBootQuery), is its boot's evidence, reported as its boot served in its plan's
// mode. The same image fetched without the query, or named for a machine whose plan gives it another image,
// or by a query that does not parse, is served but is no evidence.
func TestSignedImageFetchIsBootEvidence(t *testing.T) {
	t.Parallel()

	e := newEnv(t)

	const (
		image    = "talos/v1.11.5/abc/amd64/secureboot-uki.efi"
		sbUUID   = "11111111-2222-3333-4444-000000000010"
		siteUUID = "11111111-2222-3333-4444-000000000011"
	)

	mac, _ := net.ParseMAC("52:54:00:00:00:10")

	require.NoError(t, os.MkdirAll(filepath.Join(e.assets, filepath.Dir(image)), 0o755))
	require.NoError(t, os.WriteFile(filepath.Join(e.assets, image), []byte("MZ signed"), 0o644))

	_, err := e.tbl.Apply(&bootpb.ApplyRequest{Change: &bootpb.ApplyRequest_Delta{Delta: &bootpb.Delta{
		BaseVersion: 3, Version: 4,
		Upsert: []*bootpb.Plan{{
			Uuid: sbUUID, Macs: []string{mac.String()}, Mode: bootpb.Mode_MODE_INSTALL, SecureBoot: bootpb.SecureBoot_SECURE_BOOT_ON,
			Install: &bootpb.Kernel{Installer: "factory.invalid/installer-secureboot/abc:v1.11.5"}, SignedImage: &bootpb.SignedImage{Url: "/assets/" + image},
		}},
	}}})
	require.NoError(t, err)

	fetch := func(query string) {
		t.Helper()

		resp, body := get(t, e.ts.URL+"/assets/"+image+query, nil)
		require.Equal(t, http.StatusOK, resp.StatusCode)
		require.Equal(t, "MZ signed", body)
	}

	fetch("")
	fetch("?uuid=" + siteUUID + "&mac=52:54:00:00:00:11") // no plan naming this image, no site image
	fetch("?uuid=not-a-uuid&mac=" + mac.String())
	fetch("?uuid=" + sbUUID + "&mac=zz")
	require.Empty(t, e.obs.modes(sbUUID), "no evidence yet")

	fetch(boot.SignedBootQuery(sbUUID, mac))
	require.Equal(t, []string{string(httpd.ModeInstall)}, e.obs.modes(sbUUID))

	e.obs.mu.Lock()
	served := e.obs.served[len(e.obs.served)-1]
	e.obs.mu.Unlock()

	require.Equal(t, image, served.SignedImage)
	require.Equal(t, mac.String(), served.MAC.String())
	require.True(t, served.Remote.IsLoopback(), "where it asked from: the address its agent's tunnel is bound to")
	require.EqualValues(t, 4, served.TableVersion)
}

// FuzzSignedBootQuery: any path and query under /assets/ (what any host on the site network may send) is
// evidence of a boot only for the one machine whose plan names that image, asked for by its UUID (with the MAC
// it was asked with: two MACs asking for one UUID make it contested, as for boot scripts); nothing panics.
func FuzzSignedBootQuery(f *testing.F) {
	const (
		image  = "talos/v1.11.5/abc/amd64/secureboot-uki.efi"
		sbUUID = "11111111-2222-3333-4444-000000000010"
	)

	mac, _ := net.ParseMAC("52:54:00:00:00:10")

	f.Add(image, boot.SignedBootQuery(sbUUID, mac)[1:])
	f.Add(image, "uuid="+sbUUID+"&mac=52:54:00:00:00:11")
	f.Add("../"+image, "uuid="+strings.ToUpper(sbUUID)+"&mac="+mac.String()+"&uuid=x")
	f.Add(image, "uuid=%zz&mac=%00")

	// Built with silent loggers: a fuzz target may not log through f.
	dir := f.TempDir()
	tbl, err := boot.Open(boot.Config{StateDir: filepath.Join(dir, "table")}, zap.NewNop())
	require.NoError(f, err)

	_, err = tbl.Apply(&bootpb.ApplyRequest{Change: &bootpb.ApplyRequest_Snapshot{Snapshot: &bootpb.Table{
		Version: 1,
		Plans: []*bootpb.Plan{{
			Uuid: sbUUID, Macs: []string{mac.String()}, Mode: bootpb.Mode_MODE_AGENT, SignedImage: &bootpb.SignedImage{Url: "/assets/" + image},
		}},
	}}})
	require.NoError(f, err)

	files := filepath.Join(dir, "files")
	require.NoError(f, os.MkdirAll(filepath.Join(files, filepath.Dir(image)), 0o755))
	require.NoError(f, os.WriteFile(filepath.Join(files, image), []byte("MZ signed"), 0o644))

	store, err := assetcache.New(assetcache.Config{Dir: filepath.Join(dir, "cache"), MaxBytes: 1 << 20, Attempts: 1}, zap.NewNop(), nil)
	require.NoError(f, err)

	assets, err := assetcache.NewHandler(store, files)
	require.NoError(f, err)
	f.Cleanup(func() { assets.Close() }) //nolint:errcheck

	obs := &recorder{}
	reg := prometheus.NewRegistry()
	srv, err := httpd.New(httpd.Default(), zap.NewNop(), httpd.Deps{
		Table: tbl, Catalog: bootfiles.NewCatalog(nil), Observer: obs, Registerer: reg, Gatherer: reg, Assets: assets,
	})
	require.NoError(f, err)
	f.Cleanup(func() { srv.Close() }) //nolint:errcheck

	h := srv.Handler()

	f.Fuzz(func(t *testing.T, path, query string) {
		req, err := http.NewRequest(http.MethodGet, "http://edge/", nil)
		require.NoError(t, err)

		req.URL.Path, req.URL.RawQuery, req.RemoteAddr = "/assets/"+path, query, "10.0.0.9:1234"

		obs.mu.Lock()
		before := len(obs.served)
		obs.mu.Unlock()

		h.ServeHTTP(httptest.NewRecorder(), req)

		obs.mu.Lock()
		served := append([]httpd.BootServed(nil), obs.served[before:]...)
		obs.mu.Unlock()

		for _, b := range served {
			require.Equal(t, sbUUID, b.UUID.String(), "evidence for another machine: path %q query %q", path, query)
			require.Equal(t, image, b.SignedImage)
			require.Len(t, b.MAC, 6)
		}
	})
}
