// Command labedge is the edge for the boot lab: the edge's own composition root (edge/app), built from the
// lab's flags, serving ProxyDHCP, TFTP and HTTP on a site network namespace. It dials no controller (the
// boot lab plays none: the services the controller would reach listen, unused, on loopback) and serves the
// lab's boot images from -assets. It prints "READY" once built and "CALLBACK u=<uuid> remote=<addr>" for
// every /config request, and "DHCP <mac> <firmware> ipxe=<bool>", "TFTP <file>" and "BOOT <uuid> <mode>"
// for what it serves, so the lab test can follow the boot chain. It is test tooling.
package main

import (
	"context"
	"flag"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/signal"
	"syscall"

	"go.uber.org/zap"

	"github.com/outpost-metal/outpost/edge/app"
	"github.com/outpost-metal/outpost/edge/config"
	"github.com/outpost-metal/outpost/edge/dhcp"
	"github.com/outpost-metal/outpost/edge/ipxe"
	"github.com/outpost-metal/outpost/edge/tftp"
	"github.com/outpost-metal/outpost/shared/logging"
)

func main() {
	cfg := config.Default()

	var assets string

	flag.StringVar(&cfg.DHCP.Interface, "iface", "br0", "interface to serve ProxyDHCP on")
	flag.StringVar(&cfg.DHCP.ServerIP, "ip", "", "the edge's address on that interface")
	flag.StringVar(&cfg.StateDir, "state", "", "state directory")
	flag.StringVar(&assets, "assets", "", "directory of the boot images served under /assets/")
	flag.StringVar(&cfg.IPXEDir, "ipxe-dir", tftp.DefaultDir, "iPXE binaries")
	flag.StringVar(&cfg.LogLevel, "log-level", "info", "log level")
	flag.IntVar(&cfg.HTTP.MaxConns, "http-max-conns", cfg.HTTP.MaxConns, "HTTP connections open at once (the edge's --http-max-conns)")
	flag.StringVar((*string)(&cfg.DHCP.Discovery), "discovery", string(cfg.DHCP.Discovery), "whom the ProxyDHCP answers: all, known or off (the edge's --discovery)")
	flag.Parse()

	log, err := logging.New(os.Stderr, cfg.LogLevel)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(2)
	}

	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, os.Interrupt)
	defer stop()

	if err := run(ctx, log, cfg, assets); err != nil {
		log.Error("labedge failed", zap.Error(err))
		os.Exit(1)
	}
}

func run(ctx context.Context, log *zap.Logger, cfg config.Config, assets string) error {
	cfg.HTTP.Listen = ":80"
	cfg.HTTP.MaxConnsPerSource = min(cfg.HTTP.MaxConnsPerSource, cfg.HTTP.MaxConns)

	controllerAPI, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return fmt.Errorf("controller API listener: %w", err)
	}

	edge, err := app.Build(ctx, cfg, log, app.Options{
		ControllerAPI: controllerAPI,
		WrapHTTP:      func(h http.Handler) http.Handler { return logRequests(h, log) },
		Tap:           printer{},
		FilesDir:      assets,
	})
	if err != nil {
		return err
	}

	fmt.Println("READY")

	return edge.Run(ctx)
}

// logRequests logs every request and prints the /config ones (the booted /init calls back).
func logRequests(h http.Handler, log *zap.Logger) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/config" {
			fmt.Printf("CALLBACK u=%s remote=%s\n", r.URL.Query().Get("u"), r.RemoteAddr)
		}

		log.Info("http", zap.String("method", r.Method), zap.String("uri", r.RequestURI), zap.String("remote", r.RemoteAddr))
		h.ServeHTTP(w, r)
	})
}

// printer prints what the edge serves for the lab test to follow the boot chain.
type printer struct{}

func (printer) DHCPSeen(s dhcp.Seen) { fmt.Printf("DHCP %s %s ipxe=%t\n", s.MAC, s.Firmware, s.IPXE) }

func (printer) TFTPFetch(f tftp.Fetch) {
	if f.Err == nil {
		fmt.Printf("TFTP %s\n", f.Name)
	}
}

func (printer) BootServed(b ipxe.BootServed) {
	fmt.Printf("BOOT %s %s platform=%s\n", b.UUID, b.Mode, b.Platform)
}
