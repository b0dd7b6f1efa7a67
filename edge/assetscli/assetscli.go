// Package assetscli implements `edge assets ...`: operator commands on the edge's asset cache that run
// without the uplink, such as importing assets from a USB stick at an air-gapped site, and making the bundle
// to carry there.
package assetscli

import (
	"context"
	"errors"
	"fmt"
	"io"
	"strings"
	"time"

	"github.com/spf13/cobra"
	"go.uber.org/zap"

	"github.com/outpost-metal/outpost/edge/assetcache"
)

// Import imports a directory or tarball (with outpost-assets.json at its root) into the cache described by cfg
// and prints one line per imported asset to w. It is safe while the edge runs: the cache is locked across
// processes and the running edge picks the new manifest up on its next lookup.
func Import(ctx context.Context, cfg assetcache.Config, log *zap.Logger, src string, w io.Writer) error {
	store, err := assetcache.New(cfg, log, time.Now)
	if err != nil {
		return fmt.Errorf("open asset cache %s: %w", cfg.Dir, err)
	}

	refs, err := store.Import(ctx, src)
	if err != nil {
		return explain(err)
	}

	for _, r := range refs {
		fmt.Fprintf(w, "imported %s sha256:%s (%d bytes)\n", r.Name, r.SHA256, r.Size) //nolint:errcheck
	}

	_, used := store.List()
	fmt.Fprintf(w, "%d assets imported; cache holds %d of %d bytes\n", len(refs), used, store.Cap()) //nolint:errcheck

	return nil
}

// explain adds what the operator can do about common failures.
func explain(err error) error {
	switch {
	case errors.Is(err, assetcache.ErrTraversal):
		return fmt.Errorf("%w (the bundle names files outside itself or contains links; nothing was imported)", err)
	case errors.Is(err, assetcache.ErrSizeMismatch), errors.Is(err, assetcache.ErrDigestMismatch):
		return fmt.Errorf("%w (the bundle is damaged or its manifest is wrong; nothing was imported)", err)
	case errors.Is(err, assetcache.ErrForeignBundle):
		return fmt.Errorf("%w (make the bundle with the controller this edge is enrolled with; nothing was imported)", err)
	case errors.Is(err, assetcache.ErrNoSpace):
		return fmt.Errorf("%w (raise the cache size or evict assets no plan needs)", err)
	case assetcache.IsDiskFull(err):
		return fmt.Errorf("%w (the state disk is full)", err)
	default:
		return err
	}
}

// NewCommand returns the `assets` command with its `import` subcommand. config returns the cache
// configuration (from the edge's flags and environment) and logger the process logger; both are called when
// the command runs.
func NewCommand(config func() (assetcache.Config, error), logger func() *zap.Logger) *cobra.Command {
	cmd := &cobra.Command{
		Use:   "assets",
		Short: "Manage the edge's boot-asset cache",
	}

	cmd.AddCommand(&cobra.Command{
		Use:   "import <dir|tarball>",
		Short: "Import boot assets from a directory or a tar(.gz) file holding outpost-assets.json",
		Long: `Import copies the assets listed in outpost-assets.json (name, sha256, size, path per asset) from a
directory or a tar or tar.gz file into the cache, verifying every size and digest. A bundle with paths outside
itself, links, or a manifest that does not match its files is refused and nothing is imported.`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			cfg, err := config()
			if err != nil {
				return err
			}

			return Import(cmd.Context(), cfg, logger(), args[0], cmd.OutOrStdout())
		},
	})

	var trees []string

	bundle := &cobra.Command{
		Use:   "bundle <dir> [NAME=FILE ...] [--tree PREFIX=DIR ...]",
		Short: "Write an import bundle (outpost-assets.json and the files) for edge assets import or --assets-preseed-dir",
		Long: `Bundle writes the files given into <dir>, each once under its SHA-256, and outpost-assets.json naming every
asset with its size and digest (written last: an interrupted bundle has no manifest and imports nothing). NAME is
the logical name the edge serves it under /assets/ (agent/x86_64/vmlinuz, install/<schematic>/<version>/...);
one FILE may have several names. --tree PREFIX=DIR adds every file under DIR as PREFIX/<path>. Names are checked
as the import checks them.`,
		Example: `  edge assets bundle /media/usb/bundle agent/x86_64/vmlinuz=vmlinuz agent/x86_64/initramfs.xz=initramfs.xz \
    --tree install=/srv/talos-install`,
		Args: cobra.MinimumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			return Bundle(args[0], args[1:], trees, cmd.OutOrStdout())
		},
	}
	bundle.Flags().StringArrayVar(&trees, "tree", nil, "PREFIX=DIR: every file under DIR, named PREFIX/<path below DIR>")

	cmd.AddCommand(bundle)

	return cmd
}

// Bundle writes an import bundle into dir from NAME=FILE pairs and PREFIX=DIR trees and prints what it holds.
func Bundle(dir string, pairs, trees []string, w io.Writer) error {
	var files []assetcache.BundleFile

	for _, p := range pairs {
		name, file, ok := strings.Cut(p, "=")
		if !ok || name == "" || file == "" {
			return fmt.Errorf("%q: want NAME=FILE", p)
		}

		files = append(files, assetcache.BundleFile{Name: name, Source: file})
	}

	for _, t := range trees {
		prefix, root, ok := strings.Cut(t, "=")
		if !ok || prefix == "" || root == "" {
			return fmt.Errorf("--tree %q: want PREFIX=DIR", t)
		}

		tree, err := assetcache.TreeFiles(prefix, root)
		if err != nil {
			return err
		}

		files = append(files, tree...)
	}

	b, err := assetcache.WriteBundle(dir, files)
	if err != nil {
		return err
	}

	var total int64

	for _, a := range b.Assets {
		fmt.Fprintf(w, "%s sha256:%s (%d bytes)\n", a.Name, a.SHA256, a.Size) //nolint:errcheck // best-effort listing
		total += a.Size
	}

	_, err = fmt.Fprintf(w, "%d assets (%d bytes) in %s; import with: edge assets import %s\n", len(b.Assets), total, dir, dir)

	return err
}
