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
)

// LocalResolver resolves profiles to files in a directory, for air-gapped sites and tests. The layout mirrors the
// image factory's: <dir>/<schematic-id>/<talos-version>/kernel-<arch> and initramfs-<arch>.xz, where the
// schematic holds the extensions only (computed offline, as the factory would); kernel arguments are appended
// at boot. A Secure Boot profile's signed image is metal-<arch>-secureboot-uki.efi beside them under the
// schematic that also holds its kernel arguments. The files are served under baseURL with the same relative
// paths.
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
	id, err := Profile{Extensions: p.Extensions}.Schematic().ID()
	if err != nil {
		return "", fmt.Errorf("schematic id: %w", err)
	}

	return id, nil
}

// Schematic returns the schematic ID of a set of extensions, computed offline as the factory would.
func (r *LocalResolver) Schematic(_ context.Context, extensions []string) (string, error) {
	return SchematicID(Profile{Extensions: extensions})
}

// Resolve implements Resolver.
func (r *LocalResolver) Resolve(_ context.Context, p Profile) (Boot, error) {
	p = p.Normalize()

	if !validVersion(p.TalosVersion) || !validArch(p.Arch.String()) {
		return Boot{}, fmt.Errorf("%w: talos version %q, arch %q", ErrNotAvailable, p.TalosVersion, p.Arch)
	}

	id, err := SchematicID(p)
	if err != nil {
		return Boot{}, err
	}

	b := r.BootOf(Staged{Version: p.TalosVersion, SchematicID: id, Arch: p.Arch.String()})
	b.KernelArgs = p.KernelArgs

	for _, u := range []string{b.KernelURL, b.InitrdURL} {
		rel := strings.TrimPrefix(u, r.baseURL+"/")

		if _, err = os.Stat(filepath.Join(r.dir, filepath.FromSlash(rel))); err != nil {
			if errors.Is(err, fs.ErrNotExist) {
				return Boot{}, fmt.Errorf("%w: %s not in %s (talos %s, extensions %v)", ErrNotAvailable, rel, r.dir, p.TalosVersion, p.Extensions)
			}

			return Boot{}, fmt.Errorf("local asset %s: %w", rel, err)
		}
	}

	if p.SecureBoot {
		return r.signed(p, b)
	}

	return b, nil
}

// signed adds a Secure Boot profile's signed image to b when the directory has it, as the factory names it
// (<schematic>/<version>/metal-<arch>-secureboot-uki.efi, the schematic with the kernel arguments baked in);
// without it the profile has none, and its machines boot the edge's own signed file.
func (r *LocalResolver) signed(p Profile, b Boot) (Boot, error) {
	id, err := p.Schematic().ID()
	if err != nil {
		return Boot{}, fmt.Errorf("schematic id: %w", err)
	}

	rel := path.Join(id, p.TalosVersion, "metal-"+p.Arch.String()+"-secureboot-uki.efi")

	switch _, err := os.Stat(filepath.Join(r.dir, filepath.FromSlash(rel))); {
	case errors.Is(err, fs.ErrNotExist):
		return b, nil
	case err != nil:
		return Boot{}, fmt.Errorf("local asset %s: %w", rel, err)
	}

	b.SignedSchematicID, b.SignedURL = id, r.baseURL+"/"+rel

	return b, nil
}

// BootOf implements Stager: the directory's kernel and initramfs of the schematic (whether they are there is
// for the relay to find out).
func (r *LocalResolver) BootOf(st Staged) Boot {
	return Boot{
		SchematicID: st.SchematicID,
		KernelURL:   r.baseURL + "/" + path.Join(st.SchematicID, st.Version, "kernel-"+st.Arch),
		InitrdURL:   r.baseURL + "/" + path.Join(st.SchematicID, st.Version, "initramfs-"+st.Arch+".xz"),
	}
}
