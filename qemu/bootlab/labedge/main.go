// Command labedge is the edge for the boot lab: the edge's own composition root (edge/app), built from the
// lab's flags, serving ProxyDHCP, TFTP and HTTP on a site network namespace. It dials no controller (the
// boot lab plays none: the services the controller would reach listen, unused, on loopback) and serves the
// lab's boot images from -assets. It prints "READY" once built and "CALLBACK u=<uuid> remote=<addr>" for
// every /config request, and "DHCP <mac> <firmware> ipxe=<bool>", "TFTP <file>" and "BOOT <uuid> <mode>"
// (" signed=<name>" after a signed image's fetch) for what it serves, so the lab test can follow the boot
// chain; "APPLIED <version>" once a -plan-file change (at SIGHUP) is applied. It is test tooling.
package main

import (
	"context"
	"flag"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/signal"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"
	"time"

	"go.uber.org/zap"
	"golang.org/x/sync/errgroup"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/outpost-metal/outpost/edge/app"
	"github.com/outpost-metal/outpost/edge/bootfiles"
	"github.com/outpost-metal/outpost/edge/config"
	"github.com/outpost-metal/outpost/edge/dhcp"
	"github.com/outpost-metal/outpost/edge/httpd"
	bootpb "github.com/outpost-metal/outpost/shared/api/boot"
	"github.com/outpost-metal/outpost/shared/logging"
)

func main() {
	cfg := config.Default()

	var (
		assets, registered string
		noTFTP             bool
		lab                labFlags
	)

	flag.StringVar(&cfg.DHCP.Interface, "iface", "br0", "interface to serve ProxyDHCP on")
	flag.StringVar(&cfg.DHCP.ServerIP, "ip", "", "the edge's address on that interface")
	flag.StringVar(&cfg.StateDir, "state", "", "state directory")
	flag.StringVar(&assets, "assets", "", "directory of the boot images served under /assets/")
	flag.StringVar(&cfg.IPXEDir, "ipxe-dir", "", "iPXE binaries for every firmware (hack/ipxe.sh prints their directory)")
	flag.StringVar(&cfg.LogLevel, "log-level", "info", "log level")
	flag.IntVar(&cfg.HTTP.MaxConns, "http-max-conns", cfg.HTTP.MaxConns, "HTTP connections open at once (the edge's --http-max-conns)")
	flag.StringVar((*string)(&cfg.DHCP.Discovery), "discovery", string(cfg.DHCP.Discovery), "whom the ProxyDHCP answers: all, known or off (the edge's --discovery)")
	flag.StringVar((*string)(&cfg.DHCP.Mode), "proxydhcp-mode", string(cfg.DHCP.Mode), "full or 4011-only (the edge's --proxydhcp-mode)")
	flag.StringVar(&registered, "register-macs", "", "comma-separated MACs registered before they boot, with discovery known for the site: "+
		"applied as the controller applies a site's table, through the edge's boot-plan service")
	flag.StringVar(&lab.disk, "disk", "", "<uuid>=<method>: the machine's plan is disk, handed off by that method "+
		"(ipxe-exit, http-404 or ipxe-sanboot), applied through the edge's boot-plan service as the controller does")
	flag.StringVar(&lab.planFile, "plan-file", "", "a file of plans, one \"<uuid> install <image>\", \"<uuid> install signed=<url>\" "+
		"or \"<uuid> disk <method>\" a line, each ending in \"secure-boot\" for a machine the controller knows enforces Secure Boot "+
		"(its BMC said so): applied at start and again at every SIGHUP (a new table version, \"APPLIED <version>\" printed), as "+
		"the controller changes a machine's plan; install <image> boots /assets/install/<arch>/ with outpost.lab.image=<the edge's "+
		"URL of /assets/<image>>; install signed=<url> names the plan's signed image instead, as the controller does for a Secure "+
		"Boot machine (no kernel: the image carries its own command line), <url> being /assets/<name> (held by the edge: "+
		"-assets) or an http(s) URL")
	flag.StringVar(&lab.failFirst, "fail-first", "", "<path prefix>=<n>: the first n GETs under that prefix answer 503 (a flaky download)")
	flag.StringVar(&cfg.DHCP.Files.UEFIx86Signed, "signed-file", "", "the signed UKI in -ipxe-dir that machines enforcing Secure Boot get")
	flag.BoolVar(&lab.secureBootSite, "secure-boot-site", false, "the site's machines enforce Secure Boot, applied through the edge's "+
		"boot-plan service in the site's table as the controller does (controller site set --secure-boot on)")
	flag.BoolVar(&noTFTP, "no-tftp", false, "serve no TFTP at all, as a site whose machines reach no TFTP (UEFI HTTP boot only)")
	flag.Parse()

	if noTFTP {
		cfg.TFTP.Listen = ""
	}

	log, err := logging.New(os.Stderr, cfg.LogLevel)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(2)
	}

	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, os.Interrupt)
	defer stop()

	lab.registered, lab.edgeIP = registered, cfg.DHCP.ServerIP

	if err := run(ctx, log, cfg, assets, lab); err != nil {
		log.Error("labedge failed", zap.Error(err))
		os.Exit(1)
	}
}

// labFlags are the lab's changes to the site's table and to the edge's HTTP answers.
type labFlags struct {
	registered, disk, failFirst, planFile string
	// edgeIP is the edge's address, for the install image's URL.
	edgeIP string
	// secureBootSite sets the site's Secure Boot in its table (at start: a -plan-file's table has none).
	secureBootSite bool
}

func run(ctx context.Context, log *zap.Logger, cfg config.Config, assets string, lab labFlags) error {
	cfg.HTTP.Listen = ":80"
	cfg.HTTP.MaxConnsPerSource = min(cfg.HTTP.MaxConnsPerSource, cfg.HTTP.MaxConns)

	fail, err := parseFailFirst(lab.failFirst)
	if err != nil {
		return err
	}

	tbl, err := siteTable(lab)
	if err != nil {
		return err
	}

	// SIGHUP is caught before the edge is up: a plan change must never kill the edge.
	hup := make(chan os.Signal, 1)
	signal.Notify(hup, syscall.SIGHUP)

	controllerAPI, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return fmt.Errorf("controller API listener: %w", err)
	}

	edge, err := app.Build(ctx, cfg, log, app.Options{
		ControllerAPI: controllerAPI,
		WrapHTTP:      func(h http.Handler) http.Handler { return logRequests(failFirst(h, fail), log) },
		Tap:           printer{},
		FilesDir:      assets,
	})
	if err != nil {
		return err
	}

	eg, ctx := errgroup.WithContext(ctx)
	eg.Go(func() error { return edge.Run(ctx) })
	eg.Go(func() error {
		if tbl != nil {
			if err := applyTable(ctx, controllerAPI.Addr().String(), tbl); err != nil {
				return err
			}
		}

		fmt.Println("READY")

		if lab.planFile == "" {
			return nil
		}

		version := uint64(1)
		if tbl != nil {
			version = tbl.GetVersion()
		}

		for {
			select {
			case <-ctx.Done():
				return nil
			case <-hup:
			}

			version++

			plans, err := readPlanFile(lab.planFile, lab.edgeIP)
			if err == nil {
				err = applyTable(ctx, controllerAPI.Addr().String(), &bootpb.Table{Version: version, Plans: plans})
			}

			if err != nil {
				log.Error("plan file not applied", zap.String("file", lab.planFile), zap.Error(err))
				fmt.Printf("APPLY-FAILED %d %v\n", version, err)

				continue
			}

			fmt.Printf("APPLIED %d\n", version)
		}
	})

	return eg.Wait()
}

// diskMethods are the -disk and -plan-file names of the disk hand-off methods.
var diskMethods = map[string]bootpb.DiskMethod{
	"ipxe-exit": bootpb.DiskMethod_DISK_METHOD_IPXE_EXIT, "http-404": bootpb.DiskMethod_DISK_METHOD_HTTP_404,
	"ipxe-sanboot": bootpb.DiskMethod_DISK_METHOD_IPXE_SANBOOT,
}

// readPlanFile reads the -plan-file's plans: "<uuid> install <image>" boots the lab's install kernel and
// initramfs (/assets/install/x86_64/, or /assets/install/<arch>/ for "<uuid> install <image> <arch>"), told
// to write /assets/<image> to the machine's disk; "<uuid> install signed=<url>" is an install from a signed
// image (Plan.signed_image, no kernel, as the controller plans a Secure Boot machine's: what it installs is on
// the image's own command line); "<uuid> disk <method>" hands the machine off to its disk. A line ending in
// "secure-boot" is the plan of a machine the controller knows enforces Secure Boot.
func readPlanFile(name, edgeIP string) ([]*bootpb.Plan, error) {
	b, err := os.ReadFile(name)
	if err != nil {
		return nil, fmt.Errorf("read plan file: %w", err)
	}

	var plans []*bootpb.Plan

	for _, line := range strings.Split(string(b), "\n") {
		f := strings.Fields(line)
		if len(f) == 0 {
			continue
		}

		sb := bootpb.SecureBoot_SECURE_BOOT_UNSPECIFIED
		if f[len(f)-1] == "secure-boot" {
			sb, f = bootpb.SecureBoot_SECURE_BOOT_ON, f[:len(f)-1]
		}

		if len(f) == 3 && f[1] == "install" && strings.HasPrefix(f[2], "signed=") {
			plans = append(plans, &bootpb.Plan{
				Uuid: f[0], Mode: bootpb.Mode_MODE_INSTALL, SecureBoot: sb, Install: &bootpb.Kernel{},
				SignedImage: &bootpb.SignedImage{Url: strings.TrimPrefix(f[2], "signed=")},
			})

			continue
		}

		arch := "x86_64"
		if len(f) == 4 && f[1] == "install" {
			arch, f = f[3], f[:3]
		}

		if len(f) != 3 {
			return nil, fmt.Errorf("plan %q: want <uuid> install <image>, <uuid> install signed=<url> or <uuid> disk <method>", line)
		}

		switch f[1] {
		case "install":
			plans = append(plans, &bootpb.Plan{Uuid: f[0], Mode: bootpb.Mode_MODE_INSTALL, SecureBoot: sb, Install: &bootpb.Kernel{
				KernelUrl: "/assets/install/" + arch + "/vmlinuz", InitrdUrl: "/assets/install/" + arch + "/initramfs.xz",
				Args: []string{"outpost.lab.image=http://" + edgeIP + "/assets/" + f[2]},
			}})
		case "disk":
			m, ok := diskMethods[f[2]]
			if !ok {
				return nil, fmt.Errorf("plan %q: unknown disk method", line)
			}

			plans = append(plans, &bootpb.Plan{Uuid: f[0], Mode: bootpb.Mode_MODE_DISK, DiskMethod: m, SecureBoot: sb})
		default:
			return nil, fmt.Errorf("plan %q: unknown mode %q", line, f[1])
		}
	}

	return plans, nil
}

// siteTable is the table a controller would send for the lab's flags (nil when they change nothing): with
// registered MACs, the site set to discovery known with them added (controller site set --discovery known;
// controller site machine add); with a disk plan, that machine's plan; with -secure-boot-site, the site's
// machines enforcing Secure Boot (controller site set --secure-boot on).
func siteTable(lab labFlags) (*bootpb.Table, error) {
	if lab.registered == "" && lab.disk == "" && !lab.secureBootSite {
		return nil, nil
	}

	tbl := &bootpb.Table{Version: 1}
	if lab.secureBootSite {
		tbl.SecureBoot = bootpb.SecureBoot_SECURE_BOOT_ON
	}

	if lab.registered != "" {
		tbl.Discovery, tbl.RegisteredMacs = bootpb.Discovery_DISCOVERY_KNOWN, strings.Split(lab.registered, ",")
	}

	if lab.disk != "" {
		uuid, method, ok := strings.Cut(lab.disk, "=")

		m, known := diskMethods[method]
		if !ok || !known {
			return nil, fmt.Errorf("-disk %q: want <uuid>=ipxe-exit|http-404|ipxe-sanboot", lab.disk)
		}

		tbl.Plans = []*bootpb.Plan{{Uuid: uuid, Mode: bootpb.Mode_MODE_DISK, DiskMethod: m}}
	}

	return tbl, nil
}

// applyTable applies tbl over the edge's own boot-plan service, as the controller does.
func applyTable(ctx context.Context, addr string, tbl *bootpb.Table) error {
	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		return err
	}
	defer conn.Close() //nolint:errcheck // test tooling

	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()

	_, err = bootpb.NewBootPlansClient(conn).Apply(ctx, &bootpb.ApplyRequest{Change: &bootpb.ApplyRequest_Snapshot{Snapshot: tbl}}, grpc.WaitForReady(true))
	if err != nil {
		return fmt.Errorf("apply the site's table: %w", err)
	}

	return nil
}

// failRule makes the first n GETs under prefix fail.
type failRule struct {
	prefix string
	n      int
}

func parseFailFirst(v string) (*failRule, error) {
	if v == "" {
		return nil, nil
	}

	prefix, count, ok := strings.Cut(v, "=")

	n, err := strconv.Atoi(count)
	if !ok || err != nil || n < 1 || !strings.HasPrefix(prefix, "/") {
		return nil, fmt.Errorf("-fail-first %q: want /<path prefix>=<n>, n >= 1", v)
	}

	return &failRule{prefix: prefix, n: n}, nil
}

// failFirst answers the rule's first n GETs with 503 and prints "FAILED <path>" for each.
func failFirst(h http.Handler, rule *failRule) http.Handler {
	if rule == nil {
		return h
	}

	var failed atomic.Int32

	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method == http.MethodGet && strings.HasPrefix(r.URL.Path, rule.prefix) && int(failed.Add(1)) <= rule.n {
			fmt.Printf("FAILED %s\n", r.URL.Path)
			http.Error(w, "lab: failed on purpose", http.StatusServiceUnavailable)

			return
		}

		h.ServeHTTP(w, r)
	})
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

func (printer) TFTPFetch(f bootfiles.Fetch) {
	if f.Err == nil {
		fmt.Printf("TFTP %s\n", f.Name)
	}
}

// BootServed prints "BOOT <uuid> <mode> platform=<platform>", with " signed=<name>" when the boot was the fetch
// of the machine's signed image /assets/<name> (no script: no platform).
func (printer) BootServed(b httpd.BootServed) {
	signed := ""
	if b.SignedImage != "" {
		signed = " signed=" + b.SignedImage
	}

	fmt.Printf("BOOT %s %s platform=%s%s\n", b.UUID, b.Mode, b.Platform.Name(), signed)
}
