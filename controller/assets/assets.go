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
)

// ErrNotAvailable means the assets for a profile cannot be had (not in the local directory, factory refused).
var ErrNotAvailable = errors.New("boot assets not available")

// Profile is what a machine boots: a Talos version with official extensions and extra kernel arguments.
type Profile struct {
	TalosVersion string
	Extensions   []string
	// KernelArgs are baked into the schematic (factory) or appended (local).
	KernelArgs []string
	// Arch is amd64 or arm64.
	Arch string
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
		p.Arch = "amd64"
	}

	return p
}

// Boot is a resolved profile: either an iPXE script URL (image factory) or kernel and initramfs URLs with the
// kernel arguments the booting machine needs.
type Boot struct {
	// ScriptURL is an iPXE script that boots the profile (image factory PXE endpoint).
	ScriptURL string
	// KernelURL and InitrdURL are set for locally served assets.
	KernelURL, InitrdURL string
	// KernelArgs are to be appended to the kernel command line (local assets; a factory script carries its own).
	KernelArgs []string
	// SchematicID identifies the factory schematic, when one was used.
	SchematicID string
}

// Resolver resolves profiles to boot assets.
type Resolver interface {
	Resolve(ctx context.Context, p Profile) (Boot, error)
}

func validArch(arch string) bool {
	return arch == "amd64" || arch == "arm64"
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
