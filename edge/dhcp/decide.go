package dhcp

import (
	"bytes"
	"fmt"
	"net"
	"net/netip"
	"slices"
	"strconv"
	"strings"

	"github.com/insomniacslk/dhcp/dhcpv4"
	"github.com/insomniacslk/dhcp/iana"

	"github.com/outpost-metal/outpost/edge/boot"
	bootpb "github.com/outpost-metal/outpost/shared/api/boot"
	"github.com/outpost-metal/outpost/shared/metal"
)

// Role says which ProxyDHCP port a request arrived on.
type Role int

const (
	// RoleDHCP is the broadcast port 67: DISCOVER is answered with OFFER.
	RoleDHCP Role = iota
	// RolePXE is the PXE boot-server port 4011: REQUEST is answered with ACK (PXE 2.1 §2.2).
	RolePXE
)

// String names the role for logs and metrics.
func (r Role) String() string {
	if r == RolePXE {
		return "pxe"
	}

	return "dhcp"
}

// Standard ports (RFC 2131 §4.1, PXE 2.1 §2.2).
const (
	ServerPort = 67
	ClientPort = 68
	PXEPort    = 4011
)

// DropReason says why a request got no reply. It is the "reason" label of the drop counter.
type DropReason string

// Reasons a request is dropped.
const (
	DropMalformed        DropReason = "malformed"
	DropNotRequest       DropReason = "not_bootrequest"
	DropBadHardware      DropReason = "bad_hardware_address"
	DropNotPXE           DropReason = "not_pxe"
	DropBadArch          DropReason = "bad_option_93"
	DropUnknownArch      DropReason = "unsupported_arch"
	DropNotBootable      DropReason = "no_boot_file"
	DropBadUUID          DropReason = "bad_option_97"
	DropWrongMessageType DropReason = "unexpected_message_type"
	DropRateLimited      DropReason = "rate_limited"
	DropQueueFull        DropReason = "queue_full"
	DropWriteFailed      DropReason = "write_failed"
	DropUnknownMachine   DropReason = "unknown_machine"
	DropDiscoveryOff     DropReason = "discovery_off"
	DropMode4011Only     DropReason = "port_67_not_served"
	// DropNoSignedFile is a machine that enforces Secure Boot at a site with no signed boot file for its
	// firmware: it is never handed an unsigned one.
	DropNoSignedFile DropReason = "no_signed_boot_file"
	// DropSecureBootDisk is a machine that enforces Secure Boot whose plan is its disk: no signed image can hand
	// it to its disk as iPXE does for the others, so it is offered nothing and its firmware goes on to its next
	// boot option, the disk.
	DropSecureBootDisk DropReason = "secure_boot_disk_plan"
	// DropSignedNotHeld is a machine that enforces Secure Boot whose plan's signed image the edge does not hold
	// yet (it is fetching it) at a site whose machines may not fetch it upstream: its firmware's next try gets
	// it.
	DropSignedNotHeld DropReason = "signed_image_not_at_site"
	// DropSignedNeedsHTTP is a machine that enforces Secure Boot whose plan's signed image its firmware would
	// have to fetch by TFTP: the edge serves plans' signed images (a Talos UKI is some 100 MB) over HTTP only,
	// so such a machine must boot by UEFI HTTP boot.
	DropSignedNeedsHTTP DropReason = "signed_image_needs_http_boot"
)

// BootFiles names the iPXE binaries served over TFTP (and over HTTP under /tftp/).
type BootFiles struct {
	// BIOS is for firmware class 0.
	BIOS string
	// UEFIx86 is the default for UEFI x86 (it carries its own NIC drivers).
	UEFIx86 string
	// UEFIx86SNP is for machines whose NIC works only with the firmware's SNP driver.
	UEFIx86SNP string
	// UEFIARM64 is for UEFI arm64 (and U-Boot arm64).
	UEFIARM64 string
	// UEFIx86Signed is a signed unified kernel image (agent mode) for UEFI x86 machines that enforce Secure
	// Boot (empty: the site has none, and such machines are not answered).
	UEFIx86Signed string
	// SecureBoot names the machines that enforce Secure Boot: MACs, or "*" for every UEFI machine at the site.
	// Their firmware's DHCP requests do not say so (OVMF's are the same with Secure Boot on or off), so the
	// site says it; a machine's plan, when it says (the controller learned it from the machine's BMC, or an
	// operator set it), comes first.
	SecureBoot []string
}

// enforcesSecureBoot reports whether the machine enforces Secure Boot: as its plan says, else as the edge's
// own setting says.
func enforcesSecureBoot(p Params, mac net.HardwareAddr, uuid string) bool {
	if p.Prefs != nil {
		if on, said := p.Prefs.SecureBoot(mac, uuid); said {
			return on
		}
	}

	return p.Files.secureBoot(mac)
}

// secureBoot reports whether the edge's own setting names the machine with this MAC as enforcing Secure Boot.
func (b BootFiles) secureBoot(mac net.HardwareAddr) bool {
	for _, m := range b.SecureBoot {
		if m == "*" {
			return true
		}

		if hw, err := net.ParseMAC(m); err == nil && bytes.Equal(hw, mac) {
			return true
		}
	}

	return false
}

// DefaultBootFiles are the file names Debian's ipxe package uses (arm64 is not packaged there).
func DefaultBootFiles() BootFiles {
	return BootFiles{BIOS: "undionly.kpxe", UEFIx86: "ipxe.efi", UEFIx86SNP: "snponly.efi", UEFIARM64: "snp-arm64.efi"}
}

// Names lists every distinct non-empty file name.
func (b BootFiles) Names() []string {
	var out []string

	seen := map[string]bool{}

	for _, n := range []string{b.BIOS, b.UEFIx86, b.UEFIx86SNP, b.UEFIARM64, b.UEFIx86Signed} {
		if n != "" && !seen[n] {
			seen[n] = true
			out = append(out, n)
		}
	}

	return out
}

// File returns the binary for a firmware class; snpOnly picks the SNP-only build for UEFI x86.
func (b BootFiles) File(f Firmware, snpOnly bool) string {
	switch f {
	case FirmwareBIOS:
		return b.BIOS
	case FirmwareUEFIx86, FirmwareHTTPx86:
		if snpOnly && b.UEFIx86SNP != "" {
			return b.UEFIx86SNP
		}

		return b.UEFIx86
	case FirmwareUEFIARM64, FirmwareHTTPARM64:
		return b.UEFIARM64
	default:
		return ""
	}
}

// Preferences answers per-machine boot choices. The boot table implements it.
type Preferences interface {
	// SNPOnly reports whether the machine must get the SNP-only UEFI binary. uuid may be empty.
	SNPOnly(mac net.HardwareAddr, uuid string) bool
	// Known reports whether the machine is in the boot table (by UUID, or by a MAC an operator registered).
	Known(mac net.HardwareAddr, uuid string) bool
	// Discovery is the policy the controller set for the site ("" when it set none: Params.Discovery holds).
	Discovery() string
	// DiskPlan reports whether the machine's plan is to boot its disk. uuid may be empty.
	DiskPlan(mac net.HardwareAddr, uuid string) bool
	// SecureBoot reports whether the machine's plan says its firmware enforces Secure Boot (said false: the
	// plan does not say, and BootFiles.SecureBoot decides). uuid may be empty.
	SecureBoot(mac net.HardwareAddr, uuid string) (enforces, said bool)
	// SignedImage is the signed image of the machine's agent or install plan, or the site's signed agent image
	// for its arch when it is in agent mode (nil: none). uuid may be empty.
	SignedImage(mac net.HardwareAddr, uuid string, arch metal.Arch) *bootpb.SignedImage
}

// Discovery is which PXE clients the ProxyDHCP answers.
type Discovery string

// Discovery policies.
const (
	// DiscoverAll answers every PXE client: unknown machines boot agent mode and join Omni.
	DiscoverAll Discovery = "all"
	// DiscoverKnown answers only machines the boot table holds (by UUID, or MACs an operator registered).
	DiscoverKnown Discovery = "known"
	// DiscoverOff answers nobody (the site's own DHCP hands out boot files).
	DiscoverOff Discovery = "off"
)

// Mode is which ProxyDHCP ports are served.
type Mode string

// ProxyDHCP modes.
const (
	// ModeFull answers DISCOVER on 67 and REQUEST on 4011.
	ModeFull Mode = "full"
	// Mode4011Only answers only on 4011, beside a site DHCP server that already offers PXE (option 60
	// PXEClient) without boot information.
	Mode4011Only Mode = "4011-only"
)

// Params is what Decide needs besides the request.
type Params struct {
	// ServerIP is the edge's address on the clients' network (option 54, siaddr, option 66).
	ServerIP netip.Addr
	// HTTPPort is the port of the edge's HTTP server (scripts and HTTP boot).
	HTTPPort int
	// Files names the iPXE binaries.
	Files BootFiles
	// Bootable reports whether a boot file is actually served; nil means all are.
	Bootable func(name string) bool
	// Held reports whether the edge holds an asset (a logical name, served under /assets/); nil: none.
	Held func(name string) bool
	// Upstream reports whether the site's machines may fetch an asset the edge does not hold from upstream
	// (the passthrough policy); nil: never.
	Upstream func() bool
	// Prefs gives per-machine choices; nil means defaults for everyone (and no machine is known).
	Prefs Preferences
	// Discovery is who is answered (empty: all).
	Discovery Discovery
	// Mode is which ports answer (empty: full).
	Mode Mode
	// ClientPort and RelayPort are where replies go (68 and 67; tests change them).
	ClientPort, RelayPort int
}

// discovery is the site's policy from the controller when it set one, else the edge's own.
func (p Params) discovery() Discovery {
	if p.Prefs != nil {
		if d := Discovery(p.Prefs.Discovery()); d != "" {
			return d
		}
	}

	return p.Discovery
}

// HTTPBase returns "http://<server>[:port]".
func (p Params) HTTPBase() string {
	if p.HTTPPort == 0 || p.HTTPPort == 80 {
		return "http://" + p.ServerIP.String()
	}

	return "http://" + net.JoinHostPort(p.ServerIP.String(), strconv.Itoa(p.HTTPPort))
}

// ScriptURL is the URL handed to clients that already run iPXE.
func (p Params) ScriptURL() string {
	return p.HTTPBase() + "/ipxe/init.ipxe"
}

// Decision is the outcome of Decide: a reply and where to send it, or a drop reason.
type Decision struct {
	// Reply is nil when the request is dropped.
	Reply *dhcpv4.DHCPv4
	// Dest is where Reply goes.
	Dest netip.AddrPort
	// Drop says why there is no reply.
	Drop DropReason
	// Err details a drop caused by bad input.
	Err error
	// The client as far as it could be classified (for events and logs).
	MAC      net.HardwareAddr
	Firmware Firmware
	IPXE     bool
	UUID     string
	// BootFile is what the reply advertises (a TFTP name or a URL).
	BootFile string
}

// pxeVendorOptions is option 43 with PXE_DISCOVERY_CONTROL (sub-option 6) = 8:
// "use the boot file in this reply, skip boot-server discovery" (PXE 2.1 §2.4.7).
var pxeVendorOptions = []byte{6, 1, 8, 255}

// pxeBootItem is the PXE_BOOT_ITEM sub-option of option 43 (PXE 2.1 §2.4.7): a boot server type and layer,
// two bytes each. A client sent to the edge by a site DHCP server's boot menu (dnsmasq's pxe-service naming
// the edge as the boot server) asks for an item; iPXE takes only an answer that names the same type.
const pxeBootItem = 71

// bootItem returns the PXE_BOOT_ITEM the request asks for (nil when it asks for none, or the option does not
// parse: such a request is answered as any other).
func bootItem(req *dhcpv4.DHCPv4) []byte {
	raw := req.Options.Get(dhcpv4.OptionVendorSpecificInformation)
	if raw == nil {
		return nil
	}

	sub := dhcpv4.Options{}
	if err := sub.FromBytes(raw); err != nil {
		return nil
	}

	if item := sub.Get(dhcpv4.GenericOptionCode(pxeBootItem)); len(item) == 4 {
		return item
	}

	return nil
}

// vendorOptions is the reply's option 43: the discovery control, and, on 4011 (an ACK: boot-server requests
// come only there), the boot item asked for echoed. An OFFER on 67 never parses the client's option 43.
func vendorOptions(req *dhcpv4.DHCPv4, msgType dhcpv4.MessageType) []byte {
	if msgType != dhcpv4.MessageTypeAck {
		return pxeVendorOptions
	}

	item := bootItem(req)
	if item == nil {
		return pxeVendorOptions
	}

	return append([]byte{6, 1, 8, pxeBootItem, 4}, append(slices.Clone(item), 255)...)
}

// userClassIPXE is the user class (option 77) iPXE sends, raw or in RFC 3004 form.
const userClassIPXE = "iPXE"

// Decide answers one ProxyDHCP request given as raw bytes. It never panics on any input.
func Decide(p Params, role Role, peer netip.AddrPort, raw []byte) Decision {
	req, err := dhcpv4.FromBytes(raw)
	if err != nil {
		return Decision{Drop: DropMalformed, Err: fmt.Errorf("parse dhcp packet: %w", err)}
	}

	return DecidePacket(p, role, peer, req)
}

// DecidePacket is Decide on a parsed request.
func DecidePacket(p Params, role Role, peer netip.AddrPort, req *dhcpv4.DHCPv4) Decision {
	if req.OpCode != dhcpv4.OpcodeBootRequest {
		return Decision{Drop: DropNotRequest}
	}

	if req.HWType != iana.HWTypeEthernet || len(req.ClientHWAddr) != 6 {
		return Decision{Drop: DropBadHardware, Err: fmt.Errorf("hardware type %d length %d", req.HWType, len(req.ClientHWAddr))}
	}

	d := Decision{MAC: req.ClientHWAddr}

	if !classifyPXE(req, &d) {
		return d
	}

	if p.Mode == Mode4011Only && role == RoleDHCP {
		d.Drop = DropMode4011Only

		return d
	}

	if !discoveryAllows(p, req, &d) {
		return d
	}

	var msgType dhcpv4.MessageType

	switch mt := req.MessageType(); {
	case role == RoleDHCP && mt == dhcpv4.MessageTypeDiscover:
		msgType = dhcpv4.MessageTypeOffer
	case role == RolePXE && (mt == dhcpv4.MessageTypeRequest || mt == dhcpv4.MessageTypeInform):
		msgType = dhcpv4.MessageTypeAck
	default:
		d.Drop, d.Err = DropWrongMessageType, fmt.Errorf("message type %s on the %s port", mt, role)

		return d
	}

	if !chooseBootFile(p, req, &d) {
		return d
	}

	d.Reply = buildReply(p, req, msgType, d)
	d.Dest = destination(p, role, peer, req)

	return d
}

// classifyPXE reads the client's firmware class (option 93) and UUID (option 97) into d; false (with d.Drop
// set) when it is no PXE client or the options do not parse.
func classifyPXE(req *dhcpv4.DHCPv4, d *Decision) bool {
	archOpt := req.Options.Get(dhcpv4.OptionClientSystemArchitectureType)
	if archOpt == nil {
		d.Drop = DropNotPXE

		return false
	}

	var archs iana.Archs
	if err := archs.FromBytes(archOpt); err != nil || len(archs) == 0 {
		d.Drop, d.Err = DropBadArch, fmt.Errorf("option 93 of length %d is not a list of architecture codes", len(archOpt))

		return false
	}

	// The first code is the one the client boots as (RFC 4578 §2.1).
	d.Firmware = FirmwareFromArch(archs[0])
	if d.Firmware == FirmwareUnknown {
		d.Drop, d.Err = DropUnknownArch, fmt.Errorf("architecture code %d (%s)", uint16(archs[0]), archs[0])

		return false
	}

	if guid := req.Options.Get(dhcpv4.OptionClientMachineIdentifier); guid != nil {
		uuid, err := parseUUID(guid)
		if err != nil {
			d.Drop, d.Err = DropBadUUID, err

			return false
		}

		d.UUID = uuid
	}

	return true
}

// discoveryAllows applies the discovery policy to a classified client (false, with d.Drop set: not answered).
func discoveryAllows(p Params, req *dhcpv4.DHCPv4, d *Decision) bool {
	switch discovery := p.discovery(); {
	case discovery == DiscoverOff:
		d.Drop = DropDiscoveryOff

		return false
	case discovery == DiscoverKnown && (p.Prefs == nil || !p.Prefs.Known(req.ClientHWAddr, d.UUID)):
		d.Drop = DropUnknownMachine

		return false
	}

	return true
}

// chooseBootFile sets d.IPXE and d.BootFile for a classified client (false, with d.Drop set, when nothing is
// bootable for it).
func chooseBootFile(p Params, req *dhcpv4.DHCPv4, d *Decision) bool {
	d.IPXE = slices.Contains(req.UserClass(), userClassIPXE) ||
		req.Options.Has(dhcpv4.GenericOptionCode(175))

	snp := p.Prefs != nil && p.Prefs.SNPOnly(req.ClientHWAddr, d.UUID)

	switch {
	case d.Firmware.UEFI() && enforcesSecureBoot(p, req.ClientHWAddr, d.UUID):
		// Secure Boot: only a signed image, over TFTP or HTTP boot; never iPXE, and never the script (an iPXE
		// asking is not this firmware's).
		if d.IPXE {
			d.Drop = DropNoSignedFile

			return false
		}

		if p.Prefs != nil && p.Prefs.DiskPlan(req.ClientHWAddr, d.UUID) {
			d.Drop = DropSecureBootDisk

			return false
		}

		d.BootFile, d.Drop = signedBootFile(p, req.ClientHWAddr, d)

		return d.Drop == ""
	case d.IPXE:
		// Already iPXE: hand it the script, never the binary again (chainload loop).
		d.BootFile = p.ScriptURL()
	case d.Firmware.HTTPBoot():
		name := p.Files.File(d.Firmware, snp)
		if name == "" || (p.Bootable != nil && !p.Bootable(name)) {
			d.Drop = DropNotBootable

			return false
		}

		d.BootFile = p.HTTPBase() + "/tftp/" + name
	default:
		name := p.Files.File(d.Firmware, snp)
		if name == "" || (p.Bootable != nil && !p.Bootable(name)) {
			d.Drop = DropNotBootable

			return false
		}

		d.BootFile = name
	}

	return true
}

// signedBootFile is what a machine that enforces Secure Boot is offered: its plan's signed image (agent mode
// or install) or the site's signed agent image where the controller named one, else the edge's own signed
// file (--secure-boot-file, x86 only),
// over TFTP or by HTTP boot; or why it is offered nothing.
func signedBootFile(p Params, mac net.HardwareAddr, d *Decision) (string, DropReason) {
	var img *bootpb.SignedImage
	if p.Prefs != nil {
		img = p.Prefs.SignedImage(mac, d.UUID, d.Firmware.Arch())
	}

	if img == nil {
		name := p.Files.UEFIx86Signed
		if d.Firmware.Arch() != metal.AMD64 || name == "" || (p.Bootable != nil && !p.Bootable(name)) {
			return "", DropNoSignedFile
		}

		if d.Firmware.HTTPBoot() {
			return p.HTTPBase() + "/tftp/" + name, ""
		}

		return name, ""
	}

	if !d.Firmware.HTTPBoot() {
		return "", DropSignedNeedsHTTP
	}

	name, local := strings.CutPrefix(img.GetUrl(), "/assets/")
	held := local && p.Held != nil && p.Held(name)

	switch {
	case !local:
		return img.GetUrl(), ""
	case held && d.UUID != "":
		// Named for the machine: the image's fetch is its boot's evidence (boot.SignedBootQuery).
		return p.HTTPBase() + img.GetUrl() + boot.SignedBootQuery(d.UUID, mac), ""
	case held:
		return p.HTTPBase() + img.GetUrl(), ""
	case img.GetUpstreamUrl() != "" && p.Upstream != nil && p.Upstream():
		return img.GetUpstreamUrl(), ""
	default:
		return "", DropSignedNotHeld
	}
}

func buildReply(p Params, req *dhcpv4.DHCPv4, msgType dhcpv4.MessageType, d Decision) *dhcpv4.DHCPv4 {
	server := net.IP(p.ServerIP.AsSlice())

	reply := &dhcpv4.DHCPv4{
		OpCode:         dhcpv4.OpcodeBootReply,
		HWType:         req.HWType,
		HopCount:       req.HopCount,
		TransactionID:  req.TransactionID,
		Flags:          req.Flags,
		ClientIPAddr:   req.ClientIPAddr,
		YourIPAddr:     net.IPv4zero,
		ServerIPAddr:   server,
		GatewayIPAddr:  req.GatewayIPAddr,
		ClientHWAddr:   req.ClientHWAddr,
		ServerHostName: p.ServerIP.String(),
		BootFileName:   d.BootFile,
		Options:        dhcpv4.Options{},
	}

	reply.UpdateOption(dhcpv4.OptMessageType(msgType))
	reply.UpdateOption(dhcpv4.OptServerIdentifier(server))
	addBootOptions(p, req, reply, msgType, d)

	return reply
}

// addBootOptions puts the PXE answer for a classified client into a reply: the boot file in the header and
// option 67, the server in siaddr, sname and option 66, option 60 PXEClient (HTTPClient for HTTP boot), option
// 43 for PXE firmware, options 97 and 82 echoed.
func addBootOptions(p Params, req, reply *dhcpv4.DHCPv4, msgType dhcpv4.MessageType, d Decision) {
	vendorClass := "PXEClient"
	if d.Firmware.HTTPBoot() {
		vendorClass = "HTTPClient"
	}

	reply.ServerIPAddr = net.IP(p.ServerIP.AsSlice())
	reply.ServerHostName, reply.BootFileName = p.ServerIP.String(), d.BootFile
	reply.UpdateOption(dhcpv4.OptClassIdentifier(vendorClass))
	reply.UpdateOption(dhcpv4.OptTFTPServerName(p.ServerIP.String()))
	reply.UpdateOption(dhcpv4.OptBootFileName(d.BootFile))

	if !d.Firmware.HTTPBoot() {
		reply.UpdateOption(dhcpv4.OptGeneric(dhcpv4.OptionVendorSpecificInformation, vendorOptions(req, msgType)))
	}

	for _, code := range []dhcpv4.OptionCode{dhcpv4.OptionClientMachineIdentifier, dhcpv4.OptionRelayAgentInformation} {
		if v := req.Options.Get(code); v != nil {
			reply.UpdateOption(dhcpv4.OptGeneric(code, v))
		}
	}
}

// destination picks where the reply goes: the relay when relayed, the client itself on 4011
// (it has an address by then), else broadcast (yiaddr is 0, so unicast is impossible).
func destination(p Params, role Role, peer netip.AddrPort, req *dhcpv4.DHCPv4) netip.AddrPort {
	if gw, ok := netip.AddrFromSlice(req.GatewayIPAddr.To4()); ok && !gw.IsUnspecified() {
		return netip.AddrPortFrom(gw, uint16(orDefault(p.RelayPort, ServerPort)))
	}

	if role == RolePXE && peer.IsValid() && !peer.Addr().IsUnspecified() {
		return peer
	}

	return netip.AddrPortFrom(netip.AddrFrom4([4]byte{255, 255, 255, 255}), uint16(orDefault(p.ClientPort, ClientPort)))
}

func orDefault(v, def int) int {
	if v == 0 {
		return def
	}

	return v
}

// parseUUID decodes option 97 (RFC 4578 §2.3): type 0 followed by a 16-byte GUID. Firmware sends the GUID as
// SMBIOS (2.6 and later) and EFI store it, its first three fields little-endian; it is returned in the order
// iPXE's ${uuid}, dmidecode and Talos print (measured in the lab: a machine with SMBIOS UUID
// 0e5a1ab0-0000-4000-8000-... sends b0 1a 5a 0e 00 00 00 40 80 00 ...).
func parseUUID(v []byte) (string, error) {
	if len(v) != 17 || v[0] != 0 {
		return "", fmt.Errorf("option 97 of length %d (type %d), want 17 (type 0)", len(v), firstByte(v))
	}

	g := v[1:]

	return fmt.Sprintf("%02x%02x%02x%02x-%02x%02x-%02x%02x-%x-%x", g[3], g[2], g[1], g[0], g[5], g[4], g[7], g[6], g[8:10], g[10:16]), nil
}

func firstByte(v []byte) int {
	if len(v) == 0 {
		return -1
	}

	return int(v[0])
}
