package admincli_test

import (
	"bytes"
	"context"
	"net"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"google.golang.org/grpc"

	"github.com/outpost-metal/outpost/controller/admincli"
	adminpb "github.com/outpost-metal/outpost/shared/api/admin"
)

type hostileAdmin struct {
	adminpb.UnimplementedAdminServer
}

func (hostileAdmin) ListSites(context.Context, *adminpb.ListSitesRequest) (*adminpb.ListSitesResponse, error) {
	return &adminpb.ListSitesResponse{Sites: []*adminpb.Site{{
		SiteId: "branch-7", EdgeVersion: "v1\x1b]0;owned\x07\x1b[2J", RemoteAddress: "10.0.0.1:4444", Description: "rack\n2",
	}}}, nil
}

// What an edge reports (its version string) is shown escaped: a terminal never interprets it.
func TestListSitesEscapesPeerStrings(t *testing.T) {
	t.Parallel()

	sock := filepath.Join(t.TempDir(), "admin.sock")

	ln, err := net.Listen("unix", sock)
	require.NoError(t, err)

	srv := grpc.NewServer()
	adminpb.RegisterAdminServer(srv, hostileAdmin{})

	go srv.Serve(ln) //nolint:errcheck

	t.Cleanup(srv.Stop)

	c, err := admincli.Dial(sock)
	require.NoError(t, err)

	t.Cleanup(func() { c.Close() }) //nolint:errcheck

	var out bytes.Buffer

	require.NoError(t, c.ListSites(t.Context(), &out, time.Now()))
	require.NotContains(t, out.String(), "\x1b")
	require.NotContains(t, out.String(), "\x07")
	require.Contains(t, out.String(), `v1\x1b]0;owned\x07\x1b[2J`)
	require.Contains(t, out.String(), `rack\x0a2`)
}
