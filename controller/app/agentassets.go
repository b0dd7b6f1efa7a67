package app

import (
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"

	assetspb "github.com/outpost-metal/outpost/shared/api/assets"
)

// agentAssetFiles are the files of an agent-mode image per iPXE architecture, under the names edges serve
// them by (/assets/agent/<arch>/vmlinuz and initramfs.xz, the edge's default agent-mode paths).
var agentAssetFiles = []string{"vmlinuz", "initramfs.xz"}

// loadAgentAssets reads the agent-mode images in dir (<arch>/vmlinuz, <arch>/initramfs.xz), copies each into the
// relay directory under its SHA-256 (where the relay serves edges from), and returns their references, which
// every site is then asked to hold. Sites whose policy allows it fetch them by relay, so an air-gapped site boots
// agent mode with no image factory in reach.
func loadAgentAssets(dir, relayDir string) ([]*assetspb.AssetRef, error) {
	archs, err := os.ReadDir(dir)
	if err != nil {
		return nil, fmt.Errorf("agent assets: %w", err)
	}

	var refs []*assetspb.AssetRef

	for _, arch := range archs {
		if !arch.IsDir() || (arch.Name() != "x86_64" && arch.Name() != "arm64") {
			continue
		}

		for _, name := range agentAssetFiles {
			src := filepath.Join(dir, arch.Name(), name)

			digest, size, err := copyByDigest(src, relayDir)
			if errors.Is(err, fs.ErrNotExist) {
				continue
			}

			if err != nil {
				return nil, fmt.Errorf("agent asset %s: %w", src, err)
			}

			refs = append(refs, &assetspb.AssetRef{Name: "agent/" + arch.Name() + "/" + name, Sha256: digest, Size: size})
		}
	}

	if len(refs) == 0 {
		return nil, fmt.Errorf("agent assets: no <arch>/vmlinuz or <arch>/initramfs.xz in %s", dir)
	}

	slices.SortFunc(refs, func(a, b *assetspb.AssetRef) int { return strings.Compare(a.GetName(), b.GetName()) })

	return refs, nil
}

// copyByDigest hashes src and copies it to <relayDir>/<sha256> unless a file of that name is there already.
func copyByDigest(src, relayDir string) (string, int64, error) {
	f, err := os.Open(src)
	if err != nil {
		return "", 0, err
	}
	defer f.Close() //nolint:errcheck

	h := sha256.New()

	size, err := io.Copy(h, f)
	if err != nil {
		return "", 0, err
	}

	digest := hex.EncodeToString(h.Sum(nil))
	dst := filepath.Join(relayDir, digest)

	if _, err := os.Stat(dst); err == nil {
		return digest, size, nil
	}

	if _, err := f.Seek(0, io.SeekStart); err != nil {
		return "", 0, err
	}

	tmp, err := os.CreateTemp(relayDir, ".agent-asset-*")
	if err != nil {
		return "", 0, err
	}
	defer os.Remove(tmp.Name()) //nolint:errcheck // gone after the rename

	if _, err := io.Copy(tmp, f); err != nil {
		tmp.Close() //nolint:errcheck

		return "", 0, err
	}

	if err := tmp.Close(); err != nil {
		return "", 0, err
	}

	return digest, size, os.Rename(tmp.Name(), dst)
}
