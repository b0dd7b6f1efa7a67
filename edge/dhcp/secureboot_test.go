package dhcp_test

import (
	"net"
	"net/netip"
	"testing"

	"github.com/insomniacslk/dhcp/dhcpv4"
	"github.com/stretchr/testify/require"

	"github.com/outpost-metal/outpost/edge/dhcp"
	bootpb "github.com/outpost-metal/outpost/shared/api/boot"
	"github.com/outpost-metal/outpost/shared/metal"
)

// plan is what a boot table's plan says of a machine: its disk, and its Secure Boot ("on", "off", "": unsaid).
type plan struct {
	disk       bool
	secureBoot string
	signed     *bootpb.SignedImage
}

// plans is a boot table by MAC.
type plans map[string]plan

func (plans) SNPOnly(net.HardwareAddr, string) bool { return false }

func (p plans) Known(mac net.HardwareAddr, _ string) bool {
	_, ok := p[mac.String()]

	return ok
}

func (plans) Discovery() string { return "" }

func (p plans) DiskPlan(mac net.HardwareAddr, _ string) bool { return p[mac.String()].disk }

func (p plans) SecureBoot(mac net.HardwareAddr, _ string) (bool, bool) {
	sb := p[mac.String()].secureBoot

	return sb == "on", sb != ""
}

func (p plans) SignedImage(mac net.HardwareAddr, _ string, _ metal.Arch) *bootpb.SignedImage {
	return p[mac.String()].signed
}

// A machine that enforces Secure Boot gets the signed image and nothing else: never iPXE, never the script,
// never a BIOS file; without a signed image it is refused by name, and when its plan is its disk it is offered
// nothing (no signed image can hand it to the disk), so its firmware goes on to the disk. Its plan, when it
// says, comes before the edge's own --secure-boot setting, either way.
func TestDecideSecureBoot(t *testing.T) {
	t.Parallel()

	signed := params()
	signed.Files.UEFIx86Signed = "outpost-agent-x86_64.efi"
	signed.Files.SecureBoot = []string{testMAC.String()}

	site := signed
	site.Files.SecureBoot = []string{"*"}

	other := signed
	other.Files.SecureBoot = []string{"02:00:00:00:00:99", "not a mac"}

	none := signed
	none.Files.UEFIx86Signed = ""

	missing := signed
	missing.Bootable = func(name string) bool { return name != "outpost-agent-x86_64.efi" }

	http := "http://" + testServer.String() + ":8080/tftp/outpost-agent-x86_64.efi"

	disk := signed
	disk.Prefs = plans{testMAC.String(): {disk: true}}

	otherDisk := signed
	otherDisk.Prefs = plans{"02:00:00:00:00:99": {disk: true}}

	diskNoSB := params()
	diskNoSB.Prefs = plans{testMAC.String(): {disk: true}}

	// The plan says, the edge's own setting does not (or says the other thing).
	planOn := none
	planOn.Files.UEFIx86Signed, planOn.Files.SecureBoot = signed.Files.UEFIx86Signed, nil
	planOn.Prefs = plans{testMAC.String(): {secureBoot: "on"}}

	planOff := site
	planOff.Prefs = plans{testMAC.String(): {secureBoot: "off"}}

	planUnsaid := site
	planUnsaid.Prefs = plans{testMAC.String(): {}}

	planOnDisk := planOn
	planOnDisk.Prefs = plans{testMAC.String(): {disk: true, secureBoot: "on"}}

	// The plan names a signed image (a Talos UKI the controller resolved for this machine).
	uki := &bootpb.SignedImage{
		Url:         "/assets/talos/v1.11.5/abc/amd64/secureboot-uki.efi",
		UpstreamUrl: "https://factory.invalid/image/abc/v1.11.5/metal-amd64-secureboot-uki.efi",
	}
	held := func(name string) bool { return name == "talos/v1.11.5/abc/amd64/secureboot-uki.efi" }

	planUKI := planOn
	planUKI.Prefs = plans{testMAC.String(): {secureBoot: "on", signed: uki}}
	planUKI.Held = held

	ukiComing := planUKI
	ukiComing.Held = func(string) bool { return false }

	ukiPassthrough := ukiComing
	ukiPassthrough.Upstream = func() bool { return true }

	ukiAbsolute := planOn
	ukiAbsolute.Prefs = plans{testMAC.String(): {secureBoot: "on", signed: &bootpb.SignedImage{Url: "http://10.9.9.9/uki.efi"}}}

	ukiARM := planUKI
	ukiARM.Files.UEFIx86Signed = ""

	ukiDisk := planUKI
	ukiDisk.Prefs = plans{testMAC.String(): {disk: true, secureBoot: "on", signed: uki}}

	for _, tc := range []struct {
		name string
		p    dhcp.Params
		mods []dhcpv4.Modifier
		file string
		drop dhcp.DropReason
	}{
		{name: "plan's signed image over http boot", p: planUKI, mods: []dhcpv4.Modifier{arch(16), pxeClass("HTTPClient:Arch:00016")},
			file: "http://" + testServer.String() + ":8080" + uki.GetUrl()},
		{name: "plan's signed image named for the machine", p: planUKI,
			mods: []dhcpv4.Modifier{arch(16), pxeClass("HTTPClient:Arch:00016"), dhcpv4.WithGeneric(dhcpv4.OptionClientMachineIdentifier, testGUID)},
			file: "http://" + testServer.String() + ":8080" + uki.GetUrl() + "?uuid=44332211-6655-8877-99aa-bbccddeeff00&mac=" + testMAC.String()},
		{name: "plan's signed image for arm64", p: ukiARM, mods: []dhcpv4.Modifier{arch(19), pxeClass("HTTPClient:Arch:00019")},
			file: "http://" + testServer.String() + ":8080" + uki.GetUrl()},
		{name: "plan's signed image not at the site yet", p: ukiComing, mods: []dhcpv4.Modifier{arch(16), pxeClass("HTTPClient:Arch:00016")}, drop: dhcp.DropSignedNotHeld},
		{name: "plan's signed image upstream at a passthrough site", p: ukiPassthrough, mods: []dhcpv4.Modifier{arch(16), pxeClass("HTTPClient:Arch:00016")}, file: uki.GetUpstreamUrl()},
		{name: "plan's absolute signed image", p: ukiAbsolute, mods: []dhcpv4.Modifier{arch(16), pxeClass("HTTPClient:Arch:00016")}, file: "http://10.9.9.9/uki.efi"},
		{name: "plan's signed image never by tftp", p: planUKI, mods: []dhcpv4.Modifier{arch(7), pxeClass("PXEClient:Arch:00007")}, drop: dhcp.DropSignedNeedsHTTP},
		{name: "plan's signed image, disk plan", p: ukiDisk, mods: []dhcpv4.Modifier{arch(16), pxeClass("HTTPClient:Arch:00016")}, drop: dhcp.DropSecureBootDisk},
		{name: "pxe", p: signed, mods: []dhcpv4.Modifier{arch(7), pxeClass("PXEClient:Arch:00007")}, file: "outpost-agent-x86_64.efi"},
		{name: "every machine at the site", p: site, mods: []dhcpv4.Modifier{arch(7), pxeClass("PXEClient:Arch:00007")}, file: "outpost-agent-x86_64.efi"},
		{name: "http boot", p: signed, mods: []dhcpv4.Modifier{arch(16), pxeClass("HTTPClient:Arch:00016")}, file: http},
		{name: "another machine gets iPXE", p: other, mods: []dhcpv4.Modifier{arch(7), pxeClass("PXEClient:Arch:00007")}, file: "ipxe.efi"},
		{name: "bios is not secure boot", p: site, mods: []dhcpv4.Modifier{arch(0), pxeClass("PXEClient:Arch:00000")}, file: "undionly.kpxe"},
		{name: "ipxe asking", p: signed, mods: []dhcpv4.Modifier{arch(7), pxeClass("PXEClient:Arch:00007"), dhcpv4.WithUserClass("iPXE", false)}, drop: dhcp.DropNoSignedFile},
		{name: "arm64 has no signed file", p: signed, mods: []dhcpv4.Modifier{arch(11), pxeClass("PXEClient:Arch:00011")}, drop: dhcp.DropNoSignedFile},
		{name: "no signed file", p: none, mods: []dhcpv4.Modifier{arch(7), pxeClass("PXEClient:Arch:00007")}, drop: dhcp.DropNoSignedFile},
		{name: "signed file not served", p: missing, mods: []dhcpv4.Modifier{arch(16), pxeClass("HTTPClient:Arch:00016")}, drop: dhcp.DropNoSignedFile},
		{name: "disk plan", p: disk, mods: []dhcpv4.Modifier{arch(7), pxeClass("PXEClient:Arch:00007")}, drop: dhcp.DropSecureBootDisk},
		{name: "disk plan over http boot", p: disk, mods: []dhcpv4.Modifier{arch(16), pxeClass("HTTPClient:Arch:00016")}, drop: dhcp.DropSecureBootDisk},
		{name: "another machine's disk plan", p: otherDisk, mods: []dhcpv4.Modifier{arch(7), pxeClass("PXEClient:Arch:00007")}, file: "outpost-agent-x86_64.efi"},
		{name: "disk plan without secure boot gets ipxe", p: diskNoSB, mods: []dhcpv4.Modifier{arch(7), pxeClass("PXEClient:Arch:00007")}, file: "ipxe.efi"},
		{name: "plan says on", p: planOn, mods: []dhcpv4.Modifier{arch(7), pxeClass("PXEClient:Arch:00007")}, file: "outpost-agent-x86_64.efi"},
		{name: "plan says on over http boot", p: planOn, mods: []dhcpv4.Modifier{arch(16), pxeClass("HTTPClient:Arch:00016")}, file: http},
		{name: "plan says off at a secure boot site", p: planOff, mods: []dhcpv4.Modifier{arch(7), pxeClass("PXEClient:Arch:00007")}, file: "ipxe.efi"},
		{name: "plan unsaid: the site's setting", p: planUnsaid, mods: []dhcpv4.Modifier{arch(7), pxeClass("PXEClient:Arch:00007")}, file: "outpost-agent-x86_64.efi"},
		{name: "plan says on, disk plan", p: planOnDisk, mods: []dhcpv4.Modifier{arch(7), pxeClass("PXEClient:Arch:00007")}, drop: dhcp.DropSecureBootDisk},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()

			d := dhcp.Decide(tc.p, dhcp.RoleDHCP, netip.AddrPort{}, request(t, dhcpv4.MessageTypeDiscover, tc.mods...))
			require.Equal(t, tc.drop, d.Drop, "%v", d.Err)

			if tc.drop != "" {
				require.Nil(t, d.Reply)

				return
			}

			require.Equal(t, tc.file, d.BootFile)
			require.Equal(t, tc.file, d.Reply.BootFileName)
		})
	}
}
