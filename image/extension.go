// Package image builds the edge appliance's artifacts: a Talos system extension (manifest and extension
// service definition running the edge with host networking and its state on /var), the same tree as an OCI
// image built in Go (no Docker daemon) with the edge binary, Debian's iPXE binaries and optional pre-seeded
// assets, and a Talos machine-config patch (ExtensionServiceConfig with the controller address and join
// token, plus network settings) built and validated with Talos's machinery.
//
// It also builds the controller's: an OCI image holding the static controller binary, run as an unprivileged
// user with its state directory as a volume, and ships the controller's systemd unit and Kubernetes manifest
// (controller/ beside this file) with it.
package image

import (
	"bytes"
	"debug/pe"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"text/template"

	"github.com/siderolabs/talos/pkg/machinery/extensions"
	"github.com/siderolabs/talos/pkg/machinery/extensions/services"
	"go.yaml.in/yaml/v4"
)

// ServiceName is the extension service's name; Talos registers it as "ext-outpost-edge".
const ServiceName = "outpost-edge"

// Paths inside the appliance.
const (
	// StateDir is where the edge keeps its state on the Talos host (the EPHEMERAL partition, /var).
	StateDir = "/var/lib/outpost-edge"
	// containerRoot is where Talos expects the rootfs of the extension service's container.
	containerRoot = "/usr/local/lib/containers/" + ServiceName
	// serviceDefinition is where Talos looks for extension service definitions.
	serviceDefinition = "/usr/local/etc/containers/" + ServiceName + ".yaml"
	// IPXEDir is where the iPXE binaries are inside the service's container.
	IPXEDir = "/usr/lib/ipxe"
	// PreseedDir is where pre-seeded assets (an import bundle) are inside the service's container.
	PreseedDir = "/usr/share/outpost/assets"
	// EdgeBinary is the edge binary inside the service's container.
	EdgeBinary = "/outpost-edge"
)

// IPXEFiles are the iPXE binaries the edge serves, as hack/ipxe.sh lays out Debian's ipxe package: BIOS
// (undionly.kpxe, ipxe.pxe), x86 UEFI (ipxe.efi, snponly.efi) and arm64 UEFI (snp-arm64.efi, handed to
// option 93 = 11 clients, and 19 over HTTP boot). An appliance of either architecture serves machines of both.
var IPXEFiles = []string{"undionly.kpxe", "ipxe.pxe", "ipxe.efi", "snponly.efi", "snp-arm64.efi"}

// ipxeEFIMachines are the EFI files among IPXEFiles and the PE machine each must be built for, so that a file
// of the wrong architecture is never shipped under a name the edge hands another firmware.
var ipxeEFIMachines = map[string]uint16{
	"ipxe.efi": pe.IMAGE_FILE_MACHINE_AMD64, "snponly.efi": pe.IMAGE_FILE_MACHINE_AMD64, "snp-arm64.efi": pe.IMAGE_FILE_MACHINE_ARM64,
}

// VMediaLoaderFile is the name the virtual-media boot loader has in IPXEDir, where the edge looks for it
// (edge/config.VMediaLoaderName).
const VMediaLoaderFile = "vmedia-x86_64.efi"

// Config says what goes into the appliance.
type Config struct {
	// Version is the extension's version (the edge version).
	Version string
	// Arch is the target architecture ("amd64" or "arm64").
	Arch string
	// EdgeBinary is the path of the static edge binary to ship.
	EdgeBinary string
	// IPXEDir is where to take IPXEFiles from (hack/ipxe.sh prints it).
	IPXEDir string
	// VMediaLoader is the boot loader of the edge's virtual-media images (hack/vmedia-loader.sh builds it from
	// Debian's grub-efi-amd64-bin), shipped as VMediaLoaderFile; empty ships none, and the edge refuses to boot
	// machines from images.
	VMediaLoader string
	// PreseedDir optionally holds an asset import bundle (outpost-assets.json and files) to bake in.
	PreseedDir string
	// TalosVersion is the compatibility constraint of the extension, e.g. ">= v1.9.0".
	TalosVersion string
}

// Default returns the default appliance configuration.
func Default() Config {
	return Config{
		Version:      "dev",
		Arch:         "amd64",
		EdgeBinary:   "_out/bin/edge",
		TalosVersion: ">= v1.9.0",
	}
}

// Validate checks the configuration (files must exist).
func (c Config) Validate() error {
	var errs []error

	if c.Version == "" {
		errs = append(errs, errors.New("version is empty"))
	}

	if c.Arch != "amd64" && c.Arch != "arm64" {
		errs = append(errs, fmt.Errorf("arch %q: want amd64 or arm64", c.Arch))
	}

	if fi, err := os.Stat(c.EdgeBinary); err != nil || !fi.Mode().IsRegular() {
		errs = append(errs, fmt.Errorf("edge binary %q: not a regular file (run make build)", c.EdgeBinary))
	}

	if c.IPXEDir == "" {
		errs = append(errs, errors.New("ipxe dir is empty (hack/ipxe.sh fetches Debian's iPXE and prints its directory)"))
	} else {
		for _, f := range IPXEFiles {
			path := filepath.Join(c.IPXEDir, f)
			if _, err := os.Stat(path); err != nil {
				errs = append(errs, fmt.Errorf("ipxe file: %w (hack/ipxe.sh fetches Debian's iPXE)", err))
			} else if machine, ok := ipxeEFIMachines[f]; ok {
				if err := checkPEMachine(path, machine); err != nil {
					errs = append(errs, fmt.Errorf("ipxe file: %w", err))
				}
			}
		}
	}

	if c.VMediaLoader != "" {
		if err := checkPEMachine(c.VMediaLoader, pe.IMAGE_FILE_MACHINE_AMD64); err != nil {
			errs = append(errs, fmt.Errorf("vmedia loader: %w (run hack/vmedia-loader.sh)", err))
		}
	}

	if c.PreseedDir != "" {
		if _, err := os.Stat(filepath.Join(c.PreseedDir, "outpost-assets.json")); err != nil {
			errs = append(errs, fmt.Errorf("pre-seeded assets: %w", err))
		}
	}

	return errors.Join(errs...)
}

// Manifest returns the extension manifest.
func Manifest(c Config) extensions.Manifest {
	return extensions.Manifest{
		Version: "v1alpha1",
		Metadata: extensions.Metadata{
			Name:        ServiceName,
			Version:     c.Version,
			Author:      "Outpost",
			Description: "Outpost edge: ProxyDHCP, TFTP, iPXE over HTTP, boot-asset cache, BMC access and agent tunnels for one site, dialling out to the Outpost controller.",
			Compatibility: extensions.Compatibility{
				Talos: extensions.Constraint{Version: c.TalosVersion},
			},
		},
	}
}

// serviceTemplate is the extension service definition. Talos runs extension services in the host's network
// namespace (the edge needs the site's L2 network for DHCP and TFTP); its state is bind-mounted from /var.
var serviceTemplate = template.Must(template.New("service").Parse(`name: {{ .Name }}
container:
  entrypoint: .{{ .Binary }}
  environment:
    - OUTPOST_STATE_DIR={{ .StateDir }}
    - OUTPOST_IPXE_DIR={{ .IPXEDir }}
{{- if .Preseed }}
    - OUTPOST_ASSETS_PRESEED_DIR={{ .PreseedDir }}
{{- end }}
  mounts:
    - source: {{ .StateDir }}
      destination: {{ .StateDir }}
      type: bind
      options:
        - rbind
        - rw
    - source: /etc/ssl/certs
      destination: /etc/ssl/certs
      type: bind
      options:
        - rbind
        - ro
depends:
  - configuration: true
  - network:
      - addresses
      - connectivity
restart: always
logToConsole: false
`))

// ServiceSpec returns the extension service definition as YAML and as machinery's type (validated).
func ServiceSpec(c Config) ([]byte, *services.Spec, error) {
	var buf bytes.Buffer

	err := serviceTemplate.Execute(&buf, map[string]any{
		"Name": ServiceName, "Binary": EdgeBinary, "StateDir": StateDir, "IPXEDir": IPXEDir,
		"Preseed": c.PreseedDir != "", "PreseedDir": PreseedDir,
	})
	if err != nil {
		return nil, nil, fmt.Errorf("render service definition: %w", err)
	}

	var spec services.Spec

	if err := yaml.Unmarshal(buf.Bytes(), &spec); err != nil {
		return nil, nil, fmt.Errorf("decode service definition: %w", err)
	}

	if err := spec.Validate(); err != nil {
		return nil, nil, fmt.Errorf("validate service definition: %w", err)
	}

	return buf.Bytes(), &spec, nil
}

// WriteExtension writes the system extension tree into dir: manifest.yaml and rootfs/ with the service
// definition and the service's container (edge binary, iPXE binaries, pre-seeded assets). The result is
// validated with machinery's extension loader (constraints and allowed contents).
func WriteExtension(c Config, dir string) error {
	if err := c.Validate(); err != nil {
		return fmt.Errorf("appliance config: %w", err)
	}

	manifest, err := yaml.Marshal(Manifest(c))
	if err != nil {
		return fmt.Errorf("encode extension manifest: %w", err)
	}

	svc, _, err := ServiceSpec(c)
	if err != nil {
		return err
	}

	rootfs := filepath.Join(dir, "rootfs")
	ctr := filepath.Join(rootfs, containerRoot)

	if err := writeFile(filepath.Join(dir, "manifest.yaml"), bytes.NewReader(manifest), 0o644); err != nil {
		return err
	}

	if err := writeFile(filepath.Join(rootfs, serviceDefinition), bytes.NewReader(svc), 0o644); err != nil {
		return err
	}

	if err := copyFile(c.EdgeBinary, filepath.Join(ctr, EdgeBinary), 0o755); err != nil {
		return err
	}

	for _, f := range IPXEFiles {
		if err := copyFile(filepath.Join(c.IPXEDir, f), filepath.Join(ctr, IPXEDir, f), 0o644); err != nil {
			return err
		}
	}

	if c.VMediaLoader != "" {
		if err := copyFile(c.VMediaLoader, filepath.Join(ctr, IPXEDir, VMediaLoaderFile), 0o644); err != nil {
			return err
		}
	}

	// mount points for the bind mounts must exist in the container's rootfs
	for _, d := range []string{StateDir, "/etc/ssl/certs"} {
		if err := os.MkdirAll(filepath.Join(ctr, d), 0o755); err != nil {
			return fmt.Errorf("create mount point: %w", err)
		}
	}

	if c.PreseedDir != "" {
		if err := copyTree(c.PreseedDir, filepath.Join(ctr, PreseedDir)); err != nil {
			return fmt.Errorf("copy pre-seeded assets: %w", err)
		}
	}

	return ValidateExtension(dir)
}

// checkPEMachine reports whether path is an EFI (PE) binary for the given machine, so that an x86 binary is
// never shipped under the arm64 name.
func checkPEMachine(path string, machine uint16) error {
	f, err := pe.Open(path)
	if err != nil {
		return fmt.Errorf("%s: not an EFI binary: %w", path, err)
	}

	defer f.Close() //nolint:errcheck // read-only

	if f.Machine != machine {
		return fmt.Errorf("%s: PE machine %#x, want %#x", path, f.Machine, machine)
	}

	return nil
}

// ValidateExtension loads an extension tree with machinery and validates its constraints and contents.
func ValidateExtension(dir string) error {
	ext, err := extensions.Load(dir)
	if err != nil {
		return fmt.Errorf("load extension: %w", err)
	}

	if err := ext.Validate(extensions.WithValidateContents()); err != nil {
		return fmt.Errorf("validate extension: %w", err)
	}

	data, err := os.ReadFile(filepath.Join(dir, "rootfs", serviceDefinition))
	if err != nil {
		return fmt.Errorf("read service definition: %w", err)
	}

	var spec services.Spec

	if err := yaml.Unmarshal(data, &spec); err != nil {
		return fmt.Errorf("decode service definition: %w", err)
	}

	if err := spec.Validate(); err != nil {
		return fmt.Errorf("validate service definition: %w", err)
	}

	if want := "." + EdgeBinary; spec.Container.Entrypoint != want || !strings.HasPrefix(spec.Name, ServiceName) {
		return fmt.Errorf("service definition runs %q, want %q", spec.Container.Entrypoint, want)
	}

	return nil
}

func writeFile(path string, r io.Reader, mode os.FileMode) error {
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return fmt.Errorf("create directory for %s: %w", path, err)
	}

	f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_TRUNC, mode)
	if err != nil {
		return fmt.Errorf("create %s: %w", path, err)
	}

	if _, err := io.Copy(f, r); err != nil {
		f.Close() //nolint:errcheck

		return fmt.Errorf("write %s: %w", path, err)
	}

	if err := f.Close(); err != nil {
		return fmt.Errorf("write %s: %w", path, err)
	}

	return os.Chmod(path, mode) // not subject to the umask
}

func copyFile(src, dst string, mode os.FileMode) error {
	f, err := os.Open(src)
	if err != nil {
		return fmt.Errorf("open %s: %w", src, err)
	}
	defer f.Close() //nolint:errcheck

	return writeFile(dst, f, mode)
}

// copyTree copies regular files and directories (no links) from src to dst.
func copyTree(src, dst string) error {
	return filepath.WalkDir(src, func(p string, d os.DirEntry, err error) error {
		if err != nil {
			return err
		}

		rel, err := filepath.Rel(src, p)
		if err != nil {
			return err
		}

		switch {
		case d.IsDir():
			return os.MkdirAll(filepath.Join(dst, rel), 0o755)
		case d.Type().IsRegular():
			return copyFile(p, filepath.Join(dst, rel), 0o644)
		default:
			return fmt.Errorf("%s: only regular files can be pre-seeded", p)
		}
	})
}
