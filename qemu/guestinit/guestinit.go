// Package guestinit holds what the lab's static /init programs do first in a guest: load the kernel modules
// the initramfs carries and bring up the network with a DHCP lease. It is test tooling (Linux only).
package guestinit

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"strings"
	"syscall"
	"time"
	"unsafe"

	"github.com/insomniacslk/dhcp/dhcpv4/nclient4"
	"github.com/vishvananda/netlink"
)

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

// sysFinitModule is finit_module(2) on linux/amd64 (the syscall package lacks the constant).
const sysFinitModule = 313

func finitModule(path string) error {
	f, err := os.Open(path)
	if err != nil {
		return err
	}
	defer f.Close() //nolint:errcheck

	params := []byte{0}

	_, _, errno := syscall.Syscall(sysFinitModule, f.Fd(), uintptr(unsafe.Pointer(&params[0])), 0)
	if errno != 0 {
		return errno
	}

	return nil
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
