package image

import (
	"archive/tar"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"time"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
	"github.com/google/go-containerregistry/pkg/v1/types"
)

// RefNameAnnotation names the image inside an OCI layout (org.opencontainers.image.ref.name, OCI image spec).
const RefNameAnnotation = "org.opencontainers.image.ref.name"

// BuildOCI builds an OCI image whose single layer is the system extension tree in extDir (manifest.yaml and
// rootfs/ at the image root, the layout Talos's imager expects of a system extension image). The layer is
// reproducible: sorted entries, zero times, root ownership. tmpDir receives the layer tarball.
func BuildOCI(c Config, extDir, tmpDir string) (v1.Image, error) {
	return singleLayerImage(extDir, tmpDir, nil, func(cf *v1.ConfigFile) {
		cf.Architecture = c.Arch
		cf.Config.Labels = map[string]string{
			"org.opencontainers.image.title":   ServiceName,
			"org.opencontainers.image.version": c.Version,
		}
	})
}

// singleLayerImage builds a reproducible OCI image (OCI media types, linux, created at the epoch) whose one
// layer is the tree under dir, packed by writeTar with adjust; configure fills in the rest of the config
// (architecture, entrypoint, user, labels). Both images, the edge's extension and the controller's, are made
// here so that they are reproducible in the same way.
func singleLayerImage(dir, tmpDir string, adjust func(*tar.Header), configure func(*v1.ConfigFile)) (v1.Image, error) {
	layerPath := filepath.Join(tmpDir, "layer.tar")

	if err := writeTar(dir, layerPath, adjust); err != nil {
		return nil, fmt.Errorf("build image layer: %w", err)
	}

	layer, err := tarball.LayerFromFile(layerPath, tarball.WithMediaType(types.OCILayer))
	if err != nil {
		return nil, fmt.Errorf("build image layer: %w", err)
	}

	img, err := mutate.AppendLayers(mutate.MediaType(empty.Image, types.OCIManifestSchema1), layer)
	if err != nil {
		return nil, fmt.Errorf("append image layer: %w", err)
	}

	img = mutate.ConfigMediaType(img, types.OCIConfigJSON)

	cf, err := img.ConfigFile()
	if err != nil {
		return nil, fmt.Errorf("read image config: %w", err)
	}

	cf = cf.DeepCopy()
	cf.OS = "linux"
	cf.Created = v1.Time{Time: time.Unix(0, 0).UTC()}
	configure(cf)

	img, err = mutate.ConfigFile(img, cf)
	if err != nil {
		return nil, fmt.Errorf("set image config: %w", err)
	}

	return img, nil
}

// WriteOCILayout writes img as an OCI image layout in dir, named name (e.g. "outpost-edge:v0.1.0").
func WriteOCILayout(img v1.Image, dir, name string) error {
	if err := os.RemoveAll(dir); err != nil {
		return fmt.Errorf("clear %s: %w", dir, err)
	}

	p, err := layout.Write(dir, empty.Index)
	if err != nil {
		return fmt.Errorf("create OCI layout: %w", err)
	}

	if err := p.AppendImage(img, layout.WithAnnotations(map[string]string{RefNameAnnotation: name})); err != nil {
		return fmt.Errorf("write image to OCI layout: %w", err)
	}

	return nil
}

// WriteOCIArchive packs an OCI layout directory into a tar file (an "oci-archive").
func WriteOCIArchive(layoutDir, tarPath string) error {
	return writeTar(layoutDir, tarPath, func(hdr *tar.Header) {
		if hdr.Typeflag == tar.TypeReg {
			hdr.Mode = 0o644
		}
	})
}

// writeTar writes the tree under dir into a tar file with sorted entries, zero times, root ownership and the
// files' permission bits; adjust, when not nil, may change each header (ownership, mode) before it is written.
// Names are relative to dir, directories end in a slash.
func writeTar(dir, path string, adjust func(*tar.Header)) error {
	out, err := os.Create(path)
	if err != nil {
		return err
	}

	tw := tar.NewWriter(out)

	err = filepath.WalkDir(dir, func(p string, d os.DirEntry, err error) error {
		if err != nil {
			return err
		}

		rel, err := filepath.Rel(dir, p)
		if err != nil || rel == "." {
			return err
		}

		fi, err := d.Info()
		if err != nil {
			return err
		}

		hdr := &tar.Header{Name: filepath.ToSlash(rel), Mode: int64(fi.Mode().Perm()), ModTime: time.Unix(0, 0), Format: tar.FormatPAX}

		switch {
		case d.IsDir():
			hdr.Typeflag, hdr.Name = tar.TypeDir, hdr.Name+"/"
		case fi.Mode().IsRegular():
			hdr.Typeflag, hdr.Size = tar.TypeReg, fi.Size()
		default:
			return fmt.Errorf("%s: only files and directories go into the image", p)
		}

		if adjust != nil {
			adjust(hdr)
		}

		if err := tw.WriteHeader(hdr); err != nil {
			return err
		}

		if hdr.Typeflag != tar.TypeReg {
			return nil
		}

		f, err := os.Open(p)
		if err != nil {
			return err
		}
		defer f.Close() //nolint:errcheck

		_, err = io.Copy(tw, f)

		return err
	})
	if err != nil {
		out.Close() //nolint:errcheck

		return err
	}

	if err := tw.Close(); err != nil {
		out.Close() //nolint:errcheck

		return err
	}

	return out.Close()
}
