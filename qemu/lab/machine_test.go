package lab_test

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/siderolabs/omni/client/api/omni/specs"
	agentpb "github.com/siderolabs/talos-metal-agent/api/agent"
	"github.com/stretchr/testify/require"
	"google.golang.org/grpc/metadata"

	"github.com/outpost-metal/outpost/qemu/lab"
	bootpb "github.com/outpost-metal/outpost/shared/api/boot"
)

// TestMachineSide drives the lab's machine side with the test playing the controller through siteedge
// (the edge without an uplink): each machine PXE-boots agent mode through its site's edge, joins the Omni stand-in (pending), has
// BMC credentials provisioned in-band through its agent (then checked against its virtual BMC over the
// site network), its disk really zeroed (checked on the host) and is powered off through its BMC; then it
// PXE-boots the install plan once, writes its OS and reports the install, and boots that OS from disk
// with no further network boot.
func TestMachineSide(t *testing.T) {
	skipUnlessLab(t)

	l, images, root := newLab(t, "lab-machine-side")
	ctx := t.Context()

	standinBin := build(t, l, root, "./qemu/omni/cmd/omnistandin")
	edgeBin := build(t, l, root, "./qemu/lab/cmd/siteedge")

	core, err := l.AddCore()
	require.NoError(t, err)

	o, err := l.StartStandIn(ctx, core, standinBin)
	require.NoError(t, err)

	joinConfig, err := o.JoinConfig(ctx)
	require.NoError(t, err)

	tl := lab.NewTimeline(filepath.Join(l.Dir, "timeline.md"))

	for i, c := range []struct {
		name     string
		firmware lab.Firmware
		bmc      lab.BMCKind
	}{
		{"bios-ipmi", lab.BIOS, lab.IPMI},
		{"uefi-redfish", lab.UEFI, lab.Redfish},
	} {
		t.Run(c.name, func(t *testing.T) {
			site, err := l.AddSite(core, i+1)
			require.NoError(t, err)

			edge, err := site.StartSiteEdge(ctx, edgeBin, images.AssetsDir)
			require.NoError(t, err)

			_, err = edge.BootPlans.Apply(ctx, &bootpb.ApplyRequest{Change: &bootpb.ApplyRequest_Snapshot{Snapshot: &bootpb.Table{
				Version: 1, KernelArgs: []string{"console=ttyS0"}, Config: joinConfig,
			}}})
			require.NoError(t, err)

			uuid := fmt.Sprintf("0e5a1ab0-0000-4000-8000-0000000000%02d", i+1)
			m, err := site.AddMachine(ctx, lab.MachineSpec{
				Name: c.name, UUID: uuid, MAC: fmt.Sprintf("52:54:00:0e:00:%02d", i+1), Firmware: c.firmware, BMC: c.bmc,
			})
			require.NoError(t, err)

			m.OnInstalled = func(*lab.Machine) {
				if err := o.Admin.ReportInstalled(context.Background(), uuid); err != nil {
					t.Errorf("report install: %v", err)
				}
			}

			start := time.Now()

			err = m.PowerOnToAgent(ctx, 4*time.Minute)
			tl.Step("power-on to agent start (edge)", c.name, start, err)
			require.NoError(t, err)
			err = m.WaitSerial(ctx, 0, "OUTPOST-PROVISIONED", time.Minute)
			tl.Step("power-on to joined Omni (edge)", c.name, start, err)
			require.NoError(t, err)

			ms, err := o.Admin.List(ctx)
			require.NoError(t, err)

			found := false

			for _, row := range ms {
				if row.ID == uuid {
					found = true

					require.Equal(t, specs.InfraMachineConfigSpec_PENDING.String(), row.Spec.AcceptanceStatus.String())
				}
			}

			require.True(t, found, "machine %s not in the stand-in", uuid)

			agent := agentpb.NewAgentServiceClient(edge.Conn)
			actx := metadata.AppendToOutgoingContext(ctx, "machine-id", uuid)

			var pm *agentpb.GetPowerManagementResponse

			require.Eventually(t, func() bool {
				pm, err = agent.GetPowerManagement(actx, &agentpb.GetPowerManagementRequest{
					Ipmi: &agentpb.GetPowerManagementRequest_IPMI{CheckUsername: "outpost"}, Api: &agentpb.GetPowerManagementRequest_API{},
				})

				return err == nil
			}, time.Minute, 500*time.Millisecond, "agent tunnel never answered: %v", err)
			require.Equal(t, m.BMCAddress, pm.GetIpmi().GetAddress())
			require.False(t, pm.GetIpmi().GetUserExists())

			password := randomPassword(t)
			_, err = agent.SetPowerManagement(actx, &agentpb.SetPowerManagementRequest{
				Ipmi: &agentpb.SetPowerManagementRequest_IPMI{Username: "outpost", Password: password},
			})
			require.NoError(t, err)

			checkBMC(t, site, m, "outpost", password, "on")

			_, err = agent.WipeDisks(actx, &agentpb.WipeDisksRequest{Zeroes: true})
			require.NoError(t, err)

			zero, err := m.DiskZeroed()
			require.NoError(t, err)
			require.True(t, zero, "disk not zeroed after WipeDisks")

			require.NoError(t, bmcPower(t, site, m, "outpost", password, false))
			require.Eventually(t, func() bool { return !m.Running() }, 30*time.Second, 200*time.Millisecond)

			// Allocate: the install plan, one-time PXE, power on.
			_, err = edge.BootPlans.Apply(ctx, &bootpb.ApplyRequest{Change: &bootpb.ApplyRequest_Delta{Delta: &bootpb.Delta{
				BaseVersion: 1, Version: 2, Upsert: []*bootpb.Plan{{Uuid: uuid, Mode: bootpb.Mode_MODE_INSTALL, Install: &bootpb.Kernel{
					KernelUrl: "/assets/install/x86_64/vmlinuz", InitrdUrl: "/assets/install/x86_64/initramfs.xz",
				}}},
			}}})
			require.NoError(t, err)

			from := m.Serial.Size()
			start = time.Now()

			require.NoError(t, bmcPXEOnce(t, site, m, "outpost", password))
			require.NoError(t, bmcPower(t, site, m, "outpost", password, true))
			require.NoError(t, m.WaitSerial(ctx, from, "OUTPOST-INSTALL-REPORTED", 4*time.Minute))

			// The controller hands the machine to its disk once the install is reported.
			_, err = edge.BootPlans.Apply(ctx, &bootpb.ApplyRequest{Change: &bootpb.ApplyRequest_Delta{Delta: &bootpb.Delta{
				BaseVersion: 2, Version: 3, Upsert: []*bootpb.Plan{{Uuid: uuid, Mode: bootpb.Mode_MODE_DISK}},
			}}})
			require.NoError(t, err)

			marker := "OUTPOST-INSTALLED-OS " + uuid + " " + string(c.firmware)
			err = m.WaitSerial(ctx, from, marker, 2*time.Minute)
			tl.Step("install plan to installed OS booted from disk", c.name, start, err)
			require.NoError(t, err)

			last := m.LastBoot()
			require.Equal(t, "guest-reboot", last.Reason)
			require.False(t, last.PXE)

			diskBoot := string(m.Serial.Since(last.SerialOffset))
			for _, netboot := range []string{"iPXE", "PXE over IPv4", ">>Start PXE"} {
				require.NotContains(t, diskBoot, netboot, "the disk boot touched the network")
			}

			require.Eventually(t, func() bool {
				ms, err := o.Admin.List(ctx)
				if err != nil {
					return false
				}

				for _, row := range ms {
					if row.ID == uuid {
						return row.Spec.InstallEventId > 0
					}
				}

				return false
			}, 10*time.Second, 200*time.Millisecond, "install event not counted by the stand-in")

			m.PowerOffNow()
			require.NoError(t, m.Failures())
		})

		// The same machine booted by a bare dnsmasq (DHCP + TFTP) and static files, for comparison.
		t.Run("bare-"+string(c.firmware), func(t *testing.T) {
			site, err := l.AddBareSite(ctx, 8+i, images)
			require.NoError(t, err)

			m, err := site.AddMachine(ctx, lab.MachineSpec{
				Name: "bare-" + string(c.firmware), UUID: fmt.Sprintf("0e5a1ab0-0000-4000-8000-0000000000%02d", i+1),
				MAC: fmt.Sprintf("52:54:00:0e:00:%02d", i+1), Firmware: c.firmware, BMC: c.bmc,
			})
			require.NoError(t, err)

			start := time.Now()

			err = m.PowerOnToAgent(ctx, 4*time.Minute)
			tl.Step("power-on to agent start (bare dnsmasq + static files)", m.Spec.Name, start, err)
			require.NoError(t, err)
			m.PowerOffNow()
		})
	}

	require.NoError(t, tl.Write())

	b, err := os.ReadFile(tl.Path)
	require.NoError(t, err)
	t.Logf("\n%s", b)
}

func randomPassword(t *testing.T) string {
	b := make([]byte, 8)
	_, err := rand.Read(b)
	require.NoError(t, err)

	return hex.EncodeToString(b)
}

func checkBMC(t *testing.T, site *lab.Site, m *lab.Machine, user, password, power string) {
	t.Helper()

	if m.Spec.BMC == lab.Redfish {
		out, err := curlRedfish(site, m, user, password, "GET", "/redfish/v1/Systems/1", "")
		require.NoError(t, err, out)
		require.Contains(t, strings.ToLower(out), `"powerstate":"`+power+`"`)

		return
	}

	out, err := ipmitool(t, site.NS, m.BMCAddress, user, password, "chassis", "power", "status")
	require.NoError(t, err, out)
	require.Contains(t, out, "Chassis Power is "+power)
}
