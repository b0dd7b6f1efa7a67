// Command fulldhcp runs the edge's DHCP server alone in full mode (a pool, leases persisted in a state
// directory, no address probe and no guard) on one interface, for the lease storm of `make bench`: a process
// of its own, so that its CPU time is read the same way as dnsmasq's.
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"syscall"

	"go.uber.org/zap"

	"github.com/outpost-metal/outpost/edge/dhcp"
	bootpb "github.com/outpost-metal/outpost/shared/api/boot"
)

type fixedSite struct{ d *bootpb.DHCP }

func (f fixedSite) DHCP() *bootpb.DHCP { return f.d }

func main() {
	cfg := dhcp.Default()
	site := &bootpb.DHCP{Mode: bootpb.DHCPMode_DHCP_MODE_FULL}

	var state string

	flag.StringVar(&cfg.Interface, "iface", "", "interface to serve")
	flag.StringVar(&cfg.ServerIP, "ip", "", "the server's address on that interface")
	flag.StringVar(&state, "state", "", "state directory (the lease file)")
	flag.StringVar(&site.Subnet, "subnet", "", "served subnet (CIDR)")
	flag.StringVar(&site.PoolStart, "pool-start", "", "first pool address")
	flag.StringVar(&site.PoolEnd, "pool-end", "", "last pool address")
	flag.StringVar(&site.Gateway, "gateway", "", "the clients' router")
	leaseSeconds := flag.Uint("lease-seconds", 3600, "lease time in seconds")
	flag.Parse()

	site.LeaseSeconds = uint32(min(*leaseSeconds, 1<<31)) // bounded just above

	if err := run(cfg, site, state); err != nil {
		fmt.Fprintln(os.Stderr, "fulldhcp:", err)
		os.Exit(1)
	}
}

func run(cfg dhcp.Config, site *bootpb.DHCP, state string) error {
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, os.Interrupt)
	defer stop()

	log, err := zap.NewProduction(zap.IncreaseLevel(zap.WarnLevel))
	if err != nil {
		return err
	}

	leases, err := dhcp.OpenLeases(state, log)
	if err != nil {
		return err
	}

	srv, err := dhcp.New(cfg, log, dhcp.Deps{Site: fixedSite{site}, Leases: leases})
	if err != nil {
		return err
	}

	conn, err := dhcp.ListenPacket(ctx, cfg.Interface, cfg.Port, cfg.ReadBuffer)
	if err != nil {
		return err
	}
	defer conn.Close() //nolint:errcheck

	return srv.Serve(ctx, conn, nil)
}
