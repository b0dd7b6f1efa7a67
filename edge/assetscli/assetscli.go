// Package assetscli implements `edge assets ...`: operator commands on the edge's asset cache that run
// without the uplink, such as importing assets from a USB stick at an air-gapped site.
package assetscli

import (
	"context"
	"errors"
	"fmt"
	"io"
	"time"

	"github.com/spf13/cobra"
	"go.uber.org/zap"

	"github.com/outpost-metal/outpost/edge/assets"
)

// Import imports a directory or tarball (with outpost-assets.json at its root) into the cache described by cfg
// and prints one line per imported asset to w. It is safe while the edge runs: the cache is locked across
// processes and the running edge picks the new manifest up on its next lookup.
func Import(ctx context.Context, cfg assets.Config, log *zap.Logger, src string, w io.Writer) error {
	store, err := assets.New(cfg, log, assets.NoneNeeded{}, time.Now)
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
	case errors.Is(err, assets.ErrTraversal):
		return fmt.Errorf("%w (the bundle names files outside itself or contains links; nothing was imported)", err)
	case errors.Is(err, assets.ErrSizeMismatch), errors.Is(err, assets.ErrDigestMismatch):
		return fmt.Errorf("%w (the bundle is damaged or its manifest is wrong; nothing was imported)", err)
	case errors.Is(err, assets.ErrNoSpace):
		return fmt.Errorf("%w (raise the cache size or evict assets no plan needs)", err)
	case assets.IsDiskFull(err):
		return fmt.Errorf("%w (the state disk is full)", err)
	default:
		return err
	}
}

// NewCommand returns the `assets` command with its `import` subcommand. config returns the cache
// configuration (from the edge's flags and environment) and logger the process logger; both are called when
// the command runs.
func NewCommand(config func() (assets.Config, error), logger func() *zap.Logger) *cobra.Command {
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

	return cmd
}
