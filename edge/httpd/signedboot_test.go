package httpd_test

import (
	"net"
	"net/http"
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/outpost-metal/outpost/edge/boot"
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
