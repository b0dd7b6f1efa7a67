// Package guestinit holds what the lab's static /init programs do first in a guest: mount the kernel's
// filesystems, load the kernel modules the initramfs carries, read the machine's identity, and bring up the
// network with a DHCP lease. It is test tooling (Linux only).
package guestinit

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"strings"
	"syscall"
	"time"

	"github.com/insomniacslk/dhcp/dhcpv4/nclient4"
	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
)

// Boot is what Start found out about the guest.
type Boot struct {
	// UUID is the SMBIOS UUID, lower case.
	UUID string
	// Cmdline is the kernel command line.
	Cmdline string
	// OEM are the SMBIOS OEM strings (QEMU's -smbios type=11): what the lab tells this machine's /init.
	OEM []string
}

// Start mounts /proc, /sys and /dev (already mounted is fine), loads the modules listed in /modules.order and
// reads the SMBIOS UUID and OEM strings and the kernel command line.
func Start() (Boot, error) {
	for _, m := range []struct{ src, dst, fs string }{{"proc", "/proc", "proc"}, {"sysfs", "/sys", "sysfs"}, {"devtmpfs", "/dev", "devtmpfs"}} {
		if err := os.MkdirAll(m.dst, 0o755); err != nil {
			return Boot{}, err
		}

		if err := syscall.Mount(m.src, m.dst, m.fs, 0, ""); err != nil && !errors.Is(err, syscall.EBUSY) {
			return Boot{}, fmt.Errorf("mount %s: %w", m.dst, err)
		}
	}

	if err := LoadModules("/modules.order"); err != nil {
		return Boot{}, err
	}

	uuid, err := os.ReadFile("/sys/class/dmi/id/product_uuid")
	if err != nil {
		return Boot{}, fmt.Errorf("read smbios uuid: %w", err)
	}

	cmdline, err := os.ReadFile("/proc/cmdline")
	if err != nil {
		return Boot{}, fmt.Errorf("read kernel command line: %w", err)
	}

	oem, err := OEMStrings("/sys")
	if err != nil {
		return Boot{}, err
	}

	return Boot{UUID: strings.ToLower(strings.TrimSpace(string(uuid))), Cmdline: strings.TrimSpace(string(cmdline)), OEM: oem}, nil
}

// LoadModules loads every module listed (one path per line) in list, in order; already loaded ones are fine.
func LoadModules(list string) error {
	f, err := os.Open(list)
	if err != nil {
		return err
	}
	defer f.Close() //nolint:errcheck

	sc := bufio.NewScanner(f)
	for sc.Scan() {
		path := strings.TrimSpace(sc.Text())
		if path == "" {
			continue
		}

		if err := finitModule(path); err != nil && !errors.Is(err, syscall.EEXIST) {
			return fmt.Errorf("load %s: %w", path, err)
		}
	}

	return sc.Err()
}

// finitModule loads the kernel module at path with finit_module(2) (x/sys names its number per architecture:
// the lab's inits run on amd64 and arm64).
func finitModule(path string) error {
	f, err := os.Open(path)
	if err != nil {
		return err
	}
	defer f.Close() //nolint:errcheck

	return unix.FinitModule(int(f.Fd()), "", 0)
}

// Lease is the address a guest got.
type Lease struct {
	Interface string
	Address   *netlink.Addr
	Routers   []net.IP
}

// Network brings up the first Ethernet interface (waiting up to linkTimeout for it to appear), gets a DHCP
// lease, assigns the address and adds the default route the lease names.
func Network(linkTimeout time.Duration) (Lease, error) {
	ifname, err := waitLink(linkTimeout)
	if err != nil {
		return Lease{}, err
	}

	c, err := nclient4.New(ifname, nclient4.WithTimeout(3*time.Second), nclient4.WithRetry(5))
	if err != nil {
		return Lease{}, fmt.Errorf("dhcp client: %w", err)
	}
	defer c.Close() //nolint:errcheck

	ctx, cancel := context.WithTimeout(context.Background(), 40*time.Second)
	defer cancel()

	lease, err := c.Request(ctx)
	if err != nil {
		return Lease{}, fmt.Errorf("dhcp: %w", err)
	}

	ack := lease.ACK
	ones, _ := ack.SubnetMask().Size()

	link, err := netlink.LinkByName(ifname)
	if err != nil {
		return Lease{}, err
	}

	addr := &netlink.Addr{IPNet: &net.IPNet{IP: ack.YourIPAddr, Mask: net.CIDRMask(ones, 32)}}
	if err := netlink.AddrAdd(link, addr); err != nil {
		return Lease{}, fmt.Errorf("add %s: %w", addr, err)
	}

	routers := ack.Router()
	if len(routers) > 0 {
		if err := netlink.RouteAdd(&netlink.Route{LinkIndex: link.Attrs().Index, Gw: routers[0]}); err != nil {
			return Lease{}, fmt.Errorf("default route via %s: %w", routers[0], err)
		}
	}

	return Lease{Interface: ifname, Address: addr, Routers: routers}, nil
}

// waitLink sets lo and the first Ethernet device up, polling until one appears or timeout passes.
func waitLink(timeout time.Duration) (string, error) {
	deadline := time.Now().Add(timeout)

	for time.Now().Before(deadline) {
		links, err := netlink.LinkList()
		if err == nil {
			for _, l := range links {
				if l.Type() == "device" && l.Attrs().Name != "lo" && len(l.Attrs().HardwareAddr) == 6 {
					if lo, _ := netlink.LinkByName("lo"); lo != nil {
						netlink.LinkSetUp(lo) //nolint:errcheck
					}

					if err := netlink.LinkSetUp(l); err != nil {
						return "", fmt.Errorf("link up %s: %w", l.Attrs().Name, err)
					}

					return l.Attrs().Name, nil
				}
			}
		}

		time.Sleep(200 * time.Millisecond) // a guest's NIC appears once its driver loads: nothing to wait on
	}

	return "", fmt.Errorf("no network interface within %s", timeout)
}

// ParseIPArg reads the kernel's ip= argument in its static form (client-ip:server-ip:gw-ip:netmask:...): the
// address with its mask and the gateway (invalid: none). ok is false for any other form (dhcp, off, empty).
func ParseIPArg(v string) (addr netip.Prefix, gw netip.Addr, ok bool) {
	fields := strings.Split(v, ":")
	if len(fields) < 4 {
		return netip.Prefix{}, netip.Addr{}, false
	}

	client, err := netip.ParseAddr(fields[0])
	if err != nil || !client.Is4() {
		return netip.Prefix{}, netip.Addr{}, false
	}

	mask := net.ParseIP(fields[3]).To4()
	if mask == nil {
		return netip.Prefix{}, netip.Addr{}, false
	}

	ones, bits := net.IPMask(mask).Size()
	if bits != 32 {
		return netip.Prefix{}, netip.Addr{}, false
	}

	gw, _ = netip.ParseAddr(fields[2])

	return netip.PrefixFrom(client, ones), gw, true
}

// StaticNetwork brings up the first Ethernet interface (waiting up to linkTimeout for it) with a static
// address and default route, as the kernel's ip= argument gives them (ParseIPArg).
func StaticNetwork(linkTimeout time.Duration, addr netip.Prefix, gw netip.Addr) (Lease, error) {
	ifname, err := waitLink(linkTimeout)
	if err != nil {
		return Lease{}, err
	}

	link, err := netlink.LinkByName(ifname)
	if err != nil {
		return Lease{}, err
	}

	a := &netlink.Addr{IPNet: &net.IPNet{IP: addr.Addr().AsSlice(), Mask: net.CIDRMask(addr.Bits(), 32)}}
	if err := netlink.AddrAdd(link, a); err != nil {
		return Lease{}, fmt.Errorf("add %s: %w", a, err)
	}

	var routers []net.IP

	if gw.IsValid() {
		if err := netlink.RouteAdd(&netlink.Route{LinkIndex: link.Attrs().Index, Gw: gw.AsSlice()}); err != nil {
			return Lease{}, fmt.Errorf("default route via %s: %w", gw, err)
		}

		routers = append(routers, gw.AsSlice())
	}

	return Lease{Interface: ifname, Address: a, Routers: routers}, nil
}
