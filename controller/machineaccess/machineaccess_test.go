package machineaccess_test

import (
	"context"
	"errors"
	"testing"

	agentpb "github.com/siderolabs/talos-metal-agent/api/agent"
	"github.com/stretchr/testify/require"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	"github.com/outpost-metal/outpost/controller/machineaccess"
	bmcpb "github.com/outpost-metal/outpost/shared/api/bmc"
	"github.com/outpost-metal/outpost/shared/metal"
)

// recorder is a connection that records the calls that reached it.
type recorder struct {
	methods []string
	ids     []string
	reqs    []any
}

func (r *recorder) Invoke(ctx context.Context, method string, req, _ any, _ ...grpc.CallOption) error {
	md, _ := metadata.FromOutgoingContext(ctx)
	r.methods = append(r.methods, method)
	r.reqs = append(r.reqs, req)
	r.ids = append(r.ids, md.Get(metal.MetadataKey)...)

	return nil
}

func (r *recorder) NewStream(context.Context, *grpc.StreamDesc, string, ...grpc.CallOption) (grpc.ClientStream, error) {
	return nil, errors.New("not used")
}

type locator map[string]string

func (l locator) SiteOf(id string) (string, bool) { s, ok := l[id]; return s, ok }

const (
	here  = "aaaaaaaa-0000-4000-8000-000000000001"
	there = "aaaaaaaa-0000-4000-8000-000000000002"
)

func newClient(rec *recorder, offline bool) *machineaccess.Client {
	conn := func(site string) (grpc.ClientConnInterface, error) {
		if offline {
			return nil, errors.New("site " + site + " is offline")
		}

		return rec, nil
	}

	return machineaccess.New(conn, locator{here: "s1", there: "s2"})
}

func TestAgentRouting(t *testing.T) {
	t.Parallel()

	for _, tc := range []struct {
		name    string
		site    string
		machine string
		offline bool
		code    codes.Code
		wantErr error
	}{
		{name: "machine at the site", site: "s1", machine: here, code: codes.OK},
		{name: "machine at another site", site: "s1", machine: there, code: codes.Aborted, wantErr: machineaccess.ErrWrongSite},
		{name: "unknown machine", site: "s1", machine: "bbbbbbbb-0000-4000-8000-000000000009", code: codes.Aborted, wantErr: machineaccess.ErrUnknownMachine},
		{name: "site offline", site: "s1", machine: here, offline: true, code: codes.Unavailable},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()

			rec := &recorder{}
			c := newClient(rec, tc.offline)

			// A stray machine-id on the caller's context is replaced, not added to.
			ctx := metadata.AppendToOutgoingContext(t.Context(), metal.MetadataKey, there)

			_, err := c.Agent(tc.site, tc.machine).Hello(ctx, &agentpb.HelloRequest{})
			require.Equal(t, tc.code, status.Code(err), "%v", err)

			_, bmcErr := c.BMC(tc.site, tc.machine, &bmcpb.Target{Host: "10.0.0.1"}).PowerStatus(t.Context())
			require.Equal(t, tc.code, status.Code(bmcErr), "%v", bmcErr)

			if tc.wantErr != nil {
				require.ErrorContains(t, err, tc.wantErr.Error())
			}

			if tc.code != codes.OK {
				require.Empty(t, rec.methods, "nothing left the controller")

				return
			}

			require.Equal(t, []string{"/management.AgentService/Hello", "/outpost.bmc.BMC/PowerStatus"}, rec.methods)
			require.Equal(t, []string{here}, rec.ids, "agent calls carry machine-id")
		})
	}
}
