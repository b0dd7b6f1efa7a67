package lifecycle_test

import (
	"context"
	"errors"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/cosi-project/runtime/pkg/safe"
	"github.com/cosi-project/runtime/pkg/state"
	"github.com/cosi-project/runtime/pkg/state/impl/inmem"
	"github.com/cosi-project/runtime/pkg/state/impl/namespaced"
	"github.com/siderolabs/omni/client/pkg/omni/resources/infra"
	"github.com/stretchr/testify/require"
	"google.golang.org/protobuf/proto"

	"github.com/outpost-metal/outpost/controller/bootplans"
	"github.com/outpost-metal/outpost/controller/labels"
	"github.com/outpost-metal/outpost/controller/lifecycle"
	"github.com/outpost-metal/outpost/controller/lifecycle/lifecycletest"
	"github.com/outpost-metal/outpost/controller/machines"
	"github.com/outpost-metal/outpost/controller/resources"
	"github.com/outpost-metal/outpost/controller/resources/specs"
	"github.com/outpost-metal/outpost/controller/timeline"
	bmcpb "github.com/outpost-metal/outpost/shared/api/bmc"
	bootpb "github.com/outpost-metal/outpost/shared/api/boot"
)

// fakeInventory answers inventory reads with what the test sets and records the BMCs asked.
type fakeInventory struct {
	mu    sync.Mutex
	resp  *bmcpb.InventoryResponse
	err   error
	asked []string // BMC addresses
}

func (f *fakeInventory) Inventory(_ context.Context, _, _ string, bmc *specs.BMCConfigurationSpec) (*bmcpb.InventoryResponse, error) {
	f.mu.Lock()
	defer f.mu.Unlock()

	f.asked = append(f.asked, bmc.GetIpmi().GetAddress())

	return f.resp, f.err
}

func (f *fakeInventory) set(resp *bmcpb.InventoryResponse, err error) {
	f.mu.Lock()
	defer f.mu.Unlock()

	f.resp, f.err = resp, err
}

func (f *fakeInventory) calls() int {
	f.mu.Lock()
	defer f.mu.Unlock()

	return len(f.asked)
}

func newInventoryHarness(t *testing.T, inv lifecycle.InventoryClient, configure ...func(*lifecycle.Config)) *harness {
	t.Helper()

	h := &harness{
		t: t, st: state.WrapCore(namespaced.NewState(inmem.Build)), edge: lifecycletest.NewFakeEdge(t), clock: &fakeClock{},
		types: resources.NewTypes(providerID), stats: lifecycle.NewMetrics(), policies: machines.NewSitePolicies(),
		inventory: inv, configure: configure,
	}

	require.NoError(t, h.types.Register())
	h.start()
	t.Cleanup(h.stop)

	return h
}

// TestInventoryLabelsPublished: a machine's inventory is read once its BMC is configured, kept in its
// MachineInventory and published as labels; polls do not read it again, the refresh interval and a failed read
// do, and a failure keeps the labels of the last good read.
func TestInventoryLabelsPublished(t *testing.T) {
	t.Parallel()

	const interval = 600 * time.Millisecond // 30 poll intervals

	inv := &fakeInventory{resp: &bmcpb.InventoryResponse{
		Protocol: bmcpb.Protocol_PROTOCOL_REDFISH, Manufacturer: "Dell Inc.", Model: "PowerEdge R640", CpuCount: 2,
		MemoryGib: 384, DiskCount: 2, DiskBytes: []uint64{480 << 30, 1920 << 30}, NicSpeedsMbps: []uint32{25000},
		BiosVersion: "2.19.1", BmcFirmware: "\x1b[31m7.00 (build 171)",
	}}
	h := newInventoryHarness(t, inv, func(c *lifecycle.Config) { c.InventoryInterval = interval })
	h.stop()

	book := timeline.New(timeline.DefaultConfig(), h.clock.Now)
	h.journal = book
	h.start()

	h.edge.Add("m1", "site-a")
	h.omni("m1", accepted)

	labelsOf := func() map[string]string {
		st, err := safe.StateGetByID[*infra.MachineStatus](t.Context(), h.st, "m1")
		if err != nil {
			return nil
		}

		return st.Metadata().Labels().Raw()
	}

	h.eventually("inventory labels", func() bool {
		l := labelsOf()

		return l[labels.Vendor] == "Dell-Inc" && l[labels.Model] == "PowerEdge-R640" && l[labels.DiskSizesGiB] == "1920_480" &&
			l[labels.BMCFirmware] == "31m7.00-build-171" && l[labels.NICSpeedMbps] == "25000" && l[labels.Site] == "site-a"
	})

	rec, err := safe.StateGet[*resources.MachineInventory](t.Context(), h.st, h.types.NewMachineInventory("m1").Metadata())
	require.NoError(t, err)
	require.Equal(t, "redfish", rec.TypedSpec().Value.GetProtocol())
	require.Equal(t, "outpost@10.0.0.1:623", rec.TypedSpec().Value.GetBmc())

	// The status pages name the machine by its hardware and say which protocol the edge settled on.
	h.eventually("hardware in the machine's summary", func() bool {
		rec, _ := book.Get("m1")

		return rec.Hardware == "Dell Inc. PowerEdge R640, 2 CPUs, 384 GiB" && rec.DrivenOver == "redfish"
	})

	require.Never(t, func() bool { return inv.calls() > 1 }, interval/3, tick, "read again within the refresh interval (polls every 20ms)")

	// the refresh interval passes: read again; this time the BMC fails, the labels of the last read stay
	inv.set(nil, errors.New("bmc busy"))
	h.eventually("read again after the interval", func() bool { return inv.calls() >= 2 })
	h.eventually("failure recorded", func() bool {
		rec, err := safe.StateGet[*resources.MachineInventory](t.Context(), h.st, h.types.NewMachineInventory("m1").Metadata())

		return err == nil && strings.Contains(rec.TypedSpec().Value.GetError(), "bmc busy")
	})
	require.Equal(t, "Dell-Inc", labelsOf()[labels.Vendor])

	// a failure is tried again sooner (interval/24), and a good answer replaces the labels
	inv.set(&bmcpb.InventoryResponse{Protocol: bmcpb.Protocol_PROTOCOL_IPMI, Manufacturer: "Supermicro", SerialNumber: "S1"}, nil)
	h.eventually("new labels after the retry", func() bool {
		l := labelsOf()
		_, model := l[labels.Model]

		return l[labels.Vendor] == "Supermicro" && l[labels.InventorySource] == "ipmi" && l[labels.Serial] == "S1" && !model
	})
	h.eventually("the new read in the machine's summary", func() bool {
		rec, _ := book.Get("m1")

		return rec.Hardware == "Supermicro" && rec.DrivenOver == "ipmi"
	})
}

// TestSecureBootFromBMC: what a machine's BMC says of Secure Boot reaches the plan its edge holds, the site's
// setting comes before it, and a BMC that stops saying leaves the plan unsaid (the edge's own setting decides).
// The machine's observation says what the plans say and who said it.
func TestSecureBootFromBMC(t *testing.T) {
	t.Parallel()

	const interval = 600 * time.Millisecond // 30 poll intervals

	on := true
	inv := &fakeInventory{resp: &bmcpb.InventoryResponse{Protocol: bmcpb.Protocol_PROTOCOL_REDFISH, Manufacturer: "Acme", SecureBoot: &on}}
	h := newInventoryHarness(t, inv, func(c *lifecycle.Config) { c.InventoryInterval = interval })

	h.edge.Add("m1", "site-a")
	h.omni("m1", accepted)

	says := func(want bootpb.SecureBoot, source string) func() bool {
		return func() bool {
			obs, err := safe.StateGet[*resources.MachineObservation](t.Context(), h.st, h.types.NewMachineObservation("m1").Metadata())
			if err != nil {
				return false
			}

			m := h.edge.Machine("m1")

			return m.AckedSeen && m.Acked.SecureBoot == want &&
				obs.TypedSpec().Value.GetSecureBoot() == want && obs.TypedSpec().Value.GetSecureBootSource() == source
		}
	}

	h.eventually("the BMC's answer in the plan", says(bootpb.SecureBoot_SECURE_BOOT_ON, "bmc"))

	require.NoError(t, h.policies.Set("site-a", machines.SitePolicy{SecureBoot: bootpb.SecureBoot_SECURE_BOOT_OFF}))
	h.eventually("the site's setting over the BMC's", says(bootpb.SecureBoot_SECURE_BOOT_OFF, "site"))

	require.NoError(t, h.policies.Set("site-a", machines.SitePolicy{}))
	h.eventually("handed back to the BMC", says(bootpb.SecureBoot_SECURE_BOOT_ON, "bmc"))

	inv.set(&bmcpb.InventoryResponse{Protocol: bmcpb.Protocol_PROTOCOL_IPMI, Manufacturer: "Acme"}, nil)
	h.eventually("a BMC that does not say: nobody says", says(bootpb.SecureBoot_SECURE_BOOT_UNSPECIFIED, ""))
}

// A machine that enforces Secure Boot gets a signed image of its own only once its edge has said how machines
// reach it (the image's command line is locked, so the controller has the address baked in): until then its
// plan names none (the edge's own signed file); the edge's word wakes the plan, and another address is
// another image. The observation carries the reach, so that a change re-plans the machine.
func TestSignedImageFollowsEdgeReach(t *testing.T) {
	t.Parallel()

	on := true
	inv := &fakeInventory{resp: &bmcpb.InventoryResponse{Protocol: bmcpb.Protocol_PROTOCOL_REDFISH, SecureBoot: &on}}
	h := newInventoryHarness(t, inv, func(c *lifecycle.Config) { c.InventoryInterval = 600 * time.Millisecond })

	h.edge.Add("m1", "site-a")
	h.omni("m1", accepted)

	plan := func(pred func(p bootplans.Plan, obs *specs.MachineObservationSpec) bool) func() bool {
		return func() bool {
			obs, err := safe.StateGet[*resources.MachineObservation](t.Context(), h.st, h.types.NewMachineObservation("m1").Metadata())
			if err != nil {
				return false
			}

			m := h.edge.Machine("m1")

			return m.AckedSeen && m.Acked.SecureBoot == bootpb.SecureBoot_SECURE_BOOT_ON && pred(m.Acked, obs.TypedSpec().Value)
		}
	}

	h.eventually("Secure Boot on, the edge silent: no signed image", plan(func(p bootplans.Plan, _ *specs.MachineObservationSpec) bool {
		return p.SignedURL == "" && p.KernelURL != ""
	}))

	reach := &bootpb.Reach{HttpBase: "http://10.0.0.2:8080", AgentAddress: "10.0.0.2:50000"}
	h.edge.SetReach("site-a", reach)

	var first string

	h.eventually("the edge said: a signed image, no kernel", plan(func(p bootplans.Plan, obs *specs.MachineObservationSpec) bool {
		first = p.SignedURL

		return p.SignedURL != "" && p.KernelURL == "" && proto.Equal(obs.GetEdgeReach(), reach)
	}))

	h.edge.SetReach("site-a", &bootpb.Reach{HttpBase: "http://10.0.0.3:8080", AgentAddress: "10.0.0.3:50000"})
	h.eventually("another address, another signed image", plan(func(p bootplans.Plan, _ *specs.MachineObservationSpec) bool {
		return p.SignedURL != "" && p.SignedURL != first
	}))
}
