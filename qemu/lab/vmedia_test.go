package lab_test

import (
	"context"
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/outpost-metal/outpost/qemu/bootlab"
	"github.com/outpost-metal/outpost/qemu/lab"
)

// TestVirtualMediaBoot runs a site with no DHCP at all (its server gone, the edge set to --dhcp off) and a UEFI
// machine with a Redfish BMC whose address is reserved (controller site machine add --ip). The operator boots
// it once (controller site machine boot): the edge builds the agent-mode image, the BMC mounts it through
// Redfish VirtualMedia into the machine's CD-ROM drive, and OVMF boots it; the machine comes up at its
// reserved address, reaches agent mode and is pending in Omni. It is accepted (BMC provisioned through its
// agent, disk wiped), allocated: the lifecycle boots it from the install image the same way, and it installs
// and boots its disk. Judged by the firmware itself (OVMF booting the image, QEMU reading it by ranges over
// HTTP) and the console of the machine's own init.
//
// OMNI chooses the Omni as for TestE2E (real by default). Root, QEMU (TCG). Logs and timeline.md stay under
// _out/vmedia/<real|standin>.
func TestVirtualMediaBoot(t *testing.T) {
	ctx, a, bins, _ := airGapLab(t, "vmedia", 60*time.Minute, "cache")

	loader, err := lab.VMediaLoader(ctx, bootlab.RepoRoot(t))
	if err != nil {
		t.Fatal(err)
	}

	v := &vmediaRun{steps: steps{t, a}, t: t, ctx: ctx, a: a, site: a.Sites[0]}
	reserved := netip.MustParseAddr("10.77.1.60")

	v.step("the site has no DHCP at all: its server gone, the edge set to --dhcp off, the machine's address reserved", func() error {
		return v.noDHCP(bins.Edge, loader, "52:54:00:f1:0c:01", reserved)
	})

	m, err := a.Env.AddMachine(ctx, v.site, lab.MachineSpec{
		Name: "vmedia-uefi", UUID: "0e5a1ab0-0000-4000-8000-0000000f0c01", MAC: "52:54:00:f1:0c:01",
		Firmware: lab.UEFI, BMC: lab.Redfish, VirtualMedia: true, RunTimeout: 20 * time.Minute,
	})
	if err != nil {
		t.Fatal(err)
	}

	var agentImage string

	v.step("the operator boots it once: its BMC mounts the edge's image, it comes up at its reserved address in agent mode, pending in Omni", func() error {
		agentImage, err = v.firstBoot(m, reserved)

		return err
	})
	v.step("accepted: BMC provisioned through its agent, disk wiped", func() error { return a.AcceptAndSettle(ctx, m) })
	v.step("allocated: the lifecycle boots the install image through the BMC, it installs and boots its disk", func() error {
		return v.install(m, reserved, agentImage)
	})
}

type vmediaRun struct {
	steps

	t    *testing.T
	ctx  context.Context
	a    *lab.AirGap
	site *lab.Site
}

func (v *vmediaRun) noDHCP(edgeBin, loader, mac string, reserved netip.Addr) error {
	v.site.DHCP.Kill()

	from := v.a.Edges[0].Log.Size()
	v.a.Edges[0].Kill()

	p, err := v.site.StartEdge(v.ctx, edgeBin, lab.EdgeOptions{Restart: true, ExtraArgs: []string{"--vmedia-loader", loader}})
	if err != nil {
		return err
	}

	v.a.Edges[0] = p

	if err := p.Log.WaitFor(v.ctx, from, `"uplink connected"`, 2*time.Minute); err != nil {
		return err
	}

	for _, args := range [][]string{
		{"site", "set", v.site.Name, "--dhcp", "off", "--dhcp-subnet", v.site.Subnet(), "--dhcp-gateway", v.site.EdgeIP()},
		{"site", "machine", "add", v.site.Name, mac, "--ip", reserved.String()},
	} {
		if out, err := v.a.Controller.Command(v.ctx, 30*time.Second, args...); err != nil {
			return fmt.Errorf("controller %s: %w: %s", strings.Join(args, " "), err, out)
		}
	}

	return nil
}

// firstBoot is the operator's first boot; it returns the image the machine booted.
func (v *vmediaRun) firstBoot(m *lab.Machine, reserved netip.Addr) (string, error) {
	user, password := m.BMCAdmin()

	pwFile := filepath.Join(v.site.Dir, m.Spec.Name+".bmc-password")
	if err := os.WriteFile(pwFile, []byte(password+"\n"), 0o600); err != nil {
		return "", err
	}

	from := m.Serial.Size()

	// The edge holds the reservation once the site's next table reaches it, and the agent's kernel once its
	// cache has fetched it (the site's policy is cache): asked again while it says it lacks either.
	var out string

	for deadline := time.Now().Add(5 * time.Minute); ; {
		var err error

		out, err = v.a.Controller.Command(v.ctx, 2*time.Minute, "site", "machine", "boot", v.site.Name, m.Spec.MAC,
			"--bmc-endpoint", m.RedfishEndpoint(), "--bmc-user", user, "--bmc-password-file", pwFile)

		switch {
		case err == nil:
		case (strings.Contains(out, "no address is reserved") || strings.Contains(out, "does not hold")) && time.Now().Before(deadline):
			if err := sleepCtx(v.ctx, time.Second); err != nil {
				return "", err
			}

			continue
		default:
			return "", fmt.Errorf("site machine boot: %w: %s", err, out)
		}

		break
	}

	for _, want := range []string{m.Spec.UUID, reserved.String() + "/24", "/vmedia/", "agent mode"} {
		if !strings.Contains(out, want) {
			return "", fmt.Errorf("site machine boot printed %q, without %q", out, want)
		}
	}

	if err := m.WaitSerial(v.ctx, from, lab.AgentStartMarker, 5*time.Minute); err != nil {
		return "", err
	}

	got, err := address(m, from)
	if err != nil {
		return "", err
	}

	if got != reserved {
		return "", fmt.Errorf("the machine came up at %s, its reserved address is %s", got, reserved)
	}

	boot := m.LastBoot()
	if !boot.CD || !strings.Contains(boot.Image, "/vmedia/") {
		return "", fmt.Errorf("the boot was not from the virtual cd: %+v", boot)
	}

	v.t.Logf("first boot: %s", strings.TrimSpace(out))

	return boot.Image, v.a.WaitPending(v.ctx, m, 5*time.Minute)
}

func (v *vmediaRun) install(m *lab.Machine, reserved netip.Addr, agentImage string) error {
	from := m.Serial.Size()
	firstBoot := len(m.Boots())

	if err := v.a.Allocate(v.ctx, m, "vmedia"); err != nil {
		return err
	}

	if err := v.a.WaitInstalled(v.ctx, m, from); err != nil {
		return err
	}

	boots := m.Boots()[firstBoot:]

	var install *lab.BootRecord

	for i := range boots {
		if boots[i].CD {
			install = &boots[i]
		}
	}

	switch {
	case install == nil:
		return fmt.Errorf("no boot from the virtual cd after the allocation: %+v", boots)
	case install.Image == agentImage || !strings.Contains(install.Image, "/vmedia/"):
		return fmt.Errorf("the install boot's image %q is not a new image of the edge's (agent mode's was %q)", install.Image, agentImage)
	case m.LastBoot().CD:
		return fmt.Errorf("the disk boot was a cd boot: %+v", m.LastBoot())
	}

	got, err := address(m, install.SerialOffset)
	if err != nil {
		return err
	}

	if got != reserved {
		return fmt.Errorf("the install boot came up at %s, its reserved address is %s", got, reserved)
	}

	return nil
}
