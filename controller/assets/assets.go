// The resolver turns what a machine must boot into concrete install assets: the image factory's PXE script
// for a Talos version, extensions and kernel arguments (through a schematic), or kernel and initramfs files from a
// local directory for air-gapped sites and tests.

package assets

import (
	"context"
	"errors"
	"fmt"
	"regexp"
	"slices"
	"strings"

	"github.com/siderolabs/image-factory/pkg/schematic"

	"github.com/outpost-metal/outpost/shared/metal"
)

// ErrNotAvailable means the assets for a profile cannot be had (not in the local directory, factory refused).
var ErrNotAvailable = errors.New("boot assets not available")

// Profile is what a machine boots: a Talos version with official extensions and extra kernel arguments.
type Profile struct {
	TalosVersion string
	Extensions   []string
	// KernelArgs are baked into the schematic (factory) or appended (local).
	KernelArgs []string
	// Arch is amd64 or arm64 ("": Normalize makes it amd64).
	Arch metal.Arch
	// SecureBoot asks for the profile's signed unified kernel image as well, for machines that enforce Secure
	// Boot. Its command line is locked, so the kernel arguments are baked into its schematic (which makes the
	// schematic the profile's own, not the extensions' alone).
	SecureBoot bool
}

// Schematic is the image factory schematic of the profile: its extensions, and for a Secure Boot profile its
// kernel arguments.
func (p Profile) Schematic() *schematic.Schematic {
	p = p.Normalize()
	sc := &schematic.Schematic{Customization: schematic.Customization{
		SystemExtensions: schematic.SystemExtensions{OfficialExtensions: p.Extensions},
	}}

	if p.SecureBoot {
		sc.Customization.ExtraKernelArgs = p.KernelArgs
	}

	return sc
}

// Normalize returns the profile with its Talos version in canonical form (with the leading v), sorted and
// de-duplicated extensions and the default arch, so that equal profiles resolve to the same schematic. A version
// that is not a Talos version is left as it is (Resolve refuses it).
func (p Profile) Normalize() Profile {
	if v, err := CanonicalTalosVersion(p.TalosVersion); err == nil {
		p.TalosVersion = v
	}

	ext := slices.Clone(p.Extensions)
	slices.Sort(ext)
	p.Extensions = slices.Compact(ext)
	p.KernelArgs = slices.Clone(p.KernelArgs)

	if p.Arch == "" {
		p.Arch = metal.AMD64
	}

	return p
}

// Boot is a resolved profile: the kernel and initramfs a machine boots, with the kernel arguments it needs.
type Boot struct {
	// KernelURL and InitrdURL are where machines fetch the kernel and initramfs: edge-relative
	// (/assets/<logical name>) for assets the site's edge holds, or an absolute URL.
	KernelURL, InitrdURL string
	// UpstreamKernelURL and UpstreamInitrdURL are where the same files come from upstream (the image factory):
	// the controller downloads them from there once, and machines at a passthrough site fetch them from there
	// themselves. Empty for local files.
	UpstreamKernelURL, UpstreamInitrdURL string
	// Installer is the installer image Talos pulls after the install boot (registry/repository:tag), when the
	// source has one: the controller pulls it once and the site's edge serves it as a registry mirror.
	Installer string
	// KernelArgs are to be appended to the kernel command line.
	KernelArgs []string
	// SchematicID identifies the image factory schematic of the kernel and initramfs (extensions only).
	SchematicID string
	// SignedURL is the profile's signed unified kernel image (Secure Boot profiles; "" when the source has
	// none), edge-relative like KernelURL; UpstreamSignedURL is where it comes from upstream. Its schematic is
	// SignedSchematicID (the kernel arguments baked in), and Installer is then the Secure Boot installer.
	SignedURL, UpstreamSignedURL string
	SignedSchematicID            string
}

// SignedKind is the kind (InstallAssetName) of a profile's signed unified kernel image.
const SignedKind = "secureboot-uki.efi"

// InstallAssetName is the logical name of a Talos install kernel or initramfs (kind "kernel" or
// "initramfs.xz") of a schematic, version and arch: talos/<version>/<schematic>/<arch>/<kind>. Edges serve it
// under /assets/<name>, and the controller holds it under the same name.
func InstallAssetName(version, schematicID, arch, kind string) string {
	return "talos/" + version + "/" + schematicID + "/" + arch + "/" + kind
}

// Resolver resolves profiles to boot assets.
type Resolver interface {
	Resolve(ctx context.Context, p Profile) (Boot, error)
}

func validArch(arch string) bool {
	_, err := metal.ParseArch(arch)

	return err == nil
}

// talosVersion is a Talos release version: major.minor.patch with an optional pre-release (1.14.0-alpha.2),
// with or without the leading v.
var talosVersion = regexp.MustCompile(`^v?[0-9]{1,4}\.[0-9]{1,4}\.[0-9]{1,4}(-[0-9A-Za-z]+(\.[0-9A-Za-z]+)*)?$`)

// CanonicalTalosVersion returns a Talos version in the form the image factory and this project use everywhere
// (v1.11.5). Omni writes a cluster's version without the v (1.11.5); both are accepted.
func CanonicalTalosVersion(v string) (string, error) {
	if len(v) > 64 || !talosVersion.MatchString(v) {
		return "", fmt.Errorf("talos version %q: want major.minor.patch, e.g. 1.11.5 or v1.11.5", v)
	}

	if !strings.HasPrefix(v, "v") {
		v = "v" + v
	}

	return v, nil
}

func validVersion(v string) bool {
	_, err := CanonicalTalosVersion(v)

	return err == nil && strings.HasPrefix(v, "v")
}

// Staged is an install profile staged at a site ahead of need: a schematic's Talos version for an arch.
type Staged struct {
	Version, SchematicID, Arch string
}

// schematicRe is an image factory schematic ID: the SHA-256 hex of the schematic.
var schematicRe = regexp.MustCompile(`^[0-9a-f]{64}$`)

// ParseStaged parses a staged profile as stored ("<version>/<schematic>/<arch>") or checks one an operator
// gave field by field (the version in either form).
func ParseStaged(s string) (Staged, error) {
	parts := strings.Split(s, "/")
	if len(parts) != 3 {
		return Staged{}, fmt.Errorf("staged profile %q: want <version>/<schematic>/<arch>", s)
	}

	return Staged{Version: parts[0], SchematicID: parts[1], Arch: parts[2]}.Check()
}

// Check returns st with its version in canonical form, or what is wrong with it.
func (st Staged) Check() (Staged, error) {
	v, err := CanonicalTalosVersion(st.Version)
	if err != nil {
		return Staged{}, err
	}

	if !schematicRe.MatchString(st.SchematicID) {
		return Staged{}, fmt.Errorf("schematic %q: want the 64 hex characters of a schematic ID", st.SchematicID)
	}

	if !validArch(st.Arch) {
		return Staged{}, fmt.Errorf("arch %q: want amd64 or arm64", st.Arch)
	}

	st.Version = v

	return st, nil
}

// String is the stored form.
func (st Staged) String() string { return st.Version + "/" + st.SchematicID + "/" + st.Arch }

// Stager gives the install boot of a staged profile without asking anyone (both resolvers do).
type Stager interface {
	// BootOf returns the boot of a schematic's Talos version for an arch, as Resolve would for a profile
	// whose extensions make that schematic.
	BootOf(st Staged) Boot
}

// Wants are the upstream assets of a boot for arch: its kernel and initramfs by their edge-local names
// with the URLs they come from, and its installer image ("" URLs: local files, none).
func (b Boot) Wants(arch string) []Want {
	var out []Want

	for _, f := range [][2]string{{b.KernelURL, b.UpstreamKernelURL}, {b.InitrdURL, b.UpstreamInitrdURL}, {b.SignedURL, b.UpstreamSignedURL}} {
		if name, ok := strings.CutPrefix(f[0], "/assets/"); ok && f[1] != "" {
			out = append(out, Want{Name: name, URL: f[1]})
		}
	}

	if b.Installer != "" {
		out = append(out, Want{Image: b.Installer, Arch: arch})
	}

	return out
}
