package machineaccess_test

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/outpost-metal/outpost/controller/machineaccess"
	bmcpb "github.com/outpost-metal/outpost/shared/api/bmc"
	intentspb "github.com/outpost-metal/outpost/shared/api/intents"
)

func TestPowerActionsReachTheirMethod(t *testing.T) {
	t.Parallel()

	for _, tc := range []struct {
		name   string
		action machineaccess.PowerAction
		method string
	}{
		{name: "power_on", action: machineaccess.PowerOn, method: bmcpb.BMC_PowerOn_FullMethodName},
		{name: "power_off", action: machineaccess.PowerOff, method: bmcpb.BMC_PowerOff_FullMethodName},
		{name: "power_cycle", action: machineaccess.PowerCycle, method: bmcpb.BMC_PowerCycle_FullMethodName},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()

			require.Equal(t, tc.name, tc.action.String(), "the metric label word")

			rec := &recorder{}
			b := newClient(rec, false).BMC("s1", here, &bmcpb.Target{Host: "10.0.0.1"})

			require.NoError(t, b.Power(intentspb.NewOutgoingContext(t.Context(), "intent-1"), tc.action))
			require.Equal(t, []string{tc.method}, rec.methods)
			require.Len(t, rec.reqs, 1)

			req, ok := rec.reqs[0].(*bmcpb.PowerRequest)
			require.True(t, ok, "%T", rec.reqs[0])
			require.Equal(t, "intent-1", req.GetIntentId())
			require.Equal(t, here, req.GetTarget().GetMachineId())
			require.Equal(t, "10.0.0.1", req.GetTarget().GetHost())
		})
	}
}

func TestPowerActionUnknownSendsNothing(t *testing.T) {
	t.Parallel()

	rec := &recorder{}
	b := newClient(rec, false).BMC("s1", here, &bmcpb.Target{Host: "10.0.0.1"})

	require.ErrorContains(t, b.Power(t.Context(), machineaccess.PowerAction(0)), "unknown power action 0")
	require.Empty(t, rec.methods)
	require.Equal(t, "power_action_7", machineaccess.PowerAction(7).String())
}
