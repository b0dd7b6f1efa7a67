package timeline_test

import (
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/cosi-project/runtime/pkg/resource"
	"github.com/cosi-project/runtime/pkg/state"
	"github.com/cosi-project/runtime/pkg/state/impl/inmem"
	"github.com/cosi-project/runtime/pkg/state/impl/namespaced"
	"github.com/stretchr/testify/require"
	"go.uber.org/zap/zaptest"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/outpost-metal/outpost/controller/lifecycle"
	"github.com/outpost-metal/outpost/controller/resources"
	"github.com/outpost-metal/outpost/controller/timeline"
	bootpb "github.com/outpost-metal/outpost/shared/api/boot"
	"github.com/outpost-metal/outpost/shared/metal"
)

const m1 = "4c4c4544-0042-3510-8052-b4c04f4e3232"

type clock struct {
	mu sync.Mutex
	t  time.Time
}

func newClock() *clock { return &clock{t: time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)} }

func (c *clock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()

	c.t = c.t.Add(time.Second)

	return c.t
}

func event(k any) *bootpb.Event {
	e := &bootpb.Event{}

	switch k := k.(type) {
	case *bootpb.DHCPSeen:
		e.Kind = &bootpb.Event_DhcpSeen{DhcpSeen: k}
	case *bootpb.PXESeen:
		e.Kind = &bootpb.Event_PxeSeen{PxeSeen: k}
	case *bootpb.BootServed:
		e.Kind = &bootpb.Event_BootServed{BootServed: k}
	case *bootpb.AgentTunnel:
		e.Kind = &bootpb.Event_AgentTunnel{AgentTunnel: k}
	case *bootpb.PowerChanged:
		e.Kind = &bootpb.Event_PowerChanged{PowerChanged: k}
	case *bootpb.AssetFetch:
		e.Kind = &bootpb.Event_AssetFetch{AssetFetch: k}
	}

	return e
}

// bootOnce plays a machine's first network boot at site-a as its edge reports it.
func bootOnce(t *testing.T, b *timeline.Book, id string) {
	t.Helper()

	for _, e := range []*bootpb.Event{
		event(&bootpb.DHCPSeen{Mac: "52:54:00:12:34:56", Firmware: "uefi-x86", Relay: "10.9.0.1"}),
		event(&bootpb.PXESeen{RemoteIp: "10.0.0.50", File: "ipxe.efi", Via: "tftp"}),
		event(&bootpb.BootServed{Uuid: strings.ToUpper(id), Mac: "52:54:00:12:34:56", Arch: "x86_64", Mode: "agent", RemoteIp: "10.0.0.50", TableVersion: 3}),
		event(&bootpb.AgentTunnel{MachineId: id, Open: true, RemoteIp: "10.0.0.50"}),
	} {
		require.NoError(t, b.HandleEvent(t.Context(), "site-a", e))
	}
}

func kinds(rec timeline.Record) []string {
	out := make([]string, 0, len(rec.Entries))
	for _, e := range rec.Entries {
		out = append(out, e.Kind)
	}

	return out
}

// A first boot's DHCP request and firmware fetch name only addresses: they join the machine's timeline once a
// boot script ties those addresses to its UUID, in the order they happened.
func TestFirstBootInOrder(t *testing.T) {
	t.Parallel()

	b := timeline.New(timeline.DefaultConfig(), newClock().Now)
	bootOnce(t, b, m1)

	rec, ok := b.Get(m1)
	require.True(t, ok)
	require.Equal(t, []string{timeline.KindDHCP, timeline.KindPXE, timeline.KindBootServed, timeline.KindAgentUp}, kinds(rec))
	require.Equal(t, "site-a", rec.Site)
	require.True(t, rec.AgentConnected)
	require.Contains(t, rec.Entries[0].Text, "uefi-x86")
	require.Contains(t, rec.Entries[0].Text, "relayed by 10.9.0.1")
	require.Contains(t, rec.Entries[2].Text, "agent mode")
	require.Equal(t, []string{"52:54:00:12:34:56"}, rec.MACs)
	require.Equal(t, "amd64", rec.Arch)
	require.Equal(t, "uefi", rec.Firmware, "from the DHCP request's client class")

	// the next DHCP request from that MAC goes straight to the machine
	require.NoError(t, b.HandleEvent(t.Context(), "site-a", event(&bootpb.DHCPSeen{Mac: "52:54:00:12:34:56", Firmware: "bios", Ipxe: true})))
	rec, _ = b.Get(m1)
	require.Equal(t, timeline.KindDHCP, rec.Last.Kind)

	// the same MAC at another site is not this machine
	require.NoError(t, b.HandleEvent(t.Context(), "site-b", event(&bootpb.DHCPSeen{Mac: "52:54:00:12:34:56", Firmware: "bios"})))
	rec2, _ := b.Get(m1)
	require.Len(t, rec2.Entries, len(rec.Entries))
}

func TestBootModesAndErrors(t *testing.T) {
	t.Parallel()

	b := timeline.New(timeline.DefaultConfig(), newClock().Now)

	for _, e := range []*bootpb.Event{
		event(&bootpb.BootServed{Uuid: m1, Mode: "install"}),
		event(&bootpb.BootServed{Uuid: m1, Mode: "disk"}),
		event(&bootpb.PowerChanged{MachineId: m1, State: "unknown", Error: "rmcp+ timeout"}),
		event(&bootpb.AgentTunnel{MachineId: m1}),
		event(&bootpb.BootServed{Uuid: "not-a-uuid", Mode: "agent"}),
		event(&bootpb.PowerChanged{MachineId: m1, State: "exploded"}),
	} {
		require.NoError(t, b.HandleEvent(t.Context(), "site-a", e))
	}

	rec, _ := b.Get(m1)
	require.Equal(t, []string{timeline.KindInstallPlan, timeline.KindDiskBoot, timeline.KindPower, timeline.KindAgentDown}, kinds(rec))
	require.True(t, rec.Entries[2].Error)
	require.Contains(t, rec.Entries[2].Text, "rmcp+ timeout")

	list, total := b.List(timeline.Filter{}, 0, 0)
	require.Equal(t, 1, total, "the bad UUID made no machine")
	require.Equal(t, metal.ID(m1), list[0].ID)
}

// A timeline is capped and says how many entries it dropped; the same entry again is one entry, counted.
func TestCappedAndCoalesced(t *testing.T) {
	t.Parallel()

	cfg := timeline.DefaultConfig()
	cfg.MaxEntries = 5
	b := timeline.New(cfg, newClock().Now)

	for i := range 12 {
		b.Record(m1, timeline.KindLifecycle, fmt.Sprintf("step %d", i), false)
	}

	for range 3 {
		b.Record(m1, timeline.KindError, "power on: site offline", true)
	}

	rec, _ := b.Get(m1)
	require.Len(t, rec.Entries, 5)
	require.Equal(t, uint64(8), rec.Dropped)
	require.Equal(t, "step 8", rec.Entries[0].Text)
	require.Equal(t, 2, rec.Last.Repeats)
	require.True(t, rec.Last.Error)

	b.Record(m1, timeline.KindLifecycle, strings.Repeat("é", 1000), false)
	rec, _ = b.Get(m1)
	require.LessOrEqual(t, len(rec.Last.Text), cfg.MaxText+len("…"))
	require.True(t, strings.HasSuffix(rec.Last.Text, "…"))
}

// Entries held for addresses no machine has are bounded.
func TestPendingBounded(t *testing.T) {
	t.Parallel()

	cfg := timeline.DefaultConfig()
	cfg.MaxPending = 10
	cfg.MaxMachines = 3
	b := timeline.New(cfg, newClock().Now)

	for i := range 1000 {
		mac := fmt.Sprintf("02:00:00:00:%02x:%02x", i/256, i%256)
		require.NoError(t, b.HandleEvent(t.Context(), "site-a", event(&bootpb.DHCPSeen{Mac: mac, Firmware: "bios"})))
		require.NoError(t, b.HandleEvent(t.Context(), "site-a", event(&bootpb.BootServed{Uuid: fmt.Sprintf("00000000-0000-0000-0000-%012x", i), Mode: "agent"})))
	}

	_, total := b.List(timeline.Filter{}, 0, 0)
	require.Equal(t, 3, total, "edge events make at most MaxMachines machines")

	b.Summarize(m1, lifecycle.MachineSummary{Phase: lifecycle.PhaseReady, Site: "site-a"})
	_, total = b.List(timeline.Filter{}, 0, 0)
	require.Equal(t, 4, total, "the lifecycle's own machines are always tracked")
}

func TestListFiltersAndPages(t *testing.T) {
	t.Parallel()

	b := timeline.New(timeline.DefaultConfig(), newClock().Now)

	for i := range 30 {
		phase := lifecycle.PhaseReady
		if i%3 == 0 {
			phase = lifecycle.PhaseWiping
		}

		b.Summarize(fmt.Sprintf("00000000-0000-0000-0000-%012d", i), lifecycle.MachineSummary{Site: fmt.Sprintf("site-%d", i%2), Phase: phase})
	}

	page, total := b.List(timeline.Filter{Site: "site-0", Phase: lifecycle.PhaseWiping}, 1, 2)
	require.Equal(t, 5, total)
	require.Len(t, page, 2)
	require.Equal(t, metal.ID("00000000-0000-0000-0000-000000000006"), page[0].ID)

	page, total = b.List(timeline.Filter{}, 29, 10)
	require.Equal(t, 30, total)
	require.Len(t, page, 1)
	require.Equal(t, "site-1", page[0].Site)

	require.Equal(t, 5, b.Phases()["site-0"][lifecycle.PhaseWiping])
	require.Equal(t, 10, b.Phases()["site-0"][lifecycle.PhaseReady])
}

func newState(t *testing.T) (state.State, resources.Types) {
	t.Helper()

	return state.WrapCore(namespaced.NewState(inmem.Build)), resources.NewTypes("bare-metal")
}

// Timelines outlive the process: written to Omni coalesced, loaded back under what a new process recorded.
func TestPersistAndLoad(t *testing.T) {
	t.Parallel()

	st, types := newState(t)
	log := zaptest.NewLogger(t)
	require.NoError(t, types.RegisterTimeline())

	b := timeline.New(timeline.DefaultConfig(), newClock().Now)
	bootOnce(t, b, m1)
	b.Summarize(m1, lifecycle.MachineSummary{Site: "site-a", Phase: lifecycle.PhaseWiping, Power: "on", BMCAddress: "10.0.1.5", BMCProtocol: "ipmi"})

	require.Zero(t, b.Flush(t.Context(), st, types))

	stored, err := st.Get(t.Context(), types.NewMachineTimeline(m1).Metadata())
	require.NoError(t, err)

	version := stored.Metadata().Version()

	require.Zero(t, b.Flush(t.Context(), st, types))
	stored, err = st.Get(t.Context(), types.NewMachineTimeline(m1).Metadata())
	require.NoError(t, err)
	require.Equal(t, version, stored.Metadata().Version(), "nothing changed: nothing written")

	// a new process, an hour later: one event arrived before the records were loaded
	later := newClock()
	later.t = later.t.Add(time.Hour)
	next := timeline.New(timeline.DefaultConfig(), later.Now)
	require.NoError(t, next.HandleEvent(t.Context(), "site-a", event(&bootpb.AgentTunnel{MachineId: m1})))
	require.NoError(t, next.Load(t.Context(), st, types, log))

	rec, ok := next.Get(m1)
	require.True(t, ok)
	require.Equal(t, []string{timeline.KindDHCP, timeline.KindPXE, timeline.KindBootServed, timeline.KindAgentUp, timeline.KindPhase, timeline.KindAgentDown}, kinds(rec))
	require.Equal(t, lifecycle.PhaseWiping, rec.Phase)
	require.Equal(t, "10.0.1.5", rec.BMCAddress)
	require.Equal(t, []string{"52:54:00:12:34:56"}, rec.MACs)

	require.Zero(t, next.Flush(t.Context(), st, types))
	reloaded := timeline.New(timeline.DefaultConfig(), newClock().Now)
	require.NoError(t, reloaded.Load(t.Context(), st, types, log))
	got, _ := reloaded.Get(m1)
	require.Equal(t, kinds(rec), kinds(got), "the merged timeline was written back")
}

// A stored record is read back bounded: whoever can write the namespace cannot make it unbounded.
func TestFromSpecBoundsStrings(t *testing.T) {
	t.Parallel()

	spec := timeline.ToSpec(timeline.Record{Machine: timeline.Machine{Site: strings.Repeat("s", 10000), Phase: strings.Repeat("p", 500)},
		Entries: []timeline.Entry{{At: time.Now(), Kind: strings.Repeat("k", 100), Text: strings.Repeat("t", 5000)}}})
	spec.Entries = append(spec.Entries, nil)
	spec.Entries[0].Time = &timestamppb.Timestamp{Seconds: -1 << 62}

	rec := timeline.FromSpec(spec, 100)
	require.LessOrEqual(t, len(rec.Site), 104)
	require.LessOrEqual(t, len(rec.Phase), 68)
	require.LessOrEqual(t, len(rec.Entries[0].Text), 104)
	require.True(t, rec.Entries[0].At.IsZero())
}

// The same failure again (a site offline for an hour, retried every poll) is counted on the last entry at
// once, but written to Omni only with the machine's next real change or after RepeatWriteInterval: one
// write per retry was most of the controller's Omni traffic with 1,000 machines behind offline sites.
func TestRepeatsWrittenLazily(t *testing.T) {
	t.Parallel()

	st, types := newState(t)
	require.NoError(t, types.RegisterTimeline())

	clk := newClock() // a second passes at every reading
	cfg := timeline.DefaultConfig()
	cfg.RepeatWriteInterval = time.Hour
	b := timeline.New(cfg, clk.Now)

	version := func() resource.Version {
		stored, err := st.Get(t.Context(), types.NewMachineTimeline(m1).Metadata())
		require.NoError(t, err)

		return stored.Metadata().Version()
	}

	b.Record(m1, "error", "power step: site offline", true)
	require.Zero(t, b.Flush(t.Context(), st, types))
	first := version()

	for range 3 {
		b.Record(m1, "error", "power step: site offline", true)
	}

	require.Zero(t, b.Flush(t.Context(), st, types))
	require.Equal(t, first, version(), "repeats alone are not written at once")

	rec, _ := b.Get(m1)
	require.Equal(t, 3, rec.Last.Repeats, "but counted at once")

	clk.mu.Lock()
	clk.t = clk.t.Add(time.Hour)
	clk.mu.Unlock()

	require.Zero(t, b.Flush(t.Context(), st, types))
	second := version()
	require.NotEqual(t, first, second, "written once the repeat interval passed")

	b.Record(m1, "error", "power step: site offline", true)
	b.Record(m1, "power", "powered on", false)
	require.Zero(t, b.Flush(t.Context(), st, types))
	require.NotEqual(t, second, version(), "a real change writes at once, with the repeats before it")
}

func TestWaitForAssetsNamesThem(t *testing.T) {
	t.Parallel()

	b := timeline.New(timeline.DefaultConfig(), newClock().Now)

	require.NoError(t, b.HandleEvent(t.Context(), "site-a", event(&bootpb.BootServed{
		Uuid: m1, Mode: "wait", WaitingFor: "install",
		MissingAssets: []string{"talos/v1.11.5/abc/amd64/kernel", "talos/v1.11.5/abc/amd64/initramfs.xz\x1b[2J"},
	})))

	rec, _ := b.Get(m1)
	require.Equal(t, []string{timeline.KindAssetWait}, kinds(rec))
	require.True(t, rec.Last.Error)
	require.Equal(t, `waits to boot install mode: the site does not hold its boot assets yet: missing talos/v1.11.5/abc/amd64/kernel, talos/v1.11.5/abc/amd64/initramfs.xz\x1b[2J`, rec.Last.Text)
}

// Asset downloads name only the machine's address: they join the timeline of the machine whose boot script
// went to that address, a whole one as done, one stopped early as an error saying how far it got.
func TestAssetFetches(t *testing.T) {
	t.Parallel()

	b := timeline.New(timeline.DefaultConfig(), newClock().Now)

	for _, e := range []*bootpb.Event{
		event(&bootpb.BootServed{Uuid: m1, Mac: "52:54:00:12:34:56", Mode: "agent", RemoteIp: "10.0.0.50"}),
		event(&bootpb.AssetFetch{RemoteIp: "10.0.0.50", File: "agent/x86_64/vmlinuz", Sent: 7 << 20, Size: 7 << 20}),
		event(&bootpb.AssetFetch{RemoteIp: "10.0.0.50", File: "agent/x86_64/initramfs.xz", Sent: 1 << 20, Size: 40 << 20, Error: "connection reset by peer"}),
		event(&bootpb.AssetFetch{RemoteIp: "not an address", File: "x"}),
		event(&bootpb.AssetFetch{RemoteIp: "10.0.0.99", File: "\x1b]0;owned", Size: 1}),
	} {
		require.NoError(t, b.HandleEvent(t.Context(), "site-a", e))
	}

	rec, _ := b.Get(m1)
	require.Equal(t, []string{timeline.KindBootServed, timeline.KindAssetFetch, timeline.KindAssetFetch}, kinds(rec))
	require.Equal(t, "downloaded agent/x86_64/vmlinuz (7.0 MiB)", rec.Entries[1].Text)
	require.False(t, rec.Entries[1].Error)
	require.Equal(t, "download of agent/x86_64/initramfs.xz stopped after 1.0 MiB of 40.0 MiB: connection reset by peer", rec.Entries[2].Text)
	require.True(t, rec.Entries[2].Error)
}

// A DHCP request naming its machine (option 97) from a MAC no boot script tied yet starts that machine's
// timeline; the MAC is its own from then on. A request naming none is held for whichever machine boots from it.
func TestDHCPNamesItsMachine(t *testing.T) {
	t.Parallel()

	b := timeline.New(timeline.DefaultConfig(), newClock().Now)

	for _, e := range []*bootpb.Event{
		event(&bootpb.DHCPSeen{Mac: "52:54:00:00:00:0a", Firmware: "bios", Uuid: strings.ToUpper(m1)}),
		event(&bootpb.DHCPSeen{Mac: "52:54:00:00:00:0a", Firmware: "bios", Ipxe: true}),
		event(&bootpb.DHCPSeen{Mac: "52:54:00:00:00:0b", Firmware: "bios", Uuid: "not-a-uuid"}),
	} {
		require.NoError(t, b.HandleEvent(t.Context(), "site-a", e))
	}

	rec, ok := b.Get(m1)
	require.True(t, ok, "known by the UUID its DHCP request named")
	require.Equal(t, []string{timeline.KindDHCP, timeline.KindDHCP}, kinds(rec))
	require.Equal(t, []string{"52:54:00:00:00:0a"}, rec.MACs)
	require.Equal(t, "bios", rec.Firmware)

	_, total := b.List(timeline.Filter{}, 0, 0)
	require.Equal(t, 1, total, "a bad UUID makes no machine")
}

// A machine its edge offered nothing for a reason of its own has it in its timeline, by name: an error when it
// cannot boot (no signed image for a Secure Boot machine), not when its plan is its disk.
func TestDHCPNotAnswered(t *testing.T) {
	t.Parallel()

	b := timeline.New(timeline.DefaultConfig(), newClock().Now)

	for _, e := range []*bootpb.Event{
		event(&bootpb.DHCPSeen{Mac: "52:54:00:00:00:0a", Firmware: "uefi-x86", Uuid: m1, NotAnswered: "no_signed_boot_file"}),
		event(&bootpb.DHCPSeen{Mac: "52:54:00:00:00:0a", Firmware: "uefi-x86", Uuid: m1, NotAnswered: "secure_boot_disk_plan"}),
		event(&bootpb.DHCPSeen{Mac: "52:54:00:00:00:0a", Firmware: "uefi-x86", Uuid: m1, NotAnswered: "\x1b[2Jsomething new"}),
		event(&bootpb.DHCPSeen{Mac: "52:54:00:00:00:0a", Firmware: "uefi-x86", Uuid: m1, NotAnswered: "signed_image_not_at_site"}),
		event(&bootpb.DHCPSeen{Mac: "52:54:00:00:00:0a", Firmware: "uefi-x86", Uuid: m1, NotAnswered: "signed_image_needs_http_boot"}),
	} {
		require.NoError(t, b.HandleEvent(t.Context(), "site-a", e))
	}

	rec, ok := b.Get(m1)
	require.True(t, ok)
	require.Len(t, rec.Entries, 5)
	require.Contains(t, rec.Entries[3].Text, "offered nothing, it enforces Secure Boot and its site's edge does not hold its signed image yet")
	require.Contains(t, rec.Entries[4].Text, "offered nothing, it enforces Secure Boot and asked by PXE")
	require.True(t, rec.Entries[4].Error)

	require.Contains(t, rec.Entries[0].Text, "offered nothing, it enforces Secure Boot and the site has no signed image for it")
	require.True(t, rec.Entries[0].Error)
	require.Contains(t, rec.Entries[1].Text, "offered nothing, it enforces Secure Boot and its plan is its disk")
	require.False(t, rec.Entries[1].Error, "the disk plan is no failure")
	require.NotContains(t, rec.Entries[2].Text, "\x1b", "a reason this controller does not know is printed safely")
}

// The diagnosis names a refused offer, until an answered request follows.
func TestDiagnosisNotOffered(t *testing.T) {
	t.Parallel()

	clock := newClock()
	b := timeline.New(timeline.DefaultConfig(), clock.Now)

	require.NoError(t, b.HandleEvent(t.Context(), "site-a",
		event(&bootpb.DHCPSeen{Mac: "52:54:00:00:00:0a", Firmware: "uefi-x86", Uuid: m1, NotAnswered: "no_signed_boot_file"})))

	rec, _ := b.Get(m1)
	require.Contains(t, timeline.Diagnose(rec, clock.Now()), "its edge offered its DHCP request at")
	require.Contains(t, timeline.Diagnose(rec, clock.Now()), "no signed image for it")

	require.NoError(t, b.HandleEvent(t.Context(), "site-a", event(&bootpb.DHCPSeen{Mac: "52:54:00:00:00:0a", Firmware: "uefi-x86", Uuid: m1})))

	rec, _ = b.Get(m1)
	require.NotContains(t, timeline.Diagnose(rec, clock.Now()), "offered", "an answered request since")
}

// A machine that enforces Secure Boot runs no boot script: the fetch of its signed image is its boot served,
// and its timeline says so.
func TestSignedImageServed(t *testing.T) {
	t.Parallel()

	b := timeline.New(timeline.DefaultConfig(), newClock().Now)

	for _, mode := range []string{"agent", "install"} {
		require.NoError(t, b.HandleEvent(t.Context(), "site-a", event(&bootpb.BootServed{
			Uuid: m1, Mac: "52:54:00:00:00:0a", Mode: mode, RemoteIp: "10.0.0.9", SignedImage: "talos/v1.11.5/abc/amd64/secureboot-uki.efi",
		})))
	}

	rec, ok := b.Get(m1)
	require.True(t, ok)
	require.Len(t, rec.Entries, 2)
	require.Contains(t, rec.Entries[0].Text, "signed image served: agent mode (10.0.0.9")
	require.Contains(t, rec.Entries[1].Text, "install plan served as a signed image (10.0.0.9")
}
