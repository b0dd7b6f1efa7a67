// Command labedge runs the edge's boot pieces (ProxyDHCP, TFTP, HTTP, boot table, journal) as one process,
// wired as the edge binary wires them but without an uplink, for the boot lab: the lab starts it inside a
// site network namespace. It prints "READY" once serving and "CALLBACK u=<uuid>" for every /config request.
// It also prints "DHCP <mac> <firmware> ipxe=<bool>", "TFTP <file>" and "BOOT <uuid> <mode>" for what it serves.
// It is test tooling.
package main

import (
	"context"
	"flag"
	"fmt"
	"net/http"
	"os"
	"os/signal"
	"syscall"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"go.uber.org/zap"
	"golang.org/x/sync/errgroup"

	"github.com/outpost-metal/outpost/edge/boot"
	"github.com/outpost-metal/outpost/edge/dhcp"
	"github.com/outpost-metal/outpost/edge/ipxe"
	"github.com/outpost-metal/outpost/edge/journal"
	"github.com/outpost-metal/outpost/edge/tftp"
	"github.com/outpost-metal/outpost/shared/logging"
)

func main() {
	iface := flag.String("iface", "br0", "interface to serve ProxyDHCP on")
	ip := flag.String("ip", "", "the edge's address on that interface")
	state := flag.String("state", "", "state directory")
	assets := flag.String("assets", "", "assets directory")
	ipxeDir := flag.String("ipxe-dir", tftp.DefaultDir, "iPXE binaries")
	level := flag.String("log-level", "info", "log level")
	maxConns := flag.Int("http-max-conns", ipxe.Default().MaxConns, "HTTP connections open at once (the edge's --http-max-conns)")
	flag.Parse()

	log, err := logging.New(os.Stderr, *level)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(2)
	}

	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, os.Interrupt)
	defer stop()

	if err := run(ctx, log, *iface, *ip, *state, *assets, *ipxeDir, *maxConns); err != nil {
		log.Error("labedge failed", zap.Error(err))
		os.Exit(1)
	}
}

func run(ctx context.Context, log *zap.Logger, iface, ip, state, assets, ipxeDir string, maxConns int) error {
	table, err := boot.Open(boot.Config{StateDir: state}, log)
	if err != nil {
		return err
	}

	jcfg := journal.Default()
	jcfg.Dir = state

	jrnl, err := journal.Open(jcfg, log, journal.Deps{})
	if err != nil {
		return err
	}
	defer jrnl.Close() //nolint:errcheck

	rec := printer{journal.NewRecorder(jrnl, log)}
	metrics := prometheus.NewRegistry()
	metrics.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))

	dcfg := dhcp.Default()
	dcfg.Interface, dcfg.ServerIP = iface, ip

	catalog, err := tftp.LoadCatalog(ipxeDir, dcfg.Files.Names())
	if err != nil {
		return err
	}

	dhcpSrv, err := dhcp.New(dcfg, log, dhcp.Deps{Bootable: catalog.Has, Prefs: table, Observer: rec, Registerer: metrics})
	if err != nil {
		return err
	}

	tftpSrv, err := tftp.New(tftp.Default(), log, catalog, tftp.Deps{Observer: rec, Registerer: metrics})
	if err != nil {
		return err
	}

	hcfg := ipxe.Default()
	hcfg.AssetsDir = assets
	hcfg.MaxConns = maxConns
	hcfg.MaxConnsPerSource = min(hcfg.MaxConnsPerSource, maxConns)

	httpSrv, err := ipxe.New(hcfg, log, ipxe.Deps{Table: table, Catalog: catalog, Observer: rec, Registerer: metrics, Gatherer: metrics})
	if err != nil {
		return err
	}
	defer httpSrv.Close() //nolint:errcheck

	handler := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/config" {
			fmt.Printf("CALLBACK u=%s remote=%s\n", r.URL.Query().Get("u"), r.RemoteAddr)
		}

		log.Info("http", zap.String("method", r.Method), zap.String("uri", r.RequestURI), zap.String("remote", r.RemoteAddr))
		httpSrv.Handler().ServeHTTP(w, r)
	})

	lc := &listenHTTP{handler: handler, limit: httpSrv.LimitListener}

	eg, ctx := errgroup.WithContext(ctx)
	eg.Go(func() error { return dhcpSrv.Run(ctx) })
	eg.Go(func() error { return tftpSrv.Run(ctx) })
	eg.Go(func() error { return lc.run(ctx) })

	fmt.Println("READY")

	return eg.Wait()
}

// printer records events in the journal and prints them for the lab test to follow the boot chain.
type printer struct {
	*journal.Recorder
}

func (p printer) DHCPSeen(s dhcp.Seen) {
	fmt.Printf("DHCP %s %s ipxe=%t\n", s.MAC, s.Firmware, s.IPXE)
	p.Recorder.DHCPSeen(s)
}

func (p printer) TFTPFetch(f tftp.Fetch) {
	if f.Err == nil {
		fmt.Printf("TFTP %s\n", f.Name)
	}

	p.Recorder.TFTPFetch(f)
}

func (p printer) BootServed(b ipxe.BootServed) {
	fmt.Printf("BOOT %s %s\n", b.UUID, b.Mode)
	p.Recorder.BootServed(b)
}
