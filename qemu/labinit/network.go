package main

import (
	"context"
	"fmt"
	"net"
	"time"

	"github.com/insomniacslk/dhcp/dhcpv4/nclient4"
	"github.com/vishvananda/netlink"
)

// network brings up the first Ethernet interface with a DHCP lease and a default route.
func network() error {
	ifname, err := waitLink(30 * time.Second)
	if err != nil {
		return err
	}

	c, err := nclient4.New(ifname, nclient4.WithTimeout(3*time.Second), nclient4.WithRetry(5))
	if err != nil {
		return fmt.Errorf("dhcp client: %w", err)
	}
	defer c.Close() //nolint:errcheck

	ctx, cancel := context.WithTimeout(context.Background(), 40*time.Second)
	defer cancel()

	lease, err := c.Request(ctx)
	if err != nil {
		return fmt.Errorf("dhcp: %w", err)
	}

	ack := lease.ACK
	ones, _ := ack.SubnetMask().Size()

	link, err := netlink.LinkByName(ifname)
	if err != nil {
		return err
	}

	addr := &netlink.Addr{IPNet: &net.IPNet{IP: ack.YourIPAddr, Mask: net.CIDRMask(ones, 32)}}
	if err := netlink.AddrAdd(link, addr); err != nil {
		return fmt.Errorf("add %s: %w", addr, err)
	}

	if routers := ack.Router(); len(routers) > 0 {
		if err := netlink.RouteAdd(&netlink.Route{LinkIndex: link.Attrs().Index, Gw: routers[0]}); err != nil {
			return fmt.Errorf("default route via %s: %w", routers[0], err)
		}
	}

	fmt.Println("OUTPOST-INIT address", addr, "router", ack.Router())

	return nil
}

func waitLink(timeout time.Duration) (string, error) {
	deadline := time.Now().Add(timeout)

	if lo, err := netlink.LinkByName("lo"); err == nil {
		netlink.LinkSetUp(lo) //nolint:errcheck
	}

	for time.Now().Before(deadline) {
		links, err := netlink.LinkList()
		if err == nil {
			for _, l := range links {
				if l.Type() == "device" && l.Attrs().Name != "lo" && len(l.Attrs().HardwareAddr) == 6 {
					if err := netlink.LinkSetUp(l); err != nil {
						return "", fmt.Errorf("link up %s: %w", l.Attrs().Name, err)
					}

					return l.Attrs().Name, nil
				}
			}
		}

		time.Sleep(200 * time.Millisecond)
	}

	return "", fmt.Errorf("no network interface within %s", timeout)
}
