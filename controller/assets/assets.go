// The resolver turns what a machine must boot into concrete install assets: the image factory's PXE script
// for a Talos version, extensions and kernel arguments (through a schematic), or kernel and initramfs files from a
// local directory for air-gapped sites and tests.

package assets

import (
	"context"
	"errors"
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

// Normalize returns the profile with sorted, de-duplicated extensions and the default arch, so that equal
// profiles resolve to the same schematic.
func (p Profile) Normalize() Profile {
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

func validVersion(v string) bool {
	return strings.HasPrefix(v, "v") && len(v) > 1 && !strings.ContainsAny(v, "/\\ ") && !strings.Contains(v, "..")
}
