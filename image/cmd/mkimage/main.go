// Command mkimage builds the images under _out/image/ (`make image` runs it): for the edge appliance, the Talos
// system extension tree, the same as an OCI image layout and archive, and, when a controller address and join
// token are given, a validated Talos machine-config patch; for the controller, under controller/, its OCI image
// layout and archive, its systemd unit and its Kubernetes manifest.
package main

import (
	"flag"
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"strings"

	"github.com/outpost-metal/outpost/image"
)

func main() {
	if err := run(os.Args[1:]); err != nil {
		fmt.Fprintln(os.Stderr, "mkimage:", err)
		os.Exit(1)
	}
}

func env(name, def string) string {
	if v, ok := os.LookupEnv(name); ok {
		return v
	}

	return def
}

func run(args []string) error {
	cfg := image.Default()
	fs := flag.NewFlagSet("mkimage", flag.ContinueOnError)

	out := fs.String("out", env("MKIMAGE_OUT", "_out/image"), "output directory (MKIMAGE_OUT)")
	fs.StringVar(&cfg.Version, "version", env("MKIMAGE_VERSION", cfg.Version), "version of both images (MKIMAGE_VERSION)")
	fs.StringVar(&cfg.Arch, "arch", env("MKIMAGE_ARCH", cfg.Arch), "target architecture of both images (MKIMAGE_ARCH)")
	fs.StringVar(&cfg.EdgeBinary, "edge", env("MKIMAGE_EDGE", cfg.EdgeBinary), "static edge binary (MKIMAGE_EDGE)")
	fs.StringVar(&cfg.IPXEDir, "ipxe-dir", env("MKIMAGE_IPXE_DIR", cfg.IPXEDir), "iPXE binaries for every firmware, as hack/ipxe.sh prints them (MKIMAGE_IPXE_DIR)")
	fs.StringVar(&cfg.VMediaLoader, "vmedia-loader", env("MKIMAGE_VMEDIA_LOADER", ""), "virtual-media boot loader from hack/vmedia-loader.sh, shipped as "+image.VMediaLoaderFile+"; empty ships none (MKIMAGE_VMEDIA_LOADER)")
	fs.StringVar(&cfg.PreseedDir, "preseed", env("MKIMAGE_PRESEED", ""), "asset import bundle to bake in (MKIMAGE_PRESEED)")
	fs.StringVar(&cfg.TalosVersion, "talos-version", env("MKIMAGE_TALOS_VERSION", cfg.TalosVersion), "Talos version constraint (MKIMAGE_TALOS_VERSION)")

	ctl := image.DefaultController()

	fs.StringVar(&ctl.Binary, "controller-binary", env("MKIMAGE_CONTROLLER_BINARY", ctl.Binary), "static controller binary; empty skips the controller image (MKIMAGE_CONTROLLER_BINARY)")
	ctlImage := fs.String("controller-image", env("MKIMAGE_CONTROLLER_IMAGE", ""), "the controller image's name in the Kubernetes manifest, as pushed (default outpost-controller:<version>) (MKIMAGE_CONTROLLER_IMAGE)")
	fs.StringVar(&ctl.CABundle, "ca-bundle", env("MKIMAGE_CA_BUNDLE", ctl.CABundle), "CA certificates baked into the controller image (MKIMAGE_CA_BUNDLE)")
	fs.StringVar(&ctl.Source, "source", env("MKIMAGE_SOURCE", ctl.Source), "source repository recorded in the controller image (MKIMAGE_SOURCE)")

	var p image.PatchConfig

	fs.StringVar(&p.ControllerAddress, "controller", env("MKIMAGE_CONTROLLER", ""), "controller uplink address host:port, several comma separated for an active controller and its standby; with -token writes the machine-config patch (MKIMAGE_CONTROLLER)")
	fs.StringVar(&p.JoinToken, "token", env("MKIMAGE_TOKEN", ""), "site join token (MKIMAGE_TOKEN)")
	fs.StringVar(&p.Hostname, "hostname", env("MKIMAGE_HOSTNAME", ""), "appliance host name (MKIMAGE_HOSTNAME)")
	fs.StringVar(&p.Interface, "interface", env("MKIMAGE_INTERFACE", ""), "link for a static address (MKIMAGE_INTERFACE)")
	addrs := fs.String("address", env("MKIMAGE_ADDRESS", ""), "static addresses, comma-separated CIDR (MKIMAGE_ADDRESS)")
	gw := fs.String("gateway", env("MKIMAGE_GATEWAY", ""), "default gateway (MKIMAGE_GATEWAY)")
	dns := fs.String("dns", env("MKIMAGE_DNS", ""), "name servers, comma-separated (MKIMAGE_DNS)")

	if err := fs.Parse(args); err != nil {
		return err
	}

	for a := range strings.SplitSeq(*addrs, ",") {
		if a = strings.TrimSpace(a); a != "" {
			pfx, err := netip.ParsePrefix(a)
			if err != nil {
				return fmt.Errorf("address %q: %w", a, err)
			}

			p.Addresses = append(p.Addresses, pfx)
		}
	}

	if *gw != "" {
		g, err := netip.ParseAddr(*gw)
		if err != nil {
			return fmt.Errorf("gateway %q: %w", *gw, err)
		}

		p.Gateway = g
	}

	for a := range strings.SplitSeq(*dns, ",") {
		if a = strings.TrimSpace(a); a != "" {
			ns, err := netip.ParseAddr(a)
			if err != nil {
				return fmt.Errorf("name server %q: %w", a, err)
			}

			p.Nameservers = append(p.Nameservers, ns)
		}
	}

	var patch *image.PatchConfig
	if p.ControllerAddress != "" || p.JoinToken != "" {
		patch = &p
	}

	// the controller's inputs are checked before anything is built, so that a mistake there costs no edge build
	ctl.Version, ctl.Arch = cfg.Version, cfg.Arch

	if ctl.Binary != "" {
		if err := ctl.Validate(); err != nil {
			return fmt.Errorf("controller image config: %w", err)
		}

		if *ctlImage != "" {
			if _, err := image.RenderKubernetesManifest(*ctlImage); err != nil {
				return err
			}
		}
	}

	if err := os.MkdirAll(*out, 0o755); err != nil {
		return err
	}

	res, err := image.Build(cfg, patch, *out)
	if err != nil {
		return err
	}

	fmt.Printf("extension:   %s\noci layout:  %s\noci archive: %s\n", res.ExtensionDir, res.OCILayout, res.OCIArchive)

	if res.Patch != "" {
		fmt.Printf("patch:       %s\n", res.Patch)
	} else {
		fmt.Println("patch:       skipped (give -controller and -token)")
	}

	if ctl.Binary == "" {
		fmt.Println("controller:  skipped (give -controller-binary)")

		return nil
	}

	cres, err := image.BuildController(ctl, *ctlImage, filepath.Join(*out, "controller"))
	if err != nil {
		return err
	}

	fmt.Printf("controller oci layout:  %s (%s)\ncontroller oci archive: %s\nsystemd unit:           %s\nkubernetes manifest:    %s\n",
		cres.OCILayout, image.ControllerImageRef(ctl.Version), cres.OCIArchive, cres.Unit, cres.Manifest)

	return nil
}
