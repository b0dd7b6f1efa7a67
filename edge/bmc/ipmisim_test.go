package bmc_test

import (
	"testing"

	"github.com/stretchr/testify/require"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/outpost-metal/outpost/edge/bmc"
	"github.com/outpost-metal/outpost/edge/bmc/internal/ipmisim"
	bmcpb "github.com/outpost-metal/outpost/shared/api/bmc"
)

// TestServiceAgainstIPMISim drives OpenIPMI's ipmi_sim (skipped when it is not installed) through the gRPC
// service the controller calls: the one-time PXE boot that ipmi_sim reads back without its valid and EFI bits
// succeeds in both modes, a cycle of a machine that is off powers it on, and a BMC that cannot power anything is
// a FailedPrecondition, not "try again".
func TestServiceAgainstIPMISim(t *testing.T) {
	t.Parallel()

	target := func(sim *ipmisim.Sim) *bmcpb.Target {
		return &bmcpb.Target{Host: "127.0.0.1", IpmiPort: uint32(sim.Port), Protocol: bmcpb.Protocol_PROTOCOL_IPMI,
			Username: creds.Username, Password: creds.Password}
	}

	t.Run("power and pxe", func(t *testing.T) {
		t.Parallel()

		sim := ipmisim.Start(t, ipmisim.Options{User: creds.Username, Password: creds.Password})
		m := manager(t)
		srv := serviceClientFor(t, m)
		req := &bmcpb.PowerRequest{Target: target(sim)}

		for _, mode := range []bmcpb.BootMode{bmcpb.BootMode_BOOT_MODE_BIOS, bmcpb.BootMode_BOOT_MODE_UEFI} {
			_, err := srv.SetPXEOnce(t.Context(), &bmcpb.SetPXEOnceRequest{Target: req.GetTarget(), Mode: mode})
			require.NoError(t, err, mode)
			require.Equal(t, "pxe", sim.BootDevice())
		}

		// A cycle of a machine that is off powers it on: the manager's rule, for either protocol.
		require.False(t, sim.Power())

		_, err := srv.PowerCycle(t.Context(), req)
		require.NoError(t, err)
		require.True(t, sim.Power(), "a cycle of a machine that is off powers it on")
		require.NotContains(t, sim.Calls(), "set power 0", "powered on, not cycled (a cycle powers down first)")

		_, err = srv.PowerOn(t.Context(), req)
		require.NoError(t, err)
		require.True(t, sim.Power())

		st, err := srv.PowerStatus(t.Context(), req)
		require.NoError(t, err)
		require.True(t, st.GetOn())

		suite, ok := m.IPMICipherSuite(bmc.Target{Host: "127.0.0.1", IPMIPort: sim.Port, Protocol: bmc.ProtocolIPMI})
		require.True(t, ok, "ipmi_sim refuses 17: the fallback is remembered")
		require.Equal(t, uint8(3), suite)
	})

	t.Run("refused for good", func(t *testing.T) {
		t.Parallel()

		sim := ipmisim.Start(t, ipmisim.Options{User: creds.Username, Password: creds.Password, NoChassisControl: true})
		srv := serviceClientFor(t, manager(t))

		_, err := srv.PowerOn(t.Context(), &bmcpb.PowerRequest{Target: target(sim)})
		require.Equal(t, codes.FailedPrecondition, status.Code(err), "%v", err)
		require.Contains(t, status.Convert(err).Message(), "completion code 0xcc (invalid data field in request)")
	})

	t.Run("chassis failure is retryable", func(t *testing.T) {
		t.Parallel()

		sim := ipmisim.Start(t, ipmisim.Options{User: creds.Username, Password: creds.Password})
		require.NoError(t, sim.FailChassis(true))

		srv := serviceClientFor(t, manager(t))

		_, err := srv.PowerStatus(t.Context(), &bmcpb.PowerRequest{Target: target(sim)})
		require.Equal(t, codes.Unavailable, status.Code(err), "%v", err)
		require.Contains(t, status.Convert(err).Message(), "completion code 0xff (unspecified error)")
	})
}
