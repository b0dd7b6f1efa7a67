package lab

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"

	"github.com/outpost-metal/outpost/edge/assets"
)

// PreseedBundle writes an edge asset bundle (outpost-assets.json and the files) for --assets-preseed-dir:
// the agent-mode kernel and initramfs under the logical names the edge's default agent paths use, and every
// file of the controller's local install assets (localDir, LocalAssets' layout; may be empty) under
// "install/<schematic>/<version>/<file>", the names the controller's default install URL (/assets/install)
// asks the edge for.
func PreseedBundle(images Images, localDir, dir string) error {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}

	var bundle assets.Bundle

	bundle.Version = 1

	for file, src := range map[string]string{"vmlinuz": images.Kernel, "initramfs.xz": images.Initramfs} {
		b, err := os.ReadFile(src)
		if err != nil {
			return err
		}

		if err := os.WriteFile(filepath.Join(dir, file), b, 0o644); err != nil {
			return err
		}

		sum := sha256.Sum256(b)

		for _, arch := range []string{"x86_64", "amd64"} {
			bundle.Assets = append(bundle.Assets, assets.BundleAsset{
				Name: assets.AgentName(arch, file), SHA256: hex.EncodeToString(sum[:]), Size: int64(len(b)), Path: file,
			})
		}
	}

	if localDir != "" {
		err := filepath.WalkDir(localDir, func(path string, d fs.DirEntry, err error) error {
			if err != nil || d.IsDir() {
				return err
			}

			rel, err := filepath.Rel(localDir, path)
			if err != nil {
				return err
			}

			b, err := os.ReadFile(path)
			if err != nil {
				return err
			}

			file := strings.ReplaceAll(rel, "/", "_")
			if err := os.WriteFile(filepath.Join(dir, file), b, 0o644); err != nil {
				return err
			}

			sum := sha256.Sum256(b)
			bundle.Assets = append(bundle.Assets, assets.BundleAsset{
				Name: "install/" + filepath.ToSlash(rel), SHA256: hex.EncodeToString(sum[:]), Size: int64(len(b)), Path: file,
			})

			return nil
		})
		if err != nil {
			return fmt.Errorf("bundle local install assets: %w", err)
		}
	}

	data, err := json.MarshalIndent(bundle, "", "  ")
	if err != nil {
		return fmt.Errorf("encode asset bundle: %w", err)
	}

	return os.WriteFile(filepath.Join(dir, assets.BundleManifestName), data, 0o644)
}
