package lab

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
)

// CoreAddr is the core namespace's service address (on its loopback), reachable from every site over its WAN
// link: the controller's uplink and Omni (real or stand-in) listen there.
const CoreAddr = "10.99.0.1"

// Core is the namespace of the controller and Omni.
type Core struct {
	NS string
}

// AddCore creates the core namespace.
func (l *Lab) AddCore() (*Core, error) {
	ns, err := l.AddNetns("core")
	if err != nil {
		return nil, err
	}

	for _, args := range [][]string{
		{"-n", ns, "addr", "add", CoreAddr + "/32", "dev", "lo"},
	} {
		if err := l.IP(args...); err != nil {
			return nil, err
		}
	}

	return &Core{NS: ns}, nil
}

// Site is one site: a namespace with a bridge (the site's L2 network) carrying the edge's address, the
// machines' taps and their virtual BMCs' addresses; a second namespace on that bridge running the site's own
// DHCP server; and a veth pair to the core, the WAN link.
type Site struct {
	// Index numbers the site from 1; it picks the site's subnets.
	Index int
	Name  string
	NS    string
	// DHCPNS runs dnsmasq (ProxyDHCP and a full DHCP server cannot share port 67 in one namespace).
	DHCPNS string
	// Dir is the site's directory under the lab directory.
	Dir string

	lab   *Lab
	taps  int
	bmcs  int
	DHCP  *Proc
	wanUp bool
	// airGapped routes only the core's service address over the WAN, no default route (AddAirGappedSite).
	airGapped bool
}

// EdgeIP returns the edge's address on the site network.
func (s *Site) EdgeIP() string { return fmt.Sprintf("10.77.%d.2", s.Index) }

func (s *Site) dhcpIP() string { return fmt.Sprintf("10.77.%d.1", s.Index) }

func (s *Site) wanIP() string { return fmt.Sprintf("10.99.%d.2", s.Index) }

func (s *Site) coreWanIP() string { return fmt.Sprintf("10.99.%d.1", s.Index) }

// Subnet is the site network.
func (s *Site) Subnet() string { return fmt.Sprintf("10.77.%d.0/24", s.Index) }

// AddSite creates site number index (1, 2, ...) linked to core, with dnsmasq running.
func (l *Lab) AddSite(core *Core, index int) (*Site, error) {
	return l.addSite(core, index, nil)
}

func (l *Lab) addSite(core *Core, index int, dnsmasqExtra []string) (*Site, error) {
	name := fmt.Sprintf("site%d", index)
	if core == nil {
		name = fmt.Sprintf("bare%d", index)
	}

	s := &Site{Index: index, Name: name, Dir: filepath.Join(l.Dir, name), lab: l}
	if err := os.MkdirAll(s.Dir, 0o755); err != nil {
		return nil, fmt.Errorf("site directory: %w", err)
	}

	var err error
	if s.NS, err = l.AddNetns(fmt.Sprintf("s%d", index)); err != nil {
		return nil, err
	}

	if s.DHCPNS, err = l.AddNetns(fmt.Sprintf("d%d", index)); err != nil {
		return nil, err
	}

	v6 := fmt.Sprintf("fd77:%d::", index)

	for _, args := range [][]string{
		{"-n", s.NS, "link", "add", "br0", "type", "bridge", "forward_delay", "0", "stp_state", "0"},
		{"-n", s.NS, "addr", "add", s.EdgeIP() + "/24", "dev", "br0"},
		{"-n", s.NS, "-6", "addr", "add", v6 + "2/64", "dev", "br0", "nodad"},
		{"-n", s.NS, "link", "set", "br0", "up"},
		{"-n", s.NS, "link", "add", "dh0", "type", "veth", "peer", "name", "dh1", "netns", s.DHCPNS},
		{"-n", s.NS, "link", "set", "dh0", "master", "br0", "up"},
		{"-n", s.DHCPNS, "addr", "add", s.dhcpIP() + "/24", "dev", "dh1"},
		{"-n", s.DHCPNS, "-6", "addr", "add", v6 + "1/64", "dev", "dh1", "nodad"},
		{"-n", s.DHCPNS, "link", "set", "dh1", "up"},
	} {
		if err := l.IP(args...); err != nil {
			return nil, err
		}
	}

	if core != nil {
		if err := l.addWAN(s, core); err != nil {
			return nil, err
		}
	}

	// The edge's namespace routes the machines' traffic to the core (their SideroLink join reaches Omni).
	if out, err := exec.Command("ip", "netns", "exec", s.NS, "sysctl", "-qw", "net.ipv4.ip_forward=1").CombinedOutput(); err != nil {
		return nil, fmt.Errorf("enable forwarding in %s: %w: %s", s.NS, err, out)
	}

	dhcp, err := l.Start(ProcSpec{
		Name: name + "/dnsmasq", NS: s.DHCPNS, Cmd: "dnsmasq",
		Args: append([]string{
			"--keep-in-foreground", "--conf-file=/dev/null", "--no-resolv", "--no-hosts",
			"--port=0", "--interface=dh1", "--bind-interfaces", "--user=root", "--pid-file=",
			fmt.Sprintf("--dhcp-range=10.77.%d.100,10.77.%d.150,255.255.255.0,1h", index, index),
			"--dhcp-range=" + v6 + ",ra-only", "--enable-ra",
			"--dhcp-option=3," + s.EdgeIP(),
			// No dhcp-option=encap:175,176,1b ("no-pxedhcp"): with it iPXE ignores the edge's ProxyDHCP offer
			// and finds nothing to boot (measured with Debian's iPXE); RA and no-ping are what keep it fast.
			"--dhcp-leasefile=" + filepath.Join(s.Dir, "dnsmasq.leases"), "--no-ping", "--log-dhcp", "--log-facility=-",
		}, dnsmasqExtra...),
	})
	if err != nil {
		return nil, err
	}

	s.DHCP = dhcp

	return s, nil
}

// SetWAN brings the site's WAN link up or down (down: the site is cut off from the controller and Omni).
func (s *Site) SetWAN(up bool) error {
	state := "down"
	if up {
		state = "up"
	}

	if err := s.lab.IP("-n", s.NS, "link", "set", "wan", state); err != nil {
		return err
	}

	if up && !s.wanUp {
		// Bringing the link down dropped the default route (an air-gapped site's route to the core).
		dst := "default"
		if s.airGapped {
			dst = CoreAddr + "/32"
		}

		if err := s.lab.IP("-n", s.NS, "route", "replace", dst, "via", s.coreWanIP()); err != nil {
			return err
		}
	}

	s.wanUp = up

	return nil
}

// AddTap creates a tap device on the bridge and returns its name.
func (s *Site) AddTap() (string, error) {
	name := fmt.Sprintf("tap%d", s.taps)
	s.taps++

	if err := s.lab.IP("-n", s.NS, "tuntap", "add", "dev", name, "mode", "tap"); err != nil {
		return "", err
	}

	if err := s.lab.IP("-n", s.NS, "link", "set", name, "master", "br0", "up"); err != nil {
		return "", err
	}

	return name, nil
}

// AddBMCAddress adds a BMC address to the site network and returns it.
func (s *Site) AddBMCAddress() (string, error) {
	s.bmcs++
	ip := fmt.Sprintf("10.77.%d.%d", s.Index, 200+s.bmcs)

	if err := s.lab.IP("-n", s.NS, "addr", "add", ip+"/32", "dev", "br0"); err != nil {
		return "", err
	}

	return ip, nil
}

// addWAN links the site to the core with a veth pair and routes between them.
func (l *Lab) addWAN(s *Site, core *Core) error {
	coreIf := fmt.Sprintf("wan%d", s.Index)

	for _, args := range [][]string{
		// The WAN: a veth pair to the core; the site routes everything else there.
		{"-n", s.NS, "link", "add", "wan", "type", "veth", "peer", "name", coreIf, "netns", core.NS},
		{"-n", s.NS, "addr", "add", s.wanIP() + "/30", "dev", "wan"},
		{"-n", s.NS, "link", "set", "wan", "up"},
		{"-n", s.NS, "route", "add", "default", "via", s.coreWanIP()},
		{"-n", core.NS, "addr", "add", s.coreWanIP() + "/30", "dev", coreIf},
		{"-n", core.NS, "link", "set", coreIf, "up"},
		{"-n", core.NS, "route", "add", s.Subnet(), "via", s.wanIP()},
	} {
		if err := l.IP(args...); err != nil {
			return err
		}
	}

	s.wanUp = true

	return nil
}
