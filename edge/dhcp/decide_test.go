package dhcp_test

import (
	"encoding/binary"
	"net"
	"net/netip"
	"strings"
	"testing"

	"github.com/insomniacslk/dhcp/dhcpv4"
	"github.com/stretchr/testify/require"

	"github.com/outpost-metal/outpost/edge/dhcp"
	bootpb "github.com/outpost-metal/outpost/shared/api/boot"
	"github.com/outpost-metal/outpost/shared/metal"
)

var (
	testMAC    = net.HardwareAddr{0x52, 0x54, 0x00, 0x12, 0x34, 0x56}
	testServer = netip.MustParseAddr("10.20.0.2")
	testGUID   = []byte{0, 0x11, 0x22, 0x33, 0x44, 0x55, 0x66, 0x77, 0x88, 0x99, 0xaa, 0xbb, 0xcc, 0xdd, 0xee, 0xff, 0x00}
)

type snpPrefs map[string]bool

func (p snpPrefs) SNPOnly(mac net.HardwareAddr, _ string) bool { return p[mac.String()] }

// Known: every MAC named in the map is in the boot table.
func (p snpPrefs) Known(mac net.HardwareAddr, _ string) bool { _, ok := p[mac.String()]; return ok }

func (snpPrefs) Discovery() string { return "" }

func (snpPrefs) DiskPlan(net.HardwareAddr, string) bool { return false }

func (snpPrefs) SecureBoot(net.HardwareAddr, string) (bool, bool) { return false, false }

func (snpPrefs) SignedImage(net.HardwareAddr, string, metal.Arch) *bootpb.SignedImage { return nil }

// sitePolicy is a boot table whose controller set the site's discovery policy.
type sitePolicy struct {
	snpPrefs

	discovery string
}

func (p sitePolicy) Discovery() string { return p.discovery }

// Discovery policy and ProxyDHCP mode: who is answered on which port.
func TestDecidePolicies(t *testing.T) {
	t.Parallel()

	known := snpPrefs{testMAC.String(): false}
	stranger := snpPrefs{"00:00:00:00:00:01": false}

	for _, tc := range []struct {
		name      string
		discovery dhcp.Discovery
		mode      dhcp.Mode
		prefs     dhcp.Preferences
		role      dhcp.Role
		mt        dhcpv4.MessageType
		want      dhcp.DropReason
	}{
		{name: "all answers a stranger", discovery: dhcp.DiscoverAll, prefs: stranger, role: dhcp.RoleDHCP, mt: dhcpv4.MessageTypeDiscover},
		{name: "known answers a known machine", discovery: dhcp.DiscoverKnown, prefs: known, role: dhcp.RoleDHCP, mt: dhcpv4.MessageTypeDiscover},
		{name: "known ignores a stranger", discovery: dhcp.DiscoverKnown, prefs: stranger, role: dhcp.RoleDHCP, mt: dhcpv4.MessageTypeDiscover,
			want: dhcp.DropUnknownMachine},
		{name: "known with no table ignores all", discovery: dhcp.DiscoverKnown, role: dhcp.RolePXE, mt: dhcpv4.MessageTypeRequest,
			want: dhcp.DropUnknownMachine},
		{name: "off answers nobody", discovery: dhcp.DiscoverOff, prefs: known, role: dhcp.RolePXE, mt: dhcpv4.MessageTypeRequest,
			want: dhcp.DropDiscoveryOff},
		{name: "4011-only leaves 67 to the site", mode: dhcp.Mode4011Only, role: dhcp.RoleDHCP, mt: dhcpv4.MessageTypeDiscover,
			want: dhcp.DropMode4011Only},
		{name: "4011-only answers 4011", mode: dhcp.Mode4011Only, role: dhcp.RolePXE, mt: dhcpv4.MessageTypeRequest},
		{name: "the controller's known overrides the edge's all", discovery: dhcp.DiscoverAll,
			prefs: sitePolicy{stranger, "known"}, role: dhcp.RoleDHCP, mt: dhcpv4.MessageTypeDiscover, want: dhcp.DropUnknownMachine},
		{name: "the controller's all overrides the edge's off", discovery: dhcp.DiscoverOff,
			prefs: sitePolicy{stranger, "all"}, role: dhcp.RoleDHCP, mt: dhcpv4.MessageTypeDiscover},
		{name: "the controller's off overrides the edge's known", discovery: dhcp.DiscoverKnown,
			prefs: sitePolicy{known, "off"}, role: dhcp.RolePXE, mt: dhcpv4.MessageTypeRequest, want: dhcp.DropDiscoveryOff},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()

			p := params()
			p.Discovery, p.Mode, p.Prefs = tc.discovery, tc.mode, tc.prefs

			d := dhcp.Decide(p, tc.role, netip.MustParseAddrPort("10.0.0.9:68"), request(t, tc.mt, arch(0)))
			require.Equal(t, tc.want, d.Drop, "%v", d.Err)
			require.Equal(t, tc.want == "", d.Reply != nil)
		})
	}
}

func params() dhcp.Params {
	return dhcp.Params{ServerIP: testServer, HTTPPort: 8080, Files: dhcp.DefaultBootFiles()}
}

func arch(code uint16) dhcpv4.Modifier {
	v := make([]byte, 2)
	binary.BigEndian.PutUint16(v, code)

	return dhcpv4.WithGeneric(dhcpv4.OptionClientSystemArchitectureType, v)
}

func request(t *testing.T, mt dhcpv4.MessageType, mods ...dhcpv4.Modifier) []byte {
	t.Helper()

	base := []dhcpv4.Modifier{
		dhcpv4.WithHwAddr(testMAC),
		dhcpv4.WithMessageType(mt),
		dhcpv4.WithTransactionID(dhcpv4.TransactionID{1, 2, 3, 4}),
	}

	p, err := dhcpv4.New(append(base, mods...)...)
	require.NoError(t, err)

	return p.ToBytes()
}

func pxeClass(class string) dhcpv4.Modifier {
	return dhcpv4.WithGeneric(dhcpv4.OptionClassIdentifier, []byte(class))
}

func TestDecideFirmwareClasses(t *testing.T) {
	t.Parallel()

	for _, tc := range []struct {
		name     string
		arch     uint16
		ipxe     dhcpv4.Modifier
		prefs    dhcp.Preferences
		firmware dhcp.Firmware
		file     string
		class    string
	}{
		{name: "bios", arch: 0, firmware: dhcp.FirmwareBIOS, file: "undionly.kpxe", class: "PXEClient"},
		{name: "uefi ia32 (6)", arch: 6, firmware: dhcp.FirmwareUEFIx86, file: "ipxe.efi", class: "PXEClient"},
		{name: "uefi x86-64 (7)", arch: 7, firmware: dhcp.FirmwareUEFIx86, file: "ipxe.efi", class: "PXEClient"},
		{name: "uefi x86-64 (9)", arch: 9, firmware: dhcp.FirmwareUEFIx86, file: "ipxe.efi", class: "PXEClient"},
		{
			name: "uefi x86-64 snp-only machine", arch: 7, prefs: snpPrefs{testMAC.String(): true},
			firmware: dhcp.FirmwareUEFIx86, file: "snponly.efi", class: "PXEClient",
		},
		{
			name: "uefi x86-64 other machine keeps ipxe.efi", arch: 7, prefs: snpPrefs{"00:00:00:00:00:01": true},
			firmware: dhcp.FirmwareUEFIx86, file: "ipxe.efi", class: "PXEClient",
		},
		{name: "uefi arm64 (11)", arch: 11, firmware: dhcp.FirmwareUEFIARM64, file: "snp-arm64.efi", class: "PXEClient"},
		{name: "u-boot arm64 (22)", arch: 22, firmware: dhcp.FirmwareUEFIARM64, file: "snp-arm64.efi", class: "PXEClient"},
		{name: "http boot x86 (15)", arch: 15, firmware: dhcp.FirmwareHTTPx86, file: "http://10.20.0.2:8080/tftp/ipxe.efi", class: "HTTPClient"},
		{name: "http boot x86-64 (16)", arch: 16, firmware: dhcp.FirmwareHTTPx86, file: "http://10.20.0.2:8080/tftp/ipxe.efi", class: "HTTPClient"},
		{name: "http boot arm64 (19)", arch: 19, firmware: dhcp.FirmwareHTTPARM64, file: "http://10.20.0.2:8080/tftp/snp-arm64.efi", class: "HTTPClient"},
		{name: "u-boot http arm64 (24)", arch: 24, firmware: dhcp.FirmwareHTTPARM64, file: "http://10.20.0.2:8080/tftp/snp-arm64.efi", class: "HTTPClient"},
		{
			name: "ipxe by option 77", arch: 0, ipxe: dhcpv4.WithGeneric(dhcpv4.OptionUserClassInformation, []byte("iPXE")),
			firmware: dhcp.FirmwareBIOS, file: "http://10.20.0.2:8080/ipxe/init.ipxe", class: "PXEClient",
		},
		{
			name: "ipxe by option 77 in rfc 3004 form", arch: 7, ipxe: dhcpv4.WithUserClass("iPXE", true),
			firmware: dhcp.FirmwareUEFIx86, file: "http://10.20.0.2:8080/ipxe/init.ipxe", class: "PXEClient",
		},
		{
			name: "ipxe by option 175", arch: 7, ipxe: dhcpv4.WithGeneric(dhcpv4.GenericOptionCode(175), []byte{0xb1, 0x05, 0x01, 0x80, 0x86, 0x10, 0x0e}),
			firmware: dhcp.FirmwareUEFIx86, file: "http://10.20.0.2:8080/ipxe/init.ipxe", class: "PXEClient",
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()

			p := params()
			p.Prefs = tc.prefs

			mods := []dhcpv4.Modifier{arch(tc.arch), pxeClass(tc.class + ":Arch:00007:UNDI:003000")}
			if tc.ipxe != nil {
				mods = append(mods, tc.ipxe)
			}

			d := dhcp.Decide(p, dhcp.RoleDHCP, netip.AddrPort{}, request(t, dhcpv4.MessageTypeDiscover, mods...))
			require.NotNil(t, d.Reply, "dropped: %s %v", d.Drop, d.Err)
			require.Equal(t, tc.firmware, d.Firmware)
			require.Equal(t, tc.file, d.BootFile)
			require.Equal(t, tc.file, d.Reply.BootFileName, "file header")
			require.Equal(t, tc.file, d.Reply.BootFileNameOption(), "option 67")
			require.Equal(t, tc.class, d.Reply.ClassIdentifier(), "option 60")

			if tc.class == "PXEClient" {
				require.Equal(t, []byte{6, 1, 8, 255}, d.Reply.Options.Get(dhcpv4.OptionVendorSpecificInformation), "option 43")
			}
		})
	}
}

func TestDecideReplyFields(t *testing.T) {
	t.Parallel()

	agentInfo := []byte{1, 4, 'p', 'o', 'r', 't', 2, 2, 'r', '1'}
	relay := net.IPv4(10, 30, 0, 1).To4()

	for _, tc := range []struct {
		name    string
		role    dhcp.Role
		msg     dhcpv4.MessageType
		peer    netip.AddrPort
		mods    []dhcpv4.Modifier
		wantMT  dhcpv4.MessageType
		wantDst string
		check   func(t *testing.T, reply *dhcpv4.DHCPv4)
	}{
		{
			name: "discover on 67 is an offer broadcast to 68", role: dhcp.RoleDHCP, msg: dhcpv4.MessageTypeDiscover,
			wantMT: dhcpv4.MessageTypeOffer, wantDst: "255.255.255.255:68",
		},
		{
			// A site DHCP server's boot menu (dnsmasq pxe-service naming the edge) sends the client here with
			// a boot item: iPXE takes the answer only when it names the same item.
			name: "a boot-server discovery request gets its boot item back", role: dhcp.RolePXE, msg: dhcpv4.MessageTypeRequest,
			peer: netip.MustParseAddrPort("10.20.0.50:68"), mods: []dhcpv4.Modifier{dhcpv4.WithClientIP(net.IPv4(10, 20, 0, 50)),
				dhcpv4.WithGeneric(dhcpv4.OptionVendorSpecificInformation, []byte{71, 4, 0x03, 0xe8, 0, 0, 255})},
			wantMT: dhcpv4.MessageTypeAck, wantDst: "10.20.0.50:68",
			check: func(t *testing.T, reply *dhcpv4.DHCPv4) {
				t.Helper()
				require.Equal(t, []byte{6, 1, 8, 71, 4, 0x03, 0xe8, 0, 0, 255}, reply.Options.Get(dhcpv4.OptionVendorSpecificInformation))
			},
		},
		{
			name: "a malformed option 43 is answered as if absent", role: dhcp.RolePXE, msg: dhcpv4.MessageTypeRequest,
			peer: netip.MustParseAddrPort("10.20.0.50:68"), mods: []dhcpv4.Modifier{dhcpv4.WithClientIP(net.IPv4(10, 20, 0, 50)),
				dhcpv4.WithGeneric(dhcpv4.OptionVendorSpecificInformation, []byte{71, 9, 1})},
			wantMT: dhcpv4.MessageTypeAck, wantDst: "10.20.0.50:68",
			check: func(t *testing.T, reply *dhcpv4.DHCPv4) {
				t.Helper()
				require.Equal(t, []byte{6, 1, 8, 255}, reply.Options.Get(dhcpv4.OptionVendorSpecificInformation))
			},
		},
		{
			name: "request on 4011 is an ack to the client", role: dhcp.RolePXE, msg: dhcpv4.MessageTypeRequest,
			peer: netip.MustParseAddrPort("10.20.0.50:68"), mods: []dhcpv4.Modifier{dhcpv4.WithClientIP(net.IPv4(10, 20, 0, 50))},
			wantMT: dhcpv4.MessageTypeAck, wantDst: "10.20.0.50:68",
			check: func(t *testing.T, reply *dhcpv4.DHCPv4) {
				t.Helper()
				require.True(t, reply.ClientIPAddr.Equal(net.IPv4(10, 20, 0, 50)), "ciaddr echoed")
			},
		},
		{
			name: "relayed discover goes to the relay on 67 with giaddr and option 82 echoed", role: dhcp.RoleDHCP, msg: dhcpv4.MessageTypeDiscover,
			peer: netip.MustParseAddrPort("10.30.0.1:67"),
			mods: []dhcpv4.Modifier{
				dhcpv4.WithGatewayIP(relay), dhcpv4.WithGeneric(dhcpv4.OptionRelayAgentInformation, agentInfo),
				func(d *dhcpv4.DHCPv4) { d.HopCount = 1 },
			},
			wantMT: dhcpv4.MessageTypeOffer, wantDst: "10.30.0.1:67",
			check: func(t *testing.T, reply *dhcpv4.DHCPv4) {
				t.Helper()
				require.True(t, reply.GatewayIPAddr.Equal(relay), "giaddr")
				require.Equal(t, agentInfo, reply.Options.Get(dhcpv4.OptionRelayAgentInformation), "option 82")
				require.EqualValues(t, 1, reply.HopCount)
			},
		},
		{
			name: "option 97 echoed", role: dhcp.RoleDHCP, msg: dhcpv4.MessageTypeDiscover,
			mods:   []dhcpv4.Modifier{dhcpv4.WithGeneric(dhcpv4.OptionClientMachineIdentifier, testGUID)},
			wantMT: dhcpv4.MessageTypeOffer, wantDst: "255.255.255.255:68",
			check: func(t *testing.T, reply *dhcpv4.DHCPv4) {
				t.Helper()
				require.Equal(t, testGUID, reply.Options.Get(dhcpv4.OptionClientMachineIdentifier))
			},
		},
		{
			name: "broadcast flag echoed", role: dhcp.RoleDHCP, msg: dhcpv4.MessageTypeDiscover,
			mods:   []dhcpv4.Modifier{dhcpv4.WithBroadcast(true)},
			wantMT: dhcpv4.MessageTypeOffer, wantDst: "255.255.255.255:68",
			check: func(t *testing.T, reply *dhcpv4.DHCPv4) {
				t.Helper()
				require.True(t, reply.IsBroadcast())
			},
		},
		{
			name: "missing options 97 and 94 tolerated", role: dhcp.RoleDHCP, msg: dhcpv4.MessageTypeDiscover,
			wantMT: dhcpv4.MessageTypeOffer, wantDst: "255.255.255.255:68",
			check: func(t *testing.T, reply *dhcpv4.DHCPv4) {
				t.Helper()
				require.False(t, reply.Options.Has(dhcpv4.OptionClientMachineIdentifier))
			},
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()

			mods := append([]dhcpv4.Modifier{arch(7), pxeClass("PXEClient:Arch:00007:UNDI:003000")}, tc.mods...)
			raw := request(t, tc.msg, mods...)
			req, err := dhcpv4.FromBytes(raw)
			require.NoError(t, err)

			d := dhcp.Decide(params(), tc.role, tc.peer, raw)
			require.NotNil(t, d.Reply, "dropped: %s %v", d.Drop, d.Err)

			r := d.Reply
			wire := r.ToBytes()
			require.GreaterOrEqual(t, len(wire), 300, "padded to 300 bytes")

			// Round-trip what goes on the wire, as a client would see it.
			r, err = dhcpv4.FromBytes(wire)
			require.NoError(t, err)

			require.Equal(t, dhcpv4.OpcodeBootReply, r.OpCode)
			require.Equal(t, tc.wantMT, r.MessageType(), "option 53 matches the port")
			require.Equal(t, req.TransactionID, r.TransactionID, "xid")
			require.Equal(t, req.Flags, r.Flags, "flags")
			require.Equal(t, req.ClientHWAddr, r.ClientHWAddr, "chaddr")
			require.True(t, r.YourIPAddr.Equal(net.IPv4zero), "yiaddr stays 0")
			require.True(t, r.ServerIPAddr.Equal(net.IP(testServer.AsSlice())), "siaddr")
			require.Equal(t, testServer.String(), r.ServerHostName, "sname")
			require.Equal(t, testServer.String(), r.TFTPServerName(), "option 66")
			require.True(t, r.ServerIdentifier().Equal(net.IP(testServer.AsSlice())), "option 54")
			require.Equal(t, "PXEClient", r.ClassIdentifier(), "option 60")
			require.Equal(t, []byte{6, 1, 8}, r.Options.Get(dhcpv4.OptionVendorSpecificInformation)[:3], "option 43 discovery control 8")
			require.Equal(t, "ipxe.efi", r.BootFileName, "file header")
			require.Equal(t, "ipxe.efi", r.BootFileNameOption(), "option 67")
			require.Equal(t, tc.wantDst, d.Dest.String())

			if tc.check != nil {
				tc.check(t, r)
			}
		})
	}
}

func TestDecideDrops(t *testing.T) {
	t.Parallel()

	valid := func(t *testing.T) []byte {
		t.Helper()

		return request(t, dhcpv4.MessageTypeDiscover, arch(0))
	}

	for _, tc := range []struct {
		name string
		role dhcp.Role
		raw  func(t *testing.T) []byte
		want dhcp.DropReason
	}{
		{name: "empty", raw: func(*testing.T) []byte { return nil }, want: dhcp.DropMalformed},
		{name: "truncated header", raw: func(t *testing.T) []byte { t.Helper(); return valid(t)[:100] }, want: dhcp.DropMalformed},
		{name: "bad magic cookie", raw: func(t *testing.T) []byte { t.Helper(); b := valid(t); b[236] = 0; return b }, want: dhcp.DropMalformed},
		{
			name: "option length past the end",
			raw: func(t *testing.T) []byte {
				t.Helper()
				b := valid(t)[:240]
				return append(b, 93, 200, 0, 0)
			},
			want: dhcp.DropMalformed,
		},
		{
			name: "reply opcode",
			raw: func(t *testing.T) []byte {
				t.Helper()
				b := valid(t)
				b[0] = 2
				return b
			},
			want: dhcp.DropNotRequest,
		},
		{
			name: "non-ethernet hardware",
			raw: func(t *testing.T) []byte {
				t.Helper()
				b := valid(t)
				b[1] = 6
				return b
			},
			want: dhcp.DropBadHardware,
		},
		{name: "plain dhcp client without option 93", raw: func(t *testing.T) []byte { t.Helper(); return request(t, dhcpv4.MessageTypeDiscover) }, want: dhcp.DropNotPXE},
		{
			name: "option 93 of odd length",
			raw: func(t *testing.T) []byte {
				t.Helper()
				return request(t, dhcpv4.MessageTypeDiscover, dhcpv4.WithGeneric(dhcpv4.OptionClientSystemArchitectureType, []byte{7}))
			},
			want: dhcp.DropBadArch,
		},
		{name: "unsupported arch (riscv64)", raw: func(t *testing.T) []byte { t.Helper(); return request(t, dhcpv4.MessageTypeDiscover, arch(27)) }, want: dhcp.DropUnknownArch},
		{
			name: "option 97 of the wrong length",
			raw: func(t *testing.T) []byte {
				t.Helper()
				return request(t, dhcpv4.MessageTypeDiscover, arch(7), dhcpv4.WithGeneric(dhcpv4.OptionClientMachineIdentifier, testGUID[:9]))
			},
			want: dhcp.DropBadUUID,
		},
		{
			name: "option 97 of the wrong type",
			raw: func(t *testing.T) []byte {
				t.Helper()
				g := append([]byte{1}, testGUID[1:]...)
				return request(t, dhcpv4.MessageTypeDiscover, arch(7), dhcpv4.WithGeneric(dhcpv4.OptionClientMachineIdentifier, g))
			},
			want: dhcp.DropBadUUID,
		},
		{name: "request on port 67 belongs to the site dhcp server", raw: func(t *testing.T) []byte { t.Helper(); return request(t, dhcpv4.MessageTypeRequest, arch(7)) }, want: dhcp.DropWrongMessageType},
		{name: "discover on port 4011", role: dhcp.RolePXE, raw: valid, want: dhcp.DropWrongMessageType},
		{name: "release", raw: func(t *testing.T) []byte { t.Helper(); return request(t, dhcpv4.MessageTypeRelease, arch(7)) }, want: dhcp.DropWrongMessageType},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()

			d := dhcp.Decide(params(), tc.role, netip.AddrPort{}, tc.raw(t))
			require.Nil(t, d.Reply)
			require.Equal(t, tc.want, d.Drop)
		})
	}
}

func TestDecideNotBootable(t *testing.T) {
	t.Parallel()

	p := params()
	p.Bootable = func(name string) bool { return name != "snp-arm64.efi" }

	d := dhcp.Decide(p, dhcp.RoleDHCP, netip.AddrPort{}, request(t, dhcpv4.MessageTypeDiscover, arch(11)))
	require.Equal(t, dhcp.DropNotBootable, d.Drop)

	d = dhcp.Decide(p, dhcp.RoleDHCP, netip.AddrPort{}, request(t, dhcpv4.MessageTypeDiscover, arch(19)))
	require.Equal(t, dhcp.DropNotBootable, d.Drop)

	d = dhcp.Decide(p, dhcp.RoleDHCP, netip.AddrPort{}, request(t, dhcpv4.MessageTypeDiscover, arch(0)))
	require.NotNil(t, d.Reply)
}

func TestDecideUUID(t *testing.T) {
	t.Parallel()

	d := dhcp.Decide(params(), dhcp.RoleDHCP, netip.AddrPort{},
		request(t, dhcpv4.MessageTypeDiscover, arch(7), dhcpv4.WithGeneric(dhcpv4.OptionClientMachineIdentifier, testGUID)))
	// The first three fields come little-endian (SMBIOS 2.6+, EFI GUIDs): 11 22 33 44 | 55 66 | 77 88 reads
	// 44332211-6655-8877, as iPXE's ${uuid} and the machine's SMBIOS show it.
	require.Equal(t, "44332211-6655-8877-99aa-bbccddeeff00", d.UUID)
}

func FuzzDecide(f *testing.F) {
	seed := func(mods ...dhcpv4.Modifier) []byte {
		p, err := dhcpv4.New(append([]dhcpv4.Modifier{dhcpv4.WithHwAddr(testMAC)}, mods...)...)
		if err != nil {
			f.Fatal(err)
		}

		return p.ToBytes()
	}

	f.Add(seed(dhcpv4.WithMessageType(dhcpv4.MessageTypeDiscover), arch(0)), false)
	f.Add(seed(dhcpv4.WithMessageType(dhcpv4.MessageTypeRequest), arch(7), dhcpv4.WithGeneric(dhcpv4.OptionClientMachineIdentifier, testGUID)), true)
	f.Add(seed(dhcpv4.WithMessageType(dhcpv4.MessageTypeDiscover), arch(16), dhcpv4.WithUserClass("iPXE", false)), false)
	f.Add(seed(dhcpv4.WithMessageType(dhcpv4.MessageTypeDiscover), dhcpv4.WithGatewayIP(net.IPv4(10, 0, 0, 1))), false)
	f.Add([]byte{}, false)

	p := params()

	f.Fuzz(func(t *testing.T, raw []byte, pxe bool) {
		role := dhcp.RoleDHCP
		if pxe {
			role = dhcp.RolePXE
		}

		d := dhcp.Decide(p, role, netip.MustParseAddrPort("10.20.0.9:68"), raw)
		if d.Reply == nil {
			if d.Drop == "" {
				t.Fatal("no reply and no drop reason")
			}

			return
		}

		wire := d.Reply.ToBytes()
		if len(wire) < 300 {
			t.Fatalf("reply of %d bytes", len(wire))
		}

		back, err := dhcpv4.FromBytes(wire)
		if err != nil {
			t.Fatalf("reply does not parse: %v", err)
		}

		if back.YourIPAddr != nil && !back.YourIPAddr.IsUnspecified() {
			t.Fatalf("yiaddr %s", back.YourIPAddr)
		}

		if !strings.HasPrefix(back.BootFileNameOption(), "http://") && back.BootFileNameOption() != back.BootFileName {
			t.Fatalf("file header %q and option 67 %q differ", back.BootFileName, back.BootFileNameOption())
		}
	})
}
