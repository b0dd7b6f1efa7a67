package assets_test

import (
	"bytes"
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"io"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"
	"go.uber.org/zap/zaptest"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"

	"github.com/outpost-metal/outpost/controller/assets"
	assetsapi "github.com/outpost-metal/outpost/shared/api/assets"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

func siteA(context.Context) (string, bool) { return "site-a", true }

func startRelay(t *testing.T, dir string, catalog *assets.Catalog) assetsapi.AssetRelayClient {
	t.Helper()

	cfg := assets.DefaultRelay()
	cfg.ChunkSize = 4096

	relay, err := assets.NewRelay(cfg, assets.DirFiles{Dir: dir}, catalog, siteA, zaptest.NewLogger(t))
	require.NoError(t, err)

	srv := grpc.NewServer()
	relay.Register(srv)

	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)

	go srv.Serve(ln) //nolint:errcheck

	conn, err := grpc.NewClient("passthrough:///"+ln.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	require.NoError(t, err)

	t.Cleanup(func() {
		conn.Close() //nolint:errcheck
		srv.Stop()
	})

	return assetsapi.NewAssetRelayClient(conn)
}

func TestRelayFetch(t *testing.T) {
	t.Parallel()

	dir := t.TempDir()
	data := make([]byte, 10000)
	_, _ = rand.Read(data)
	sum := sha256.Sum256(data)
	digest := hex.EncodeToString(sum[:])
	require.NoError(t, os.WriteFile(filepath.Join(dir, digest), data, 0o644))

	metrics := assets.NewMetrics()
	catalog := assets.NewCatalog(assetsapi.Policy_POLICY_CACHE, nil).CountInto(metrics)
	client := startRelay(t, dir, catalog)

	tests := []struct {
		name   string
		req    *assetsapi.FetchRequest
		want   []byte
		status codes.Code
	}{
		{name: "whole", req: &assetsapi.FetchRequest{Sha256: digest}, want: data},
		{name: "resume", req: &assetsapi.FetchRequest{Sha256: digest, Offset: 6000}, want: data[6000:]},
		{name: "at end", req: &assetsapi.FetchRequest{Sha256: digest, Offset: 10000}, want: nil},
		{name: "past end", req: &assetsapi.FetchRequest{Sha256: digest, Offset: 10001}, status: codes.OutOfRange},
		{name: "unknown", req: &assetsapi.FetchRequest{Sha256: hex.EncodeToString(make([]byte, 32))}, status: codes.NotFound},
		{name: "traversal", req: &assetsapi.FetchRequest{Sha256: "../../etc/passwd"}, status: codes.InvalidArgument},
	}

	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			stream, err := client.Fetch(t.Context(), tt.req)
			require.NoError(t, err)

			var got []byte

			off := tt.req.GetOffset()

			for {
				c, err := stream.Recv()
				if errors.Is(err, io.EOF) {
					break
				}

				if tt.status != codes.OK {
					require.Equal(t, tt.status, status.Code(err), "%v", err)

					return
				}

				require.NoError(t, err)
				require.Equal(t, off, c.GetOffset())
				require.Equal(t, int64(len(data)), c.GetSize())
				off += int64(len(c.GetData()))
				got = append(got, c.GetData()...)
			}

			require.Equal(t, tt.status, codes.OK)
			require.Equal(t, tt.want, got)
		})
	}

	st := catalog.Site("site-a")
	require.Equal(t, int64(10000+4000), st.BytesRelayed)
	require.Equal(t, `outpost_asset_relayed_bytes_total{site="site-a"} 14000
outpost_asset_relays_total{site="site-a"} 3
outpost_install_asset_fetched_bytes_total 0
`, gathered(t, metrics), "relayed, nothing fetched upstream")
	require.Equal(t, int64(3), st.Relays)
}

func TestCatalogSiteState(t *testing.T) {
	t.Parallel()

	dir := t.TempDir()
	catalog := assets.NewCatalog(assetsapi.Policy_POLICY_CACHE, nil)
	client := startRelay(t, dir, catalog)

	have := &assetsapi.AssetRef{Name: "agent/amd64/kernel", Sha256: hex.EncodeToString(make([]byte, 32)), Size: 1}
	lack := &assetsapi.AssetRef{Name: "agent/amd64/initramfs", Sha256: "ff" + hex.EncodeToString(make([]byte, 31)), Size: 2}

	require.NoError(t, catalog.SetPolicy("site-a", assetsapi.Policy_POLICY_OFFLINE))
	catalog.SetNeeded("site-a", []*assetsapi.AssetRef{have, lack})

	_, err := client.Report(t.Context(), &assetsapi.AssetReport{
		BytesUsed: 1, BytesCap: 100, Policy: assetsapi.Policy_POLICY_OFFLINE,
		Assets: []*assetsapi.AssetStatus{
			{Ref: have, State: assetsapi.AssetState_ASSET_STATE_PRESENT, Needed: true},
			{Ref: lack, State: assetsapi.AssetState_ASSET_STATE_MISSING},
		},
	})
	require.NoError(t, err)

	st := catalog.Site("site-a")
	require.Equal(t, "offline", assets.PolicyName(st.Policy))
	require.Len(t, st.Cached, 1)
	require.Equal(t, have.GetSha256(), st.Cached[0].GetRef().GetSha256())
	require.Len(t, st.Missing, 1)
	require.Equal(t, lack.GetName(), st.Missing[0].GetName())
	require.Equal(t, int64(100), st.BytesCap)
	require.Equal(t, []string{"site-a"}, catalog.Sites())

	_, err = assets.ParsePolicy("sometimes")
	require.Error(t, err)

	var out strings.Builder

	require.NoError(t, assets.WriteSiteAssets(&out, st.Proto()))
	require.Contains(t, out.String(), "asset policy:  offline")
	require.Contains(t, out.String(), "missing  agent/amd64/initramfs")
	require.Contains(t, out.String(), "cached   agent/amd64/kernel")
}

func TestSiteAssetsSayWhenTheEdgeCacheIsTooSmall(t *testing.T) {
	t.Parallel()

	st := &assetsapi.SiteAssetState{
		SiteId: "small", Policy: assetsapi.Policy_POLICY_OFFLINE, BytesCap: 1000,
		Cached:  []*assetsapi.AssetStatus{{Ref: &assetsapi.AssetRef{Name: "a", Size: 600}, Needed: true}, {Ref: &assetsapi.AssetRef{Name: "b", Size: 900}}},
		Missing: []*assetsapi.AssetRef{{Name: "c", Size: 500}},
	}

	require.EqualValues(t, 1100, assets.NeededBytes(st), "what a plan needs of what is held, and what is missing")

	var out bytes.Buffer
	require.NoError(t, assets.WriteSiteAssets(&out, st))
	require.Contains(t, out.String(), "the site needs 1100 bytes, its edge's cache holds at most 1000")

	st.BytesCap = 2000
	out.Reset()
	require.NoError(t, assets.WriteSiteAssets(&out, st))
	require.NotContains(t, out.String(), "too small")
}
