// Command siteedge is the lab's interim edge: the edge's boot pieces (ProxyDHCP, TFTP, iPXE over HTTP,
// boot table, journal) and its agent tunnel endpoint in one process without an uplink, as qemu/bootlab's
// labedge plus edge/tunnel. The agent-call proxy and the BootPlans service (what the controller reaches over the
// uplink) listen on -proxy-listen. The lab uses it until the real edge binary serves all of this; it is test tooling.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/signal"
	"syscall"
	"time"

	"go.uber.org/zap"
	"golang.org/x/sync/errgroup"
	"google.golang.org/grpc"

	"github.com/outpost-metal/outpost/edge/boot"
	"github.com/outpost-metal/outpost/edge/dhcp"
	"github.com/outpost-metal/outpost/edge/ipxe"
	"github.com/outpost-metal/outpost/edge/journal"
	"github.com/outpost-metal/outpost/edge/tftp"
	"github.com/outpost-metal/outpost/edge/tunnel"
	"github.com/outpost-metal/outpost/shared/logging"
)

type options struct {
	iface, ip, state, assets, ipxeDir, level string
	tunnelPort                               int
	proxyListen                              string
}

func main() {
	var o options

	flag.StringVar(&o.iface, "iface", "br0", "interface to serve ProxyDHCP on")
	flag.StringVar(&o.ip, "ip", "", "the edge's address on that interface")
	flag.StringVar(&o.state, "state", "", "state directory")
	flag.StringVar(&o.assets, "assets", "", "assets directory")
	flag.StringVar(&o.ipxeDir, "ipxe-dir", tftp.DefaultDir, "iPXE binaries")
	flag.IntVar(&o.tunnelPort, "tunnel-port", 50000, "agent tunnel port")
	flag.StringVar(&o.proxyListen, "proxy-listen", ":50001", "agent call proxy (h2c)")
	flag.StringVar(&o.level, "log-level", "info", "log level")
	flag.Parse()

	log, err := logging.New(os.Stderr, o.level)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(2)
	}

	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, os.Interrupt)
	defer stop()

	if err := run(ctx, log, o); err != nil {
		log.Error("siteedge failed", zap.Error(err))
		os.Exit(1)
	}
}

func run(ctx context.Context, log *zap.Logger, o options) error {
	table, err := boot.Open(boot.Config{StateDir: o.state}, log)
	if err != nil {
		return err
	}

	jcfg := journal.Default()
	jcfg.Dir = o.state

	jrnl, err := journal.Open(jcfg, log, journal.Deps{})
	if err != nil {
		return err
	}
	defer jrnl.Close() //nolint:errcheck

	rec := journal.NewRecorder(jrnl, log)

	dcfg := dhcp.Default()
	dcfg.Interface, dcfg.ServerIP = o.iface, o.ip

	catalog, err := tftp.LoadCatalog(o.ipxeDir, dcfg.Files.Names())
	if err != nil {
		return err
	}

	dhcpSrv, err := dhcp.New(dcfg, log, dhcp.Deps{Bootable: catalog.Has, Prefs: table, Observer: rec})
	if err != nil {
		return err
	}

	tftpSrv, err := tftp.New(tftp.Default(), log, catalog, tftp.Deps{Observer: rec})
	if err != nil {
		return err
	}

	hcfg := ipxe.Default()
	hcfg.AssetsDir = o.assets
	hcfg.AgentAddress = fmt.Sprintf("%s:%d", o.ip, o.tunnelPort)

	httpSrv, err := ipxe.New(hcfg, log, ipxe.Deps{Table: table, Catalog: catalog, Observer: rec})
	if err != nil {
		return err
	}
	defer httpSrv.Close() //nolint:errcheck

	tun := tunnel.New(tunnel.Options{Logger: log, Binding: tunnel.BindOff})

	tunLn, err := net.Listen("tcp", fmt.Sprintf(":%d", o.tunnelPort))
	if err != nil {
		return fmt.Errorf("listen tunnel: %w", err)
	}

	proxyLn, err := net.Listen("tcp", o.proxyListen)
	if err != nil {
		return fmt.Errorf("listen proxy: %w", err)
	}

	proxy := grpc.NewServer(tun.ServerOption())
	boot.NewService(table).Register(proxy)

	httpLn, err := net.Listen("tcp", ":80")
	if err != nil {
		return fmt.Errorf("listen http: %w", err)
	}

	web := &http.Server{Handler: httpSrv.Handler(), ReadHeaderTimeout: 10 * time.Second, IdleTimeout: time.Minute}

	eg, ctx := errgroup.WithContext(ctx)
	eg.Go(func() error { return dhcpSrv.Run(ctx) })
	eg.Go(func() error { return tftpSrv.Run(ctx) })
	eg.Go(func() error { return tun.Serve(ctx, tunLn) })
	eg.Go(func() error {
		go func() { <-ctx.Done(); proxy.Stop() }()

		return proxy.Serve(proxyLn)
	})
	eg.Go(func() error {
		go func() { <-ctx.Done(); web.Close() }() //nolint:errcheck,gosec

		if err := web.Serve(httpLn); err != nil && !errors.Is(err, http.ErrServerClosed) {
			return err
		}

		return nil
	})

	fmt.Println("READY")

	return eg.Wait()
}
