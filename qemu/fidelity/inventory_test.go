package fidelity_test

import (
	"context"
	"fmt"
	"net"
	"net/http/httptest"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/cosi-project/runtime/pkg/resource"
	"github.com/cosi-project/runtime/pkg/safe"
	cosilabels "github.com/siderolabs/omni/client/pkg/cosi/labels"
	omnires "github.com/siderolabs/omni/client/pkg/omni/resources/omni"
	"github.com/stretchr/testify/require"
	"go.uber.org/zap/zaptest"

	"github.com/outpost-metal/outpost/controller/labels"
	"github.com/outpost-metal/outpost/controller/lifecycle/lifecycletest"
	controlleromni "github.com/outpost-metal/outpost/controller/omni"
	"github.com/outpost-metal/outpost/controller/resources/specs"
	"github.com/outpost-metal/outpost/edge/bmc"
	"github.com/outpost-metal/outpost/qemu/fidelity"
	"github.com/outpost-metal/outpost/qemu/omni"
	"github.com/outpost-metal/outpost/qemu/vbmc"
	bmcpb "github.com/outpost-metal/outpost/shared/api/bmc"
	bootpb "github.com/outpost-metal/outpost/shared/api/boot"
)

// The machines of TestInventoryLabels: one behind a Redfish BMC, one behind an IPMI BMC with FRU data, one behind
// an IPMI BMC without (no inventory to give).
const (
	invRedfish = "0b6e4a4c-1f2d-4c3b-9a8e-5d7f6c1b2a11"
	invFRU     = "0b6e4a4c-1f2d-4c3b-9a8e-5d7f6c1b2a12"
	invBare    = "0b6e4a4c-1f2d-4c3b-9a8e-5d7f6c1b2a13"
)

// labBMC is one machine's virtual BMC on loopback.
type labBMC struct {
	ipmi     *vbmc.IPMI
	ipmiPort int
	rf       *vbmc.Redfish // nil: IPMI only
	rfURL    string
}

// edgeBMCs is the edge's BMC service (edge/bmc, as the edge serves it over the uplink) in front of the machines'
// virtual BMCs: the controller's inventory reads go through it.
type edgeBMCs struct {
	svc *bmc.Service

	mu       sync.Mutex
	machines map[string]labBMC
}

// Inventory implements lifecycle.InventoryClient. The BMC user the controller provisioned through the (fake)
// agent is created on the virtual BMC first, as the agent does in-band; the edge then probes Redfish and falls
// back to IPMI as it does for every BMC.
func (e *edgeBMCs) Inventory(ctx context.Context, _, machineID string, spec *specs.BMCConfigurationSpec) (*bmcpb.InventoryResponse, error) {
	e.mu.Lock()
	m, ok := e.machines[machineID]
	e.mu.Unlock()

	if !ok {
		return nil, fmt.Errorf("no lab bmc for %s", machineID)
	}

	user, password := spec.GetIpmi().GetUsername(), spec.GetIpmi().GetPassword()
	if err := m.ipmi.SetUser(user, password); err != nil {
		return nil, err
	}

	if m.rf != nil {
		m.rf.SetAccount(user, password)
	}

	return e.svc.Inventory(ctx, &bmcpb.PowerRequest{Target: &bmcpb.Target{
		MachineId: machineID, Host: "127.0.0.1", IpmiPort: uint32(m.ipmiPort), RedfishEndpoint: m.rfURL,
		Protocol: bmcpb.Protocol_PROTOCOL_AUTO, Username: user, Password: password,
	}})
}

// startLabBMC serves a virtual BMC for one machine: IPMI (with FRU data when fru is set) and, with redfish set,
// a Redfish service with that inventory.
func startLabBMC(t *testing.T, redfish, fru *vbmc.Hardware) labBMC {
	t.Helper()

	ch := vbmc.NewChassis()

	ipmiBMC, err := vbmc.NewIPMI(ch, "admin", "admin-password")
	require.NoError(t, err)

	if fru != nil {
		require.NoError(t, ipmiBMC.SetHardware(*fru))
	}

	conn, err := net.ListenUDP("udp", &net.UDPAddr{IP: net.IPv4(127, 0, 0, 1)})
	require.NoError(t, err)

	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)

	go func() { done <- ipmiBMC.Serve(ctx, conn) }()

	t.Cleanup(func() { cancel(); require.NoError(t, <-done) })

	m := labBMC{ipmi: ipmiBMC, ipmiPort: conn.LocalAddr().(*net.UDPAddr).Port, rfURL: "http://127.0.0.1:1"} // nothing listens: IPMI

	if redfish != nil {
		m.rf = vbmc.NewRedfish(ch, vbmc.RedfishOptions{User: "admin", Password: "admin-password", Hardware: redfish})
		srv := httptest.NewServer(m.rf)
		t.Cleanup(srv.Close)
		m.rfURL = srv.URL
	}

	return m
}

// TestInventoryLabels: labels derived from a BMC's hardware inventory select machines through a MachineClass in
// a real Omni. Three machines join and are accepted: one behind a Redfish BMC, one behind an IPMI BMC with FRU
// data, one behind an IPMI BMC without. The controller reads each inventory through the edge's BMC service and
// publishes it on the InfraMachineStatus; Omni copies the labels onto its MachineStatus. MachineClasses that select
// on them are created in Omni (which validates their selectors) and their selectors, parsed as Omni's allocation
// parses them, pick exactly the machines with those labels. (Omni allocates from a class only machines whose Talos
// reports events over SideroLink, which these machines, not being Talos, never do: the selection is checked with
// Omni's own parser and label matching on Omni's MachineStatus.)
func TestInventoryLabels(t *testing.T) {
	t.Parallel()

	b, reason := startRealOmni(t)
	if b == nil {
		t.Skip(reason)
	}

	ctx, cancel := context.WithTimeout(t.Context(), 5*time.Minute)
	defer cancel()

	mgrCfg := bmc.Default()
	mgrCfg.CallTimeout, mgrCfg.ProbeTimeout = 10*time.Second, time.Second

	mgr, err := bmc.New(mgrCfg, zaptest.NewLogger(t).Named("edge-bmc"), nil)
	require.NoError(t, err)
	t.Cleanup(mgr.Close)

	redfishHW := vbmc.Hardware{
		Manufacturer: "Outpost Lab", Model: "RF-1000", SerialNumber: "RF-0001", CPUs: 2, CPUModel: "Lab CPU @ 2.10GHz",
		MemoryGiB: 16, DiskBytes: 480 << 30, NICSpeedMbps: 25000, BIOSVersion: "1.16.3", BMCFirmware: "vbmc 1.0",
		SecureBoot: true,
	}
	fruHW := vbmc.Hardware{Manufacturer: "Outpost Lab", Model: "FRU-2000", SerialNumber: "FRU-0002", BIOSVersion: "2.0"}

	bmcs := &edgeBMCs{svc: bmc.NewService(mgr), machines: map[string]labBMC{
		invRedfish: startLabBMC(t, &redfishHW, nil),
		invFRU:     startLabBMC(t, nil, &fruHW),
		invBare:    startLabBMC(t, nil, nil),
	}}

	r := &run{t: t, b: b, edge: lifecycletest.NewFakeEdge(t), tr: &transcript{}, admin: omni.NewAdmin(b.Admin()),
		jc: make(chan controlleromni.JoinConfig, 1), inventory: bmcs}
	r.startController(ctx)

	for _, id := range []string{invRedfish, invFRU, invBare} {
		r.edge.Add(id, "site-a")
		_, err := fidelity.Provision(ctx, b, id)
		require.NoError(t, err)
		r.eventually("infra machine "+id, func() bool { return r.machine(ctx, id) != nil })
		require.NoError(t, r.admin.Accept(ctx, id))
	}

	prefix := fmt.Sprintf(omnires.InfraProviderLabelPrefixFormat, b.Controller().ProviderID)

	machineLabels := func(id string) map[string]string {
		ms, err := safe.StateGetByID[*omnires.MachineStatus](ctx, b.Admin(), id)
		if err != nil {
			return nil
		}

		out := map[string]string{}

		for k, v := range ms.Metadata().Labels().Raw() {
			if key, ok := strings.CutPrefix(k, prefix); ok {
				out[key] = v
			}
		}

		return out
	}

	r.eventually("inventory labels on Omni's machine statuses", func() bool {
		return machineLabels(invRedfish)[labels.Model] == "RF-1000" && machineLabels(invFRU)[labels.Model] == "FRU-2000" &&
			machineLabels(invBare)[labels.Site] == "site-a"
	})

	require.Equal(t, map[string]string{
		labels.Site: "site-a", labels.InventorySource: "redfish", labels.Vendor: "Outpost-Lab", labels.Model: "RF-1000",
		labels.Serial: "RF-0001", labels.CPUCount: "2", labels.CPUModel: "Lab-CPU-2.10GHz", labels.MemoryGiB: "16",
		labels.DiskCount: "1", labels.DiskLargestGiB: "480", labels.DiskSizesGiB: "480", labels.NICSpeedMbps: "25000",
		labels.BIOSVersion: "1.16.3", labels.BMCFirmware: "vbmc-1.0", labels.SecureBoot: "on",
	}, machineLabels(invRedfish), "the Redfish BMC's whole inventory")

	// What the Redfish BMC said of Secure Boot is in the plan the machine's edge holds: it is offered only the
	// signed image. The IPMI machines' BMCs do not say, nor do their plans (the edge's own setting decides).
	r.eventually("the Redfish machine's plan says Secure Boot", func() bool {
		m := r.edge.Machine(invRedfish)

		return m.AckedSeen && m.Acked.SecureBoot == bootpb.SecureBoot_SECURE_BOOT_ON
	})
	require.Equal(t, bootpb.SecureBoot_SECURE_BOOT_UNSPECIFIED, r.edge.Machine(invFRU).Acked.SecureBoot)
	require.Equal(t, bootpb.SecureBoot_SECURE_BOOT_UNSPECIFIED, r.edge.Machine(invBare).Acked.SecureBoot)
	require.Equal(t, map[string]string{
		labels.Site: "site-a", labels.InventorySource: "ipmi", labels.Vendor: "Outpost-Lab", labels.Model: "FRU-2000", labels.Serial: "FRU-0002",
	}, machineLabels(invFRU), "what the FRU data has")
	require.Equal(t, map[string]string{labels.Site: "site-a"}, machineLabels(invBare), "no FRU data: no inventory labels")

	for _, tc := range []struct {
		class     string
		selectors []string
		want      []string
	}{
		{class: "redfish-rf-1000", selectors: []string{prefix + labels.Model + " = RF-1000"}, want: []string{invRedfish}},
		{
			class:     "ipmi-fru-2000",
			selectors: []string{prefix + labels.Model + " = FRU-2000, " + prefix + labels.InventorySource + " = ipmi"},
			want:      []string{invFRU},
		},
		{class: "outpost-lab", selectors: []string{prefix + labels.Vendor + " = Outpost-Lab"}, want: []string{invRedfish, invFRU}},
		{class: "big-nics", selectors: []string{prefix + labels.NICSpeedMbps + " >= 10000"}, want: []string{invRedfish}},
	} {
		mc := omnires.NewMachineClass(tc.class)
		mc.TypedSpec().Value.MatchLabels = tc.selectors
		require.NoError(t, b.Admin().Create(ctx, mc), "Omni takes the class %s", tc.class)

		stored, err := safe.StateGetByID[*omnires.MachineClass](ctx, b.Admin(), tc.class)
		require.NoError(t, err)

		queries, err := cosilabels.ParseSelectors(stored.TypedSpec().Value.MatchLabels)
		require.NoError(t, err)

		statuses, err := safe.StateListAll[*omnires.MachineStatus](ctx, b.Admin())
		require.NoError(t, err)

		var picked []string

		for _, q := range queries {
			matched := statuses.FilterLabelQuery(resource.RawLabelQuery(q))

			for ms := range matched.All() {
				if !slices.Contains(picked, ms.Metadata().ID()) {
					picked = append(picked, ms.Metadata().ID())
				}
			}
		}

		slices.Sort(picked)
		require.Equal(t, tc.want, picked, "machine class %s (%s) picks", tc.class, strings.Join(tc.selectors, "; "))
		t.Logf("machine class %s (%s) picks %v", tc.class, strings.Join(tc.selectors, "; "), picked)
	}
}
