package machines_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.uber.org/zap/zaptest"

	"github.com/outpost-metal/outpost/controller/bootevents"
	"github.com/outpost-metal/outpost/controller/machines"
	"github.com/outpost-metal/outpost/controller/timeline"
	bootpb "github.com/outpost-metal/outpost/shared/api/boot"
)

var _ bootevents.Handler = (*machines.Locations)(nil)

func TestLocationsFromEdgeEvents(t *testing.T) {
	t.Parallel()

	const id = "4c4c4544-0042-3510-8052-b4c04f384833"

	l := machines.NewLocations(zaptest.NewLogger(t))
	ctx := t.Context()

	for _, tc := range []struct {
		name string
		site string
		ev   *bootpb.Event
		want where
	}{
		{name: "boot served", site: "site-a", want: where{SiteID: "site-a", Arch: "amd64"},
			ev: &bootpb.Event{Kind: &bootpb.Event_BootServed{BootServed: &bootpb.BootServed{Uuid: "4C4C4544-0042-3510-8052-B4C04F384833", Arch: "x86_64", Mode: "agent"}}}},
		{name: "dhcp firmware", site: "site-a", want: where{SiteID: "site-a", Arch: "amd64", Firmware: "uefi", Source: "dhcp"},
			ev: &bootpb.Event{Kind: &bootpb.Event_DhcpSeen{DhcpSeen: &bootpb.DHCPSeen{Uuid: id, Firmware: "uefi-x86"}}}},
		{name: "agent tunnel open", site: "site-a", want: where{SiteID: "site-a", Arch: "amd64", Firmware: "uefi", Source: "dhcp", AgentConnected: true},
			ev: &bootpb.Event{Kind: &bootpb.Event_AgentTunnel{AgentTunnel: &bootpb.AgentTunnel{MachineId: id, Open: true}}}},
		{name: "a tunnel at another site is a claim, refused", site: "site-b", want: where{SiteID: "site-a", Arch: "amd64", Firmware: "uefi", Source: "dhcp", AgentConnected: true},
			ev: &bootpb.Event{Kind: &bootpb.Event_AgentTunnel{AgentTunnel: &bootpb.AgentTunnel{MachineId: id, Open: true}}}},
		{name: "stale close from another site", site: "site-b", want: where{SiteID: "site-a", Arch: "amd64", Firmware: "uefi", Source: "dhcp", AgentConnected: true},
			ev: &bootpb.Event{Kind: &bootpb.Event_AgentTunnel{AgentTunnel: &bootpb.AgentTunnel{MachineId: id, Open: false}}}},
		{name: "garbage uuid dropped", site: "site-b", want: where{SiteID: "site-a", Arch: "amd64", Firmware: "uefi", Source: "dhcp", AgentConnected: true},
			ev: &bootpb.Event{Kind: &bootpb.Event_BootServed{BootServed: &bootpb.BootServed{Uuid: "../../../etc/passwd"}}}},
		{name: "moves to another site on boot evidence", site: "site-b", want: where{SiteID: "site-b", Arch: "amd64", Firmware: "uefi", Source: "dhcp"},
			ev: &bootpb.Event{Kind: &bootpb.Event_BootServed{BootServed: &bootpb.BootServed{Uuid: id, Arch: "x86_64"}}}},
		{name: "its own boot request says bios", site: "site-b", want: where{SiteID: "site-b", Arch: "amd64", Firmware: "bios", Source: "ipxe"},
			ev: &bootpb.Event{Kind: &bootpb.Event_BootServed{BootServed: &bootpb.BootServed{Uuid: id, Arch: "x86_64", Platform: "pcbios"}}}},
		{name: "a dhcp answer does not override the boot request", site: "site-b", want: where{SiteID: "site-b", Arch: "amd64", Firmware: "bios", Source: "ipxe"},
			ev: &bootpb.Event{Kind: &bootpb.Event_DhcpSeen{DhcpSeen: &bootpb.DHCPSeen{Uuid: id, Firmware: "uefi-x86"}}}},
		{name: "empty event dropped", site: "site-b", want: where{SiteID: "site-b", Arch: "amd64", Firmware: "bios", Source: "ipxe"},
			ev: &bootpb.Event{}},
	} {
		require.NoError(t, l.HandleEvent(ctx, tc.site, tc.ev), tc.name)

		got, ok := l.Locate(id)
		require.True(t, ok, tc.name)
		require.Equal(t, tc.want, whereOf(got), tc.name)
	}

	require.Equal(t, 1.0, l.Rejected("claim_from_other_site"))
	require.Equal(t, 1.0, l.Rejected("bad_machine_id"))
	require.Equal(t, 1.0, l.Rejected("machine_moved"))
	require.Equal(t, 1.0, l.Rejected("unknown_event"))
}

func TestFirmwareFromDHCPBeforeTheMachineIsPlaced(t *testing.T) {
	t.Parallel()

	const id = "8f0e2d3c-1b5a-4c7e-9d2f-6a4b3c2d1e0f"

	l := machines.NewLocations(zaptest.NewLogger(t))
	ctx := t.Context()

	// Firmware PXE asks first (its option 97 UUID is in the client's byte order: not the machine's ID) ...
	require.NoError(t, l.HandleEvent(ctx, "site-a", &bootpb.Event{Kind: &bootpb.Event_DhcpSeen{DhcpSeen: &bootpb.DHCPSeen{
		Mac: "52:54:00:AA:BB:01", Firmware: "bios", Uuid: "3c2d0e8f-5a1b-7e4c-9d2f-6a4b3c2d1e0f"}}}))
	// ... then iPXE's boot script request ties the machine's UUID to that MAC.
	require.NoError(t, l.HandleEvent(ctx, "site-a", &bootpb.Event{Kind: &bootpb.Event_BootServed{BootServed: &bootpb.BootServed{
		Uuid: id, Mac: "52:54:00:aa:bb:01", Arch: "x86_64", Mode: "agent"}}}))

	loc, ok := l.Locate(id)
	require.True(t, ok)
	require.Equal(t, where{SiteID: "site-a", Arch: "amd64", Firmware: "bios", Source: "dhcp"}, whereOf(loc))
	require.Equal(t, []string{"52:54:00:aa:bb:01"}, loc.MACs)
	require.False(t, loc.LastSeen.IsZero())
}

// where is the part of a Location the event tests compare.
type where struct {
	SiteID, Arch, Firmware, Source string
	AgentConnected                 bool
}

func whereOf(l machines.Location) where {
	return where{SiteID: l.SiteID, Arch: l.Arch.String(), Firmware: l.Firmware, Source: l.FirmwareSource, AgentConnected: l.AgentConnected}
}

// A tunnel refused at a machine's own site (another host, or a clone, asked for it) and a claim from another
// site raise an alert on the machine; its own tunnel opening again clears it. Refusals for machines nobody
// knows, or reported by another site, raise nothing.
func TestIdentityAlertsFromEdgeEvents(t *testing.T) {
	t.Parallel()

	const id = "4c4c4544-0042-3510-8052-b4c04f384838"

	l := machines.NewLocations(zaptest.NewLogger(t))
	refused := func(site, machine, reason string) {
		require.NoError(t, l.HandleEvent(t.Context(), site, &bootpb.Event{Kind: &bootpb.Event_TunnelRefused{
			TunnelRefused: &bootpb.TunnelRefused{MachineId: machine, Reason: reason, RemoteIp: "10.0.0.66"},
		}}))
	}
	tunnel := func(site string, open bool) {
		require.NoError(t, l.HandleEvent(t.Context(), site, &bootpb.Event{Kind: &bootpb.Event_AgentTunnel{
			AgentTunnel: &bootpb.AgentTunnel{MachineId: id, Open: open, RemoteIp: "10.0.0.66"},
		}}))
	}
	alert := func() string {
		loc, ok := l.Locate(id)
		require.True(t, ok)

		return loc.Alert
	}

	refused("site-a", id, "duplicate_machine_id")
	_, known := l.Locate(id)
	require.False(t, known, "a refusal places no machine")

	_, err := l.Seen("site-a", id)
	require.NoError(t, err)

	refused("site-b", id, "duplicate_machine_id")
	require.Empty(t, alert(), "another site's refusal")
	refused("site-a", id, "no_such_reason")
	require.Empty(t, alert())

	// Each lesser alert replaces the last; a contested UUID (below) is never replaced by one.
	for _, tc := range []struct{ reason, want string }{
		{"source_not_boot_address", machines.AlertTunnelOtherSource},
		{"duplicate_machine_id", machines.AlertSecondTunnel},
	} {
		refused("site-a", id, tc.reason)
		require.Equal(t, tc.want, alert(), tc.reason)
	}

	tunnel("site-a", true)
	require.Empty(t, alert(), "cleared by the machine's own tunnel")

	tunnel("site-b", true) // a claim from another site: refused, and raised
	require.Equal(t, machines.AlertClaimedElsewhere, alert())
	loc, _ := l.Locate(id)
	require.Equal(t, "site-a", loc.SiteID)
	require.True(t, loc.AgentConnected, "the claim changed nothing of the machine's own tunnel")

	// a contested UUID stays until an operator clears it, whatever tunnel opens meanwhile, and a lesser alert
	// raised after it (a second tunnel) does not replace it: the own tunnel would then clear that one and lift
	// the hold
	refused("site-a", id, "contested_machine_id")
	require.Equal(t, machines.AlertTunnelContested, alert())
	refused("site-a", id, "duplicate_machine_id")
	require.Equal(t, machines.AlertTunnelContested, alert(), "a lesser alert does not replace a contested UUID")
	tunnel("site-a", false)
	tunnel("site-a", true)
	require.Equal(t, machines.AlertTunnelContested, alert())

	was, err := l.ClearAlert(id)
	require.NoError(t, err)
	require.Equal(t, machines.AlertTunnelContested, was)
	require.Empty(t, alert())

	_, err = l.ClearAlert("4c4c4544-0042-3510-8052-b4c04f384899")
	require.ErrorIs(t, err, machines.ErrNotLocated)
}

type siteKey struct{}

func siteOf(ctx context.Context) (string, bool) {
	s, ok := ctx.Value(siteKey{}).(string)

	return s, ok
}

// Every edge event reaches both the locations and the timelines, valid or not (the timeline bounds its own):
// the receiver hands each to every handler it was built with.
func TestEdgeEventsReachLocationsAndTimelines(t *testing.T) {
	t.Parallel()

	const id = "4c4c4544-0042-3510-8052-b4c04f4e3232"

	locations := machines.NewLocations(zaptest.NewLogger(t))
	book := timeline.New(timeline.DefaultConfig(), time.Now)
	receiver := bootevents.NewReceiver(zaptest.NewLogger(t), siteOf, locations, book)

	events := []*bootpb.Event{
		{Kind: &bootpb.Event_BootServed{BootServed: &bootpb.BootServed{Uuid: id, Mode: "agent", Mac: "52:54:00:00:00:01"}}},
		{Kind: &bootpb.Event_AgentTunnel{AgentTunnel: &bootpb.AgentTunnel{MachineId: id, Open: true}}},
		{Kind: &bootpb.Event_BootServed{BootServed: &bootpb.BootServed{Uuid: "nonsense"}}},
	}
	for i, e := range events {
		e.Sequence = uint64(i + 1)
	}

	resp, err := receiver.Publish(context.WithValue(t.Context(), siteKey{}, "site-a"), &bootpb.PublishRequest{JournalId: "j1", Events: events})
	require.NoError(t, err)
	require.EqualValues(t, 3, resp.GetAcked())

	loc, ok := locations.Locate(id)
	require.True(t, ok)
	require.True(t, loc.AgentConnected)

	rec, ok := book.Get(id)
	require.True(t, ok)

	var kinds []string
	for _, e := range rec.Entries {
		kinds = append(kinds, e.Kind)
	}

	require.Equal(t, []string{timeline.KindBootServed, timeline.KindAgentUp}, kinds)
}
