package bmc_test

import (
	"context"
	"net"
	"net/http"
	"net/http/httptest"
	"sync"
	"testing"
	"time"

	"github.com/bougou/go-ipmi/pkg/types"
	"github.com/stretchr/testify/require"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"

	"github.com/outpost-metal/outpost/edge/bmc"
	"github.com/outpost-metal/outpost/edge/bmc/internal/fakebmc"
	bmcpb "github.com/outpost-metal/outpost/shared/api/bmc"
	"github.com/outpost-metal/outpost/shared/nettest"
)

func serviceClient(t *testing.T) bmcpb.BMCClient {
	t.Helper()

	return serviceClientFor(t, manager(t))
}

func serviceClientFor(t *testing.T, m *bmc.Manager) bmcpb.BMCClient {
	t.Helper()

	return clientOf(t, bmc.NewService(m))
}

func clientOf(t *testing.T, svc *bmc.Service) bmcpb.BMCClient {
	t.Helper()

	srv := grpc.NewServer()
	svc.Register(srv)

	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)

	done := make(chan struct{})

	go func() {
		defer close(done)

		_ = srv.Serve(ln) //nolint:errcheck
	}()

	conn, err := grpc.NewClient("passthrough:///"+ln.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	require.NoError(t, err)

	t.Cleanup(func() {
		conn.Close() //nolint:errcheck
		srv.Stop()
		<-done
	})

	return bmcpb.NewBMCClient(conn)
}

// A power-off or a reset the BMC took ends what ran on the machine: the service says so, with the time it sent
// the request (the edge ends the machine's agent tunnel opened before it). Nothing else does: not a power-on, a
// status, a boot override, nor a power-off the BMC refused.
func TestServiceTellsOfEndedBoots(t *testing.T) {
	t.Parallel()

	b := fakebmc.Start(t, fakebmc.Options{User: creds.Username, Password: creds.Password})

	var (
		mu    sync.Mutex
		ended []string
	)

	start := time.Now()
	client := clientOf(t, bmc.NewService(manager(t)).WithBootEnded(func(id string, at time.Time) {
		mu.Lock()
		defer mu.Unlock()

		require.False(t, at.Before(start) || at.After(time.Now()), "the request's time, %v", at)
		ended = append(ended, id)
	}))

	req := func(id string) *bmcpb.PowerRequest {
		return &bmcpb.PowerRequest{Target: &bmcpb.Target{MachineId: id, Host: "127.0.0.1", IpmiPort: uint32(b.Port),
			Protocol: bmcpb.Protocol_PROTOCOL_IPMI, Username: creds.Username, Password: creds.Password}}
	}

	ctx := t.Context()

	_, err := client.PowerOn(ctx, req("on"))
	require.NoError(t, err)
	_, err = client.PowerStatus(ctx, req("status"))
	require.NoError(t, err)
	_, err = client.SetPXEOnce(ctx, &bmcpb.SetPXEOnceRequest{Target: req("pxe").GetTarget(), Mode: bmcpb.BootMode_BOOT_MODE_BIOS})
	require.NoError(t, err)
	_, err = client.PowerOff(ctx, req("off"))
	require.NoError(t, err)
	_, err = client.PowerCycle(ctx, req("cycle"))
	require.NoError(t, err)

	b.Refuse(fakebmc.OpSetPower, types.CodeNodeBusy)
	_, err = client.PowerOff(ctx, req("refused"))
	require.Equal(t, codes.Unavailable, status.Code(err), "%v", err)

	mu.Lock()
	defer mu.Unlock()

	require.Equal(t, []string{"off", "cycle"}, ended)
}

func TestServiceErrors(t *testing.T) {
	t.Parallel()

	client := serviceClient(t)
	silent := garbageUDP(t, nil)

	for _, tc := range []struct {
		name string
		call func(context.Context) error
		code codes.Code
	}{
		{name: "no target", code: codes.InvalidArgument, call: func(ctx context.Context) error {
			_, err := client.PowerOn(ctx, &bmcpb.PowerRequest{})

			return err
		}},
		{name: "no boot mode", code: codes.InvalidArgument, call: func(ctx context.Context) error {
			_, err := client.SetPXEOnce(ctx, &bmcpb.SetPXEOnceRequest{Target: &bmcpb.Target{Host: "127.0.0.1", Username: "u"}})

			return err
		}},
		{name: "silent bmc", code: codes.DeadlineExceeded, call: func(ctx context.Context) error {
			_, err := client.PowerStatus(ctx, &bmcpb.PowerRequest{Target: &bmcpb.Target{
				Host: "127.0.0.1", IpmiPort: uint32(silent), Protocol: bmcpb.Protocol_PROTOCOL_IPMI,
				Username: creds.Username, Password: creds.Password,
			}})

			return err
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()

			err := tc.call(t.Context())
			require.Equal(t, tc.code, status.Code(err), "%v", err)
			require.NotContains(t, err.Error(), creds.Password)
		})
	}
}

// TestServiceClassifiesRefusals: what the BMC said decides the gRPC code: a refusal for good is
// FailedPrecondition (the controller must not retry it as if the BMC were unreachable), anything that may pass
// next time is Unavailable; the message names the completion code or status in numbers and words.
func TestServiceClassifiesRefusals(t *testing.T) {
	t.Parallel()

	client := serviceClient(t)

	ipmiTarget := func(t *testing.T, refuse fakebmc.Op, cc types.CompletionCode, password string) *bmcpb.Target {
		t.Helper()

		b := fakebmc.Start(t, fakebmc.Options{User: creds.Username, Password: creds.Password})
		b.Refuse(refuse, cc)

		return &bmcpb.Target{Host: "127.0.0.1", IpmiPort: uint32(b.Port), Protocol: bmcpb.Protocol_PROTOCOL_IPMI,
			Username: creds.Username, Password: password}
	}

	redfishTarget := func(t *testing.T, status int, contentType, body string) *bmcpb.Target {
		t.Helper()

		srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
			w.Header().Set("Content-Type", contentType)
			w.WriteHeader(status)
			_, _ = w.Write([]byte(body)) //nolint:errcheck
		}))
		t.Cleanup(srv.Close)

		return &bmcpb.Target{Host: "127.0.0.1", RedfishEndpoint: srv.URL, Protocol: bmcpb.Protocol_PROTOCOL_REDFISH,
			Username: creds.Username, Password: creds.Password}
	}

	const jsonType = "application/json"

	for _, tc := range []struct {
		name   string
		target func(t *testing.T) *bmcpb.Target
		code   codes.Code
		says   string
	}{
		{name: "ipmi invalid data field", code: codes.FailedPrecondition, says: "completion code 0xcc (invalid data field in request)",
			target: func(t *testing.T) *bmcpb.Target {
				return ipmiTarget(t, fakebmc.OpSetPower, types.CodeRequestDataFieldInvalid, creds.Password)
			}},
		{name: "ipmi invalid command", code: codes.FailedPrecondition, says: "completion code 0xc1 (invalid command)",
			target: func(t *testing.T) *bmcpb.Target {
				return ipmiTarget(t, fakebmc.OpSetPower, types.CodeInvalidCommand, creds.Password)
			}},
		{name: "ipmi parameter out of range", code: codes.FailedPrecondition, says: "completion code 0xc9 (parameter out of range)",
			target: func(t *testing.T) *bmcpb.Target {
				return ipmiTarget(t, fakebmc.OpSetPower, types.CodeParameterOutOfRange, creds.Password)
			}},
		{name: "ipmi insufficient privilege", code: codes.FailedPrecondition, says: "completion code 0xd4",
			target: func(t *testing.T) *bmcpb.Target {
				return ipmiTarget(t, fakebmc.OpSetPower, types.CodeInsufficientPrivilege, creds.Password)
			}},
		{name: "ipmi node busy", code: codes.Unavailable, says: "completion code 0xc0 (node busy)",
			target: func(t *testing.T) *bmcpb.Target {
				return ipmiTarget(t, fakebmc.OpSetPower, types.CodeNodeBusy, creds.Password)
			}},
		{name: "ipmi timeout", code: codes.Unavailable, says: "completion code 0xc3 (timeout)",
			target: func(t *testing.T) *bmcpb.Target {
				return ipmiTarget(t, fakebmc.OpSetPower, types.CodeProcessTimeout, creds.Password)
			}},
		{name: "ipmi unspecified", code: codes.Unavailable, says: "completion code 0xff (unspecified error)",
			target: func(t *testing.T) *bmcpb.Target {
				return ipmiTarget(t, fakebmc.OpSetPower, types.CodeUnspecifiedError, creds.Password)
			}},
		{name: "ipmi wrong password", code: codes.FailedPrecondition, says: "wrong user name or password",
			target: func(t *testing.T) *bmcpb.Target {
				return ipmiTarget(t, fakebmc.OpSetPower, types.CodeOK, "not-the-password")
			}},
		{name: "redfish 401", code: codes.FailedPrecondition, says: "http status 401 (unauthorized)",
			target: func(t *testing.T) *bmcpb.Target { return redfishTarget(t, http.StatusUnauthorized, jsonType, `{}`) }},
		{name: "redfish 404", code: codes.FailedPrecondition, says: "http status 404 (not found)",
			target: func(t *testing.T) *bmcpb.Target { return redfishTarget(t, http.StatusNotFound, jsonType, `{}`) }},
		{name: "redfish 400 html", code: codes.FailedPrecondition, says: "http status 400 (bad request): an html page",
			target: func(t *testing.T) *bmcpb.Target {
				return redfishTarget(t, http.StatusBadRequest, "text/html", "<html>no</html>")
			}},
		{name: "redfish 200 html", code: codes.FailedPrecondition, says: "html page where redfish json was expected",
			target: func(t *testing.T) *bmcpb.Target {
				return redfishTarget(t, http.StatusOK, "text/html", "<html>login</html>")
			}},
		{name: "redfish 200 html untyped", code: codes.FailedPrecondition, says: "html page where redfish json was expected",
			target: func(t *testing.T) *bmcpb.Target {
				return redfishTarget(t, http.StatusOK, "", "<!DOCTYPE html><html>login</html>")
			}},
		{name: "redfish 408", code: codes.Unavailable, says: "http status 408 (request timeout)",
			target: func(t *testing.T) *bmcpb.Target { return redfishTarget(t, http.StatusRequestTimeout, jsonType, `{}`) }},
		{name: "redfish 429", code: codes.Unavailable, says: "http status 429 (too many requests)",
			target: func(t *testing.T) *bmcpb.Target { return redfishTarget(t, http.StatusTooManyRequests, jsonType, `{}`) }},
		{name: "redfish 503", code: codes.Unavailable, says: "http status 503 (service unavailable)",
			target: func(t *testing.T) *bmcpb.Target {
				return redfishTarget(t, http.StatusServiceUnavailable, jsonType, `{}`)
			}},
		{name: "redfish truncated json", code: codes.Unavailable, says: "malformed reply from the redfish service",
			target: func(t *testing.T) *bmcpb.Target { return redfishTarget(t, http.StatusOK, jsonType, `{"@odata.id":`) }},
		{name: "redfish refused connection", code: codes.Unavailable, says: "connection refused",
			target: func(t *testing.T) *bmcpb.Target {
				return &bmcpb.Target{Host: "127.0.0.1", RedfishEndpoint: "http://" + nettest.RefusingAddr(t), Protocol: bmcpb.Protocol_PROTOCOL_REDFISH,
					Username: creds.Username, Password: creds.Password}
			}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()

			_, err := client.PowerOn(t.Context(), &bmcpb.PowerRequest{Target: tc.target(t)})
			require.Equal(t, tc.code, status.Code(err), "%v", err)
			require.Contains(t, status.Convert(err).Message(), tc.says)
			require.NotContains(t, err.Error(), creds.Password)
		})
	}
}
