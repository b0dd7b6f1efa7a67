package lab

import (
	"fmt"

	"github.com/outpost-metal/outpost/edge/assetcache"
	"github.com/outpost-metal/outpost/shared/metal"
)

// PreseedBundle writes an edge asset bundle (outpost-assets.json and the files) for --assets-preseed-dir with
// the product's own writer (edge assets bundle): the agent-mode kernel and initramfs under the logical names the
// edge's default agent paths use, and every file of the controller's local install assets (localDir,
// LocalAssets' layout; may be empty) under "install/<schematic>/<version>/<file>", the names the controller's
// default install URL (/assets/install) asks the edge for.
func PreseedBundle(images Images, localDir, dir string) error {
	var files []assetcache.BundleFile

	files = append(files,
		assetcache.BundleFile{Name: assetcache.AgentName(metal.AMD64, "vmlinuz"), Source: images.Kernel},
		assetcache.BundleFile{Name: assetcache.AgentName(metal.AMD64, "initramfs.xz"), Source: images.Initramfs})

	if localDir != "" {
		tree, err := assetcache.TreeFiles("install", localDir)
		if err != nil {
			return err
		}

		files = append(files, tree...)
	}

	if _, err := assetcache.WriteBundle(dir, files); err != nil {
		return fmt.Errorf("preseed bundle: %w", err)
	}

	return nil
}
