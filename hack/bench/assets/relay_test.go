package assetsbench_test

import (
	"context"
	"net"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.uber.org/zap/zaptest"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	ctlassets "github.com/outpost-metal/outpost/controller/assets"
	"github.com/outpost-metal/outpost/edge/assetcache"
	assetsapi "github.com/outpost-metal/outpost/shared/api/assets"
	"github.com/outpost-metal/outpost/shared/metal"
)

// offsetRecorder records the offsets edges ask the relay for.
type offsetRecorder struct {
	mu      sync.Mutex
	offsets []int64
}

func (o *offsetRecorder) intercept(srv any, ss grpc.ServerStream, info *grpc.StreamServerInfo, handler grpc.StreamHandler) error {
	return handler(srv, &recordingStream{ServerStream: ss, o: o})
}

type recordingStream struct {
	grpc.ServerStream

	o *offsetRecorder
}

func (r *recordingStream) RecvMsg(m any) error {
	err := r.ServerStream.RecvMsg(m)
	if req, ok := m.(*assetsapi.FetchRequest); ok && err == nil {
		r.o.mu.Lock()
		r.o.offsets = append(r.o.offsets, req.GetOffset())
		r.o.mu.Unlock()
	}

	return err
}

// TestRelayResumesAfterCut relays an asset from the controller's relay to an edge cache over a real gRPC
// connection on loopback, cuts the TCP connection mid-asset, and checks that the edge resumes from the
// offset it had reached and ends with a verified asset.
func TestRelayResumesAfterCut(t *testing.T) {
	t.Parallel()

	const size = 8 << 20

	ctlDir := t.TempDir()
	digest := writeRandomFile(t, ctlDir, size)

	catalog := ctlassets.NewCatalog(assetsapi.Policy_POLICY_OFFLINE, nil)
	relay, err := ctlassets.NewRelay(ctlassets.DefaultRelay(), ctlassets.DirFiles{Dir: ctlDir}, catalog,
		func(context.Context) (string, bool) { return "site-a", true }, zaptest.NewLogger(t))
	require.NoError(t, err)

	rec := &offsetRecorder{}
	srv := grpc.NewServer(grpc.StreamInterceptor(rec.intercept))
	relay.Register(srv)

	inner, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)

	ln := &cutListener{Listener: inner, cutAfter: 3 << 20}

	go srv.Serve(ln) //nolint:errcheck

	t.Cleanup(srv.Stop)

	conn, err := grpc.NewClient("passthrough:///"+inner.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	require.NoError(t, err)

	t.Cleanup(func() { conn.Close() }) //nolint:errcheck

	cfg := assetcache.Default()
	cfg.Dir = t.TempDir()
	cfg.RetryBackoff = 50 * time.Millisecond

	store, err := assetcache.New(cfg, zaptest.NewLogger(t), nil)
	require.NoError(t, err)

	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()

	ref := assetcache.Ref{Name: assetcache.AgentName(metal.AMD64, "initramfs.xz"), SHA256: digest, Size: size}
	require.NoError(t, store.Put(ctx, ref, assetcache.RelaySource{Client: assetsapi.NewAssetRelayClient(conn)}))

	require.Equal(t, int32(1), ln.cuts.Load(), "the connection was never cut")
	require.NoError(t, store.Check(digest, true))

	rec.mu.Lock()
	offsets := append([]int64(nil), rec.offsets...)
	rec.mu.Unlock()

	require.GreaterOrEqual(t, len(offsets), 2, "no resumed stream")
	require.Zero(t, offsets[0])
	require.Greater(t, offsets[len(offsets)-1], int64(0), "resumed from the start instead of the offset reached")

	st := catalog.Site("site-a")
	require.Equal(t, int64(1), st.Relays)
	require.GreaterOrEqual(t, st.BytesRelayed, int64(size))
	t.Logf("relay stream offsets: %v; bytes relayed %d for a %d-byte asset", offsets, st.BytesRelayed, size)
}
