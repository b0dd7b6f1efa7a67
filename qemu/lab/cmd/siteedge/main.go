// Command siteedge is the edge for the lab's machine-side test, where the test plays the controller: the
// edge's own composition root (edge/app), built from the lab's flags, with the services the controller
// reaches over the uplink (boot plans, BMC operations, assets, the agent call proxy) served without
// authentication on -proxy-listen instead of an uplink, agent tunnels on -tunnel-port bound to nothing
// (the lab's agents are trusted), and the lab's boot images served from -assets. It prints "READY" once
// built. It is test tooling.
package main

import (
	"context"
	"flag"
	"fmt"
	"net"
	"os"
	"os/signal"
	"strconv"
	"syscall"

	"go.uber.org/zap"

	"github.com/outpost-metal/outpost/edge/app"
	"github.com/outpost-metal/outpost/edge/config"
	"github.com/outpost-metal/outpost/edge/tunnel"
	"github.com/outpost-metal/outpost/shared/logging"
)

func main() {
	cfg := config.Default()

	var (
		assets, proxyListen string
		tunnelPort          int
	)

	flag.StringVar(&cfg.DHCP.Interface, "iface", "br0", "interface to serve ProxyDHCP on")
	flag.StringVar(&cfg.DHCP.ServerIP, "ip", "", "the edge's address on that interface")
	flag.StringVar(&cfg.StateDir, "state", "", "state directory")
	flag.StringVar(&assets, "assets", "", "directory of the boot images served under /assets/")
	flag.StringVar(&cfg.IPXEDir, "ipxe-dir", "", "iPXE binaries for every firmware (hack/ipxe.sh prints their directory)")
	flag.IntVar(&tunnelPort, "tunnel-port", 50000, "agent tunnel port")
	flag.StringVar(&proxyListen, "proxy-listen", ":50001", "what the controller would reach over the uplink (h2c gRPC)")
	flag.StringVar(&cfg.LogLevel, "log-level", "info", "log level")
	flag.Parse()

	log, err := logging.New(os.Stderr, cfg.LogLevel)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(2)
	}

	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, os.Interrupt)
	defer stop()

	if err := run(ctx, log, cfg, assets, proxyListen, tunnelPort); err != nil {
		log.Error("siteedge failed", zap.Error(err))
		os.Exit(1)
	}
}

func run(ctx context.Context, log *zap.Logger, cfg config.Config, assets, proxyListen string, tunnelPort int) error {
	cfg.HTTP.Listen = ":80"
	cfg.APIListen = ":" + strconv.Itoa(tunnelPort)
	cfg.HTTP.AgentAddress = net.JoinHostPort(cfg.DHCP.ServerIP, strconv.Itoa(tunnelPort))
	cfg.AgentBinding = tunnel.BindOff

	controllerAPI, err := net.Listen("tcp", proxyListen)
	if err != nil {
		return fmt.Errorf("controller API listener: %w", err)
	}

	edge, err := app.Build(ctx, cfg, log, app.Options{ControllerAPI: controllerAPI, FilesDir: assets})
	if err != nil {
		return err
	}

	fmt.Println("READY")

	return edge.Run(ctx)
}
