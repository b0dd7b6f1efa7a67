package lab

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"

	"github.com/outpost-metal/outpost/edge/assets"
)

// PreseedBundle writes an edge asset bundle (outpost-assets.json and the files) holding the agent-mode kernel
// and initramfs under the logical names the edge's default agent paths use, for --assets-preseed-dir.
func PreseedBundle(images Images, dir string) error {
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

	data, err := json.MarshalIndent(bundle, "", "  ")
	if err != nil {
		return fmt.Errorf("encode asset bundle: %w", err)
	}

	return os.WriteFile(filepath.Join(dir, assets.BundleManifestName), data, 0o644)
}
