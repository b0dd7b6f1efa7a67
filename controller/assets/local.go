package assets

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"strings"

	"github.com/siderolabs/image-factory/pkg/schematic"
)

// LocalResolver resolves profiles to files in a directory, for air-gapped sites and tests. The layout mirrors the
// image factory's: <dir>/<schematic-id>/<talos-version>/kernel-<arch> and initramfs-<arch>.xz, where the
// schematic holds the extensions only (computed offline, as the factory would); kernel arguments are appended
// at boot. The files are served under baseURL with the same relative paths.
type LocalResolver struct {
	dir     string
	baseURL string
}

// NewLocalResolver returns a resolver over dir, serving its files under baseURL.
func NewLocalResolver(dir, baseURL string) (*LocalResolver, error) {
	st, err := os.Stat(dir)
	if err != nil {
		return nil, fmt.Errorf("local assets directory: %w", err)
	}

	if !st.IsDir() {
		return nil, fmt.Errorf("local assets directory %s is not a directory", dir)
	}

	return &LocalResolver{dir: dir, baseURL: strings.TrimSuffix(baseURL, "/")}, nil
}

// SchematicID returns the ID of the extensions-only schematic a profile uses in a local directory.
func SchematicID(p Profile) (string, error) {
	p = p.Normalize()
	sc := schematic.Schematic{Customization: schematic.Customization{
		SystemExtensions: schematic.SystemExtensions{OfficialExtensions: p.Extensions},
	}}

	id, err := sc.ID()
	if err != nil {
		return "", fmt.Errorf("schematic id: %w", err)
	}

	return id, nil
}

// Resolve implements Resolver.
func (r *LocalResolver) Resolve(_ context.Context, p Profile) (Boot, error) {
	p = p.Normalize()

	if !validVersion(p.TalosVersion) || !validArch(p.Arch) {
		return Boot{}, fmt.Errorf("%w: talos version %q, arch %q", ErrNotAvailable, p.TalosVersion, p.Arch)
	}

	id, err := SchematicID(p)
	if err != nil {
		return Boot{}, err
	}

	kernel := path.Join(id, p.TalosVersion, "kernel-"+p.Arch)
	initrd := path.Join(id, p.TalosVersion, "initramfs-"+p.Arch+".xz")

	for _, rel := range []string{kernel, initrd} {
		if _, err = os.Stat(filepath.Join(r.dir, filepath.FromSlash(rel))); err != nil {
			if errors.Is(err, fs.ErrNotExist) {
				return Boot{}, fmt.Errorf("%w: %s not in %s (talos %s, extensions %v)", ErrNotAvailable, rel, r.dir, p.TalosVersion, p.Extensions)
			}

			return Boot{}, fmt.Errorf("local asset %s: %w", rel, err)
		}
	}

	return Boot{
		SchematicID: id,
		KernelURL:   r.baseURL + "/" + kernel,
		InitrdURL:   r.baseURL + "/" + initrd,
		KernelArgs:  p.KernelArgs,
	}, nil
}
