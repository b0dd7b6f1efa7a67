package machines_test

import (
	"context"
	"testing"
	"time"

	"github.com/cosi-project/runtime/pkg/resource"
	"github.com/cosi-project/runtime/pkg/safe"
	"github.com/cosi-project/runtime/pkg/state"
	"github.com/cosi-project/runtime/pkg/state/impl/inmem"
	"github.com/cosi-project/runtime/pkg/state/impl/namespaced"
	"github.com/stretchr/testify/require"
	"go.uber.org/zap"
	"go.uber.org/zap/zaptest"

	"github.com/outpost-metal/outpost/controller/machines"
	"github.com/outpost-metal/outpost/controller/resources"
	"github.com/outpost-metal/outpost/controller/resources/specs"
	"github.com/outpost-metal/outpost/shared/metal"
)

func TestLocations(t *testing.T) {
	t.Parallel()

	const id = "4c4c4544-0042-3510-8052-b4c04f384833"

	l := machines.NewLocations(zaptest.NewLogger(t))

	_, ok := l.Locate(id)
	require.False(t, ok)

	moved, err := l.Seen("site-a", id)
	require.NoError(t, err)
	require.False(t, moved)

	require.NoError(t, l.AgentConnected("site-a", id, true))
	require.Equal(t, machines.Location{SiteID: "site-a", AgentConnected: true}, must(l.Locate(id)))

	// the machine turns up at site-b: it moves there, its old tunnel state does not follow
	moved, err = l.Seen("site-b", id)
	require.NoError(t, err)
	require.True(t, moved)
	require.Equal(t, machines.Location{SiteID: "site-b"}, must(l.Locate(id)))

	// a stale close from the old site changes nothing; the new site's tunnel counts
	require.NoError(t, l.AgentConnected("site-a", id, false))
	require.NoError(t, l.AgentConnected("site-b", id, true))
	require.Equal(t, machines.Location{SiteID: "site-b", AgentConnected: true}, must(l.Locate(id)))

	l.SiteOffline("site-b")
	require.Equal(t, machines.Location{SiteID: "site-b"}, must(l.Locate(id)))

	l.SetArch(id, metal.ARM64)
	require.Equal(t, metal.ARM64, must(l.Locate(id)).Arch)

	for _, bad := range []metal.ID{"", "../../etc", "m1", "4c4c4544-0042-3510-8052-b4c04f38483", "4C4C4544-0042-3510-8052-B4C04F384833"} {
		_, err = l.Seen("site-a", bad)
		require.ErrorIs(t, err, machines.ErrBadMachineID, string(bad))
		require.ErrorIs(t, l.AgentConnected("site-a", bad, false), machines.ErrBadMachineID, string(bad))
	}
}

// must returns a located machine's Location without the time it was last seen (compared separately).
func must(loc machines.Location, ok bool) machines.Location {
	if !ok {
		panic("not located")
	}

	loc.LastSeen = time.Time{}

	return loc
}

// Locations persisted in Omni survive a restart: a new Locations loads them before anything else, and edge
// reports since the start win over the records.
func TestLocationsPersistAndLoad(t *testing.T) {
	t.Parallel()

	const (
		a = "4c4c4544-0042-3510-8052-b4c04f384833"
		b = "4c4c4544-0042-3510-8052-b4c04f384834"
	)

	st := state.WrapCore(namespaced.NewState(inmem.Build))
	types := resources.NewTypes("bare-metal")
	require.NoError(t, types.Register())

	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()

	first := machines.NewLocations(zaptest.NewLogger(t))
	done := make(chan error, 1)

	go func() { done <- first.Persist(ctx, st, types) }()

	_, err := first.Seen("site-a", a)
	require.NoError(t, err)
	first.SetArch(a, metal.AMD64)
	first.SetFirmware(a, "uefi", "ipxe")
	first.AddMAC(a, "52:54:00:AA:00:01")
	require.NoError(t, first.AgentConnected("site-b", b, true))

	require.Eventually(t, func() bool {
		list, err := st.List(ctx, types.NewMachineLocation("").Metadata())

		return err == nil && len(list.Items) == 2
	}, 5*time.Second, 5*time.Millisecond, "both records written")

	// a record of a newer controller and a garbage record are left alone
	require.NoError(t, st.Create(ctx, func() resource.Resource {
		r := types.NewMachineLocation("4c4c4544-0042-3510-8052-b4c04f384899")
		r.TypedSpec().Value = &specs.MachineLocationSpec{SiteId: "site-x", Schema: resources.MachineLocationSchema + 1}

		return r
	}()))
	require.NoError(t, st.Create(ctx, types.NewMachineLocation("not-a-uuid")))

	cancel()
	require.NoError(t, <-done)

	// the restarted controller: site-b's edge has already said b's tunnel is closed
	second := machines.NewLocations(zaptest.NewLogger(t))
	require.NoError(t, second.AgentConnected("site-b", b, true))
	require.NoError(t, second.AgentConnected("site-b", b, false))

	// a third one, whose edge placed a (its boot table) and saw a DHCP request before the records were read:
	// the record's stronger firmware source and what the edge did not say are merged in
	third := machines.NewLocations(zaptest.NewLogger(t))
	_, err = third.Seen("site-a", a)
	require.NoError(t, err)
	third.SetFirmware(a, "bios", "dhcp")
	require.NoError(t, third.Load(t.Context(), st, types))

	merged := must(third.Locate(a))
	require.Equal(t, []string{"site-a", "uefi", "ipxe", "amd64"}, []string{merged.SiteID, merged.Firmware, merged.FirmwareSource, merged.Arch.String()})
	require.Equal(t, []string{"52:54:00:aa:00:01"}, merged.MACs)

	require.NoError(t, second.Load(t.Context(), st, types))

	select {
	case <-second.Loaded():
	default:
		t.Fatal("Loaded not closed after Load")
	}

	require.Equal(t, machines.Location{SiteID: "site-a", Arch: "amd64", Firmware: "uefi", FirmwareSource: "ipxe", MACs: []string{"52:54:00:aa:00:01"}},
		must(second.Locate(a)))
	require.Equal(t, machines.Location{SiteID: "site-b"}, must(second.Locate(b)), "what the edge said since the start wins")

	_, ok := second.Locate("4c4c4544-0042-3510-8052-b4c04f384899")
	require.False(t, ok, "a newer controller's record is not used")
	require.Equal(t, []metal.ID{a}, second.AtSite("site-a"))
}

// An edge's inventory at session start sets agent presence for its site and places machines its boot table
// holds; it cannot claim a machine located at another site.
func TestLocationsInventory(t *testing.T) {
	t.Parallel()

	const (
		here     = "4c4c4544-0042-3510-8052-b4c04f384841"
		gone     = "4c4c4544-0042-3510-8052-b4c04f384842"
		table    = "4c4c4544-0042-3510-8052-b4c04f384843"
		elsewere = "4c4c4544-0042-3510-8052-b4c04f384844"
	)

	l := machines.NewLocations(zaptest.NewLogger(t))

	for _, id := range []metal.ID{here, gone} {
		_, err := l.Seen("site-a", id)
		require.NoError(t, err)
		require.NoError(t, l.AgentConnected("site-a", id, true))
	}

	_, err := l.Seen("site-b", elsewere)
	require.NoError(t, err)

	refused := l.Inventory("site-a", []string{here, elsewere}, []string{table, "garbage"})
	require.Equal(t, 1, refused)

	require.True(t, must(l.Locate(here)).AgentConnected)
	require.False(t, must(l.Locate(gone)).AgentConnected, "a tunnel the edge no longer holds is closed")
	require.Equal(t, "site-a", must(l.Locate(table)).SiteID, "a machine in the edge's table is placed there")
	require.Equal(t, machines.Location{SiteID: "site-b"}, must(l.Locate(elsewere)), "a claim does not move a machine")
	require.Equal(t, 1.0, l.Rejected("inventory_claim"))
}

func FuzzLocationsSeen(f *testing.F) {
	l := machines.NewLocations(zap.NewNop())

	f.Add("site-a", "4c4c4544-0042-3510-8052-b4c04f384833")
	f.Add("", "{4c4c4544-0042-3510-8052-b4c04f384833}")

	f.Fuzz(func(t *testing.T, site, id string) {
		if _, err := l.Seen(site, metal.ID(id)); err == nil {
			loc, ok := l.Locate(metal.ID(id))
			require.True(t, ok)
			require.Equal(t, site, loc.SiteID)
		}
	})
}

// WaitWritten returns once the record in Omni says what the locations know: an operator's boot mode is kept
// when the call returns, not some time later.
func TestLocationsWaitWritten(t *testing.T) {
	t.Parallel()

	const id = "4c4c4544-0042-3510-8052-b4c04f384840"

	st := state.WrapCore(namespaced.NewState(inmem.Build))
	types := resources.NewTypes("bare-metal")
	require.NoError(t, types.Register())

	locs := machines.NewLocations(zaptest.NewLogger(t))
	_, err := locs.Seen("site-a", id)
	require.NoError(t, err)
	require.NoError(t, locs.WaitWritten(t.Context(), id), "nothing persists yet: nothing to wait for")

	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan error, 1)

	go func() { done <- locs.Persist(ctx, st, types) }()

	t.Cleanup(func() {
		cancel()
		<-done
	})

	require.Eventually(t, func() bool {
		_, err := st.Get(ctx, types.NewMachineLocation(id).Metadata())

		return err == nil
	}, 5*time.Second, 5*time.Millisecond, "Persist runs")

	for _, fw := range []string{"bios", "uefi", "bios"} {
		_, _, err := locs.OverrideFirmware(id, metal.Firmware(fw))
		require.NoError(t, err)
		require.NoError(t, locs.WaitWritten(t.Context(), id))

		rec, err := safe.StateGet[*resources.MachineLocation](t.Context(), st, types.NewMachineLocation(id).Metadata())
		require.NoError(t, err)
		require.Equal(t, []string{fw, "operator"}, []string{rec.TypedSpec().Value.GetFirmware(), rec.TypedSpec().Value.GetFirmwareSource()})
	}
}

// A restarted controller whose edge reported a machine before the records were read keeps the machine's
// contested-UUID alert (only an operator clears it); an alert its own open tunnel would have cleared goes.
func TestLocationsLoadKeepsAlerts(t *testing.T) {
	t.Parallel()

	const contested, rogue = "4c4c4544-0042-3510-8052-b4c04f384841", "4c4c4544-0042-3510-8052-b4c04f384842"

	st := state.WrapCore(namespaced.NewState(inmem.Build))
	types := resources.NewTypes("bare-metal")
	require.NoError(t, types.Register())

	first := machines.NewLocations(zaptest.NewLogger(t))

	for id, alert := range map[metal.ID]string{contested: machines.AlertTunnelContested, rogue: machines.AlertSecondTunnel} {
		_, err := first.Seen("site-a", id)
		require.NoError(t, err)
		first.Raise(id, alert, "test")
	}

	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan error, 1)

	go func() { done <- first.Persist(ctx, st, types) }()

	require.Eventually(t, func() bool {
		list, err := st.List(ctx, types.NewMachineLocation("").Metadata())

		return err == nil && len(list.Items) == 2
	}, 5*time.Second, 5*time.Millisecond, "both records written")

	cancel()
	require.NoError(t, <-done)

	second := machines.NewLocations(zaptest.NewLogger(t))
	require.NoError(t, second.AgentConnected("site-a", contested, true))
	require.NoError(t, second.AgentConnected("site-a", rogue, true))
	require.NoError(t, second.Load(t.Context(), st, types))

	require.Equal(t, machines.AlertTunnelContested, must(second.Locate(contested)).Alert)
	require.Empty(t, must(second.Locate(rogue)).Alert, "the machine's own tunnel opened since")
}
