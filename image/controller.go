package image

import (
	"archive/tar"
	"bytes"
	"debug/elf"
	"errors"
	"fmt"
	"os"
	"path"
	"path/filepath"
	"strconv"
	"strings"

	v1 "github.com/google/go-containerregistry/pkg/v1"
)

// The controller's image: what is in it and how it runs. The tests bind these to the controller binary's own
// flags and defaults and to the systemd unit and the Kubernetes manifest beside this file.
const (
	// ControllerImageName is the controller image's name in its OCI layout (tagged with the version), and the
	// repository name the Kubernetes manifest pulls.
	ControllerImageName = "outpost-controller"
	// ControllerBinary is the controller's path inside the image, its entrypoint. The systemd unit installs it
	// at the same path, so `outpost-controller site list` reads the same everywhere.
	ControllerBinary = "/usr/local/bin/outpost-controller"
	// ControllerStateDir is the controller's state directory inside the image (and under systemd): the
	// enrolment CA, the site store (a bolt file) and the admin socket. It is a volume: losing it loses every
	// site's enrolment.
	ControllerStateDir = "/var/lib/outpost-controller"
	// ControllerUID and ControllerGID are the unprivileged user the image runs as. Numeric in the image config
	// so that Kubernetes can check runAsNonRoot without a passwd lookup.
	ControllerUID = 65532
	ControllerGID = 65532
	// ControllerUplinkPort is where edges connect (the controller's default --uplink-listen port).
	ControllerUplinkPort = 8443
	// ControllerHTTPPort serves /metrics and /healthz (the controller's default --http-listen port; the image
	// listens on every address so that probes and scrapes from outside the container reach it).
	ControllerHTTPPort = 9464
	// ControllerCABundle is where the image keeps the CA certificates the controller trusts for Omni (the path
	// Go's crypto/x509 reads first on Linux).
	ControllerCABundle = "/etc/ssl/certs/ca-certificates.crt"
)

// Environment variables the controller reads (the twins of --state-dir, --uplink-listen, --http-listen and
// --omni-endpoint; the service-account key has no flag so that it never shows in a process list).
const (
	EnvControllerStateDir     = "OUTPOST_STATE_DIR"
	EnvControllerUplinkListen = "OUTPOST_UPLINK_LISTEN"
	EnvControllerHTTPListen   = "OUTPOST_HTTP_LISTEN"
	EnvOmniEndpoint           = "OMNI_ENDPOINT"
	EnvOmniServiceAccountKey  = "OMNI_SERVICE_ACCOUNT_KEY"
)

// DefaultSource is the project's source repository, recorded in the image's org.opencontainers.image.source.
const DefaultSource = "https://github.com/outpost-metal/outpost"

// ControllerConfig says what goes into the controller image.
type ControllerConfig struct {
	// Version tags the image and fills org.opencontainers.image.version.
	Version string
	// Arch is the target architecture ("amd64" or "arm64"); the binary must be built for it.
	Arch string
	// Binary is the path of the static controller binary (make build: _out/bin/controller).
	Binary string
	// CABundle is the PEM bundle of CA certificates to bake in (Debian's ca-certificates package), so that
	// the controller can verify Omni's certificate. SSL_CERT_FILE in the container overrides it.
	CABundle string
	// Source fills org.opencontainers.image.source.
	Source string
}

// DefaultController returns the default controller image configuration.
func DefaultController() ControllerConfig {
	return ControllerConfig{
		Version:  "dev",
		Arch:     "amd64",
		Binary:   "_out/bin/controller",
		CABundle: "/etc/ssl/certs/ca-certificates.crt",
		Source:   DefaultSource,
	}
}

// Validate checks the configuration: the binary must be a static ELF executable for Arch, since the image
// holds nothing else it could load.
func (c ControllerConfig) Validate() error {
	var errs []error

	if c.Version == "" {
		errs = append(errs, errors.New("version is empty"))
	}

	machine, ok := map[string]elf.Machine{"amd64": elf.EM_X86_64, "arm64": elf.EM_AARCH64}[c.Arch]
	if !ok {
		errs = append(errs, fmt.Errorf("arch %q: want amd64 or arm64", c.Arch))
	}

	if err := checkStaticELF(c.Binary, machine); err != nil {
		errs = append(errs, fmt.Errorf("controller binary %q: %w (run make build, which builds it with CGO_ENABLED=0)", c.Binary, err))
	}

	if fi, err := os.Stat(c.CABundle); err != nil || !fi.Mode().IsRegular() || fi.Size() == 0 {
		errs = append(errs, fmt.Errorf("CA bundle %q: not a non-empty file (install Debian's ca-certificates package)", c.CABundle))
	}

	return errors.Join(errs...)
}

// checkStaticELF reports whether path is an ELF executable for machine that needs no dynamic loader: no
// PT_INTERP program header and no DT_NEEDED library (machine 0 skips the machine check).
func checkStaticELF(path string, machine elf.Machine) error {
	f, err := elf.Open(path)
	if err != nil {
		return err
	}
	defer f.Close() //nolint:errcheck

	return staticELF(f, machine)
}

func staticELF(f *elf.File, machine elf.Machine) error {
	if f.Type != elf.ET_EXEC && f.Type != elf.ET_DYN {
		return fmt.Errorf("ELF type %s is not an executable", f.Type)
	}

	if machine != 0 && f.Machine != machine {
		return fmt.Errorf("built for %s, not %s", f.Machine, machine)
	}

	for _, p := range f.Progs {
		if p.Type == elf.PT_INTERP {
			return errors.New("dynamically linked (has an ELF interpreter)")
		}
	}

	libs, err := f.ImportedLibraries()
	if err != nil {
		return fmt.Errorf("read dynamic section: %w", err)
	}

	if len(libs) > 0 {
		return fmt.Errorf("dynamically linked against %s", strings.Join(libs, ", "))
	}

	return nil
}

// ControllerEnv is the environment the image sets: where the state is and where to listen. Everything else
// (Omni endpoint and key, provider ID, image factory) is the deployment's to say.
func ControllerEnv() []string {
	return []string{
		"PATH=/usr/local/bin",
		EnvControllerStateDir + "=" + ControllerStateDir,
		EnvControllerUplinkListen + "=:" + strconv.Itoa(ControllerUplinkPort),
		EnvControllerHTTPListen + "=:" + strconv.Itoa(ControllerHTTPPort),
	}
}

// ControllerImageRef is the name the controller image carries in its OCI layout: outpost-controller:<version>.
func ControllerImageRef(version string) string { return ControllerImageName + ":" + version }

// writeControllerRoot lays out the controller image's file system under root: the binary, the CA bundle, a
// passwd and group naming the unprivileged user (so that tools inside and outside show a name), the state
// directory and /tmp.
func writeControllerRoot(c ControllerConfig, root string) error {
	if err := copyFile(c.Binary, filepath.Join(root, ControllerBinary), 0o755); err != nil {
		return err
	}

	if err := copyFile(c.CABundle, filepath.Join(root, ControllerCABundle), 0o644); err != nil {
		return err
	}

	passwd := fmt.Sprintf("root:x:0:0:root:/root:/sbin/nologin\noutpost:x:%d:%d:Outpost controller:%s:/sbin/nologin\n",
		ControllerUID, ControllerGID, ControllerStateDir)
	group := fmt.Sprintf("root:x:0:\noutpost:x:%d:\n", ControllerGID)

	for name, data := range map[string]string{"/etc/passwd": passwd, "/etc/group": group} {
		if err := writeFile(filepath.Join(root, name), strings.NewReader(data), 0o644); err != nil {
			return err
		}
	}

	for _, d := range []string{ControllerStateDir, "/tmp"} {
		if err := os.MkdirAll(filepath.Join(root, d), 0o755); err != nil {
			return fmt.Errorf("create %s: %w", d, err)
		}
	}

	return nil
}

// controllerHeader sets what a file tree on disk cannot carry portably: the state directory belongs to the
// controller's user and only to it (the controller creates it 0700 when it is missing; an empty volume
// mounted there takes the image's ownership in Docker and Podman), /tmp is world-writable and sticky.
func controllerHeader(hdr *tar.Header) {
	switch strings.TrimSuffix(hdr.Name, "/") {
	case strings.TrimPrefix(ControllerStateDir, "/"):
		hdr.Uid, hdr.Gid, hdr.Mode = ControllerUID, ControllerGID, 0o700
	case "tmp":
		hdr.Mode = 0o1777
	}
}

// BuildControllerOCI builds the controller's OCI image: one reproducible layer (the binary as entrypoint, CA
// certificates, passwd and group, the state directory) and a config that runs it as an unprivileged user with
// the state directory as a volume and both ports exposed. tmpDir receives the file tree and the layer.
func BuildControllerOCI(c ControllerConfig, tmpDir string) (v1.Image, error) {
	if err := c.Validate(); err != nil {
		return nil, fmt.Errorf("controller image config: %w", err)
	}

	root := filepath.Join(tmpDir, "rootfs")
	if err := writeControllerRoot(c, root); err != nil {
		return nil, fmt.Errorf("lay out controller image: %w", err)
	}

	return singleLayerImage(root, tmpDir, controllerHeader, func(cf *v1.ConfigFile) {
		cf.Architecture = c.Arch
		cf.Config.Entrypoint = []string{ControllerBinary}
		cf.Config.Cmd = nil
		cf.Config.Env = ControllerEnv()
		cf.Config.User = fmt.Sprintf("%d:%d", ControllerUID, ControllerGID)
		cf.Config.WorkingDir = ControllerStateDir
		cf.Config.StopSignal = "SIGTERM"
		cf.Config.Volumes = map[string]struct{}{ControllerStateDir: {}}
		cf.Config.ExposedPorts = map[string]struct{}{
			strconv.Itoa(ControllerUplinkPort) + "/tcp": {},
			strconv.Itoa(ControllerHTTPPort) + "/tcp":   {},
		}
		cf.Config.Labels = map[string]string{
			"org.opencontainers.image.title":       ControllerImageName,
			"org.opencontainers.image.description": "Outpost controller: Omni static infra provider and the uplink every site's edge dials",
			"org.opencontainers.image.version":     c.Version,
			"org.opencontainers.image.source":      c.Source,
			"org.opencontainers.image.licenses":    "Apache-2.0",
		}
	})
}

// ControllerOutputs names what BuildController wrote.
type ControllerOutputs struct {
	OCILayout  string
	OCIArchive string
	Unit       string
	Manifest   string
}

// BuildController writes the controller's artifacts under outDir: oci/ (the image as an OCI image layout,
// named outpost-controller:<version>), outpost-controller.oci.tar (the layout as an archive), the systemd unit,
// and the Kubernetes manifest with its image set to imageRef (empty: outpost-controller:<version>, the name
// in the layout; give the name it is pushed under).
func BuildController(c ControllerConfig, imageRef, outDir string) (ControllerOutputs, error) {
	out := ControllerOutputs{
		OCILayout:  filepath.Join(outDir, "oci"),
		OCIArchive: filepath.Join(outDir, ControllerImageName+".oci.tar"),
		Unit:       filepath.Join(outDir, path.Base(ControllerUnitFile)),
		Manifest:   filepath.Join(outDir, path.Base(KubernetesManifestFile)),
	}

	if imageRef == "" {
		imageRef = ControllerImageRef(c.Version)
	}

	manifest, err := RenderKubernetesManifest(imageRef)
	if err != nil {
		return out, err
	}

	if err := os.MkdirAll(outDir, 0o755); err != nil {
		return out, fmt.Errorf("create %s: %w", outDir, err)
	}

	tmp, err := os.MkdirTemp(outDir, ".build-*")
	if err != nil {
		return out, fmt.Errorf("create build directory: %w", err)
	}
	defer os.RemoveAll(tmp) //nolint:errcheck

	img, err := BuildControllerOCI(c, tmp)
	if err != nil {
		return out, err
	}

	if err := WriteOCILayout(img, out.OCILayout, ControllerImageRef(c.Version)); err != nil {
		return out, err
	}

	if err := WriteOCIArchive(out.OCILayout, out.OCIArchive); err != nil {
		return out, fmt.Errorf("write OCI archive: %w", err)
	}

	if err := writeFile(out.Unit, bytes.NewReader(ControllerUnit()), 0o644); err != nil {
		return out, err
	}

	if err := writeFile(out.Manifest, bytes.NewReader(manifest), 0o644); err != nil {
		return out, err
	}

	return out, nil
}
