package realomni_test

import (
	"context"
	"encoding/json"
	"net"
	"net/http"
	"testing"

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
