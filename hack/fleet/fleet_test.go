package fleet_test

import (
	"os"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/outpost-metal/outpost/hack/fleet"
	bmcpb "github.com/outpost-metal/outpost/shared/api/bmc"
)

func target(host, password string) *bmcpb.PowerRequest {
	return &bmcpb.PowerRequest{Target: &bmcpb.Target{Host: host, Username: "outpost", Password: password, Protocol: bmcpb.Protocol_PROTOCOL_IPMI}}
}

func TestBMCServiceAnswersAsTheEdge(t *testing.T) {
	t.Parallel()

	s := fleet.NewTestBMCService(fleet.BMCBehaviour{DeadAfter: 50 * time.Millisecond}, time.Second,
		map[string]bool{"127.64.0.2": true}, "127.64.0.1", "127.64.0.2")

	tests := []struct {
		name string
		req  *bmcpb.PowerRequest
		code codes.Code
	}{
		{name: "live", req: target("127.64.0.1", "secret"), code: codes.OK},
		{name: "wrong password", req: target("127.64.0.1", "guess"), code: codes.FailedPrecondition},
		{name: "dead", req: target("127.64.0.2", "secret"), code: codes.DeadlineExceeded},
		{name: "unknown", req: target("127.64.0.3", "secret"), code: codes.DeadlineExceeded},
		{name: "empty password", req: target("127.64.0.1", ""), code: codes.FailedPrecondition},
	}

	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()

			resp, err := s.PowerStatus(t.Context(), tt.req)
			require.Equal(t, tt.code, status.Code(err), "%v", err)

			if tt.code == codes.OK {
				require.False(t, resp.GetOn(), "a machine never started is off")
			}
		})
	}
}

func TestBMCServiceFailureRate(t *testing.T) {
	t.Parallel()

	s := fleet.NewTestBMCService(fleet.BMCBehaviour{FailureRate: 1, DeadAfter: time.Second}, time.Second, nil, "127.64.0.1")

	_, err := s.PowerOn(t.Context(), target("127.64.0.1", "secret"))
	require.Equal(t, codes.Unavailable, status.Code(err))
}

func TestDistribution(t *testing.T) {
	t.Parallel()

	v := make([]float64, 0, 100)
	for i := 100; i >= 1; i-- {
		v = append(v, float64(i))
	}

	d := fleet.Distribution(v)
	require.Equal(t, fleet.Dist{N: 100, P50: 50, P90: 90, P99: 99, Max: 100}, d)
	require.Equal(t, fleet.Dist{P50: -1, P90: -1, P99: -1, Max: -1}, fleet.Distribution(nil))
}

func TestSiderolinkAPI(t *testing.T) {
	t.Parallel()

	doc := []byte("apiVersion: v1alpha1\nkind: SideroLinkConfig\napiUrl: grpc://127.0.0.1:8099?jointoken=abc%3D\n---\nkind: EventSinkConfig\n")

	u, err := fleet.SiderolinkAPI(doc)
	require.NoError(t, err)
	require.Equal(t, "127.0.0.1:8099", u.Host)
	require.Equal(t, "abc=", u.Query().Get("jointoken"))

	_, err = fleet.SiderolinkAPI([]byte("kind: EventSinkConfig\n"))
	require.Error(t, err)
}

func TestProcCPU(t *testing.T) {
	t.Parallel()

	deadline := time.Now().Add(200 * time.Millisecond)
	for time.Now().Before(deadline) { // burn some CPU to see it counted
	}

	cpu, err := fleet.ProcCPU(os.Getpid())
	require.NoError(t, err)
	require.Positive(t, cpu)
}
