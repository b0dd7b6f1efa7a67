package main

import (
	"context"
	"errors"
	"path/filepath"
	"time"

	"github.com/spf13/cobra"

	"github.com/outpost-metal/outpost/controller/admincli"
	"github.com/outpost-metal/outpost/controller/config"
	"github.com/outpost-metal/outpost/shared/envflag"
	"github.com/outpost-metal/outpost/shared/metal"
)

// assetsCommand is `controller assets`: install profiles staged at sites ahead of need, and what sites hold.
func assetsCommand(cfg *config.Config) *cobra.Command {
	cmd := &cobra.Command{Use: "assets", Short: "Boot assets of sites: stage install profiles ahead of need, list what a site holds"}

	var (
		site, output, schematic, version string
		arch                             = metal.AMD64
		extensions                       []string
		noWait                           bool
		timeout                          time.Duration
	)

	cmd.PersistentFlags().StringVar(&site, "site", "", "the site")
	cmd.PersistentFlags().StringVarP(&output, "output", "o", string(admincli.OutputTable), "table or json")

	profileFlags := func(c *cobra.Command) {
		c.Flags().StringVar(&schematic, "schematic", "", "image factory schematic ID of the profile")
		c.Flags().StringSliceVar(&extensions, "extensions", nil, "official extensions of the profile (instead of --schematic)")
		c.Flags().StringVar(&version, "talos-version", "", "Talos version of the profile")
		c.Flags().Var(envflag.Parsed(&arch, "arch", metal.ParseArch, metal.Arch.String), "arch", "amd64 or arm64")
	}

	profile := func() (admincli.Profile, error) {
		if site == "" {
			return admincli.Profile{}, errors.New("--site is required")
		}

		return admincli.Profile{Site: site, SchematicID: schematic, Extensions: extensions, TalosVersion: version, Arch: arch}, nil
	}

	stage := &cobra.Command{
		Use:   "stage --site SITE (--schematic ID | --extensions A,B) --talos-version V [--arch amd64|arm64]",
		Short: "Stage a Talos install profile at a site ahead of need: the controller fetches its kernel, initramfs and installer image once and the site's edge holds them; shows progress until the site holds everything it needs (--no-wait: return at once)",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			p, err := profile()
			if err != nil {
				return err
			}

			return adminClient(cfg, &output, timeout, func(ctx context.Context, c *admincli.Client) error {
				return c.StageAssets(ctx, p, !noWait, time.Second, cmd.OutOrStdout())
			})(cmd, args)
		},
	}
	profileFlags(stage)
	stage.Flags().BoolVar(&noWait, "no-wait", false, "return once the profile is staged, without waiting for the site to hold it")
	stage.Flags().DurationVar(&timeout, "timeout", 30*time.Minute, "how long to wait for the site to hold it")

	unstage := &cobra.Command{
		Use:   "unstage --site SITE (--schematic ID | --extensions A,B) --talos-version V [--arch amd64|arm64]",
		Short: "Take a staged profile back (the edge may evict its assets once no plan needs them)",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			p, err := profile()
			if err != nil {
				return err
			}

			return adminClient(cfg, &output, 30*time.Second, func(ctx context.Context, c *admincli.Client) error {
				return c.UnstageAssets(ctx, p, cmd.OutOrStdout())
			})(cmd, args)
		},
	}
	profileFlags(unstage)

	list := &cobra.Command{
		Use:   "list --site SITE",
		Short: "List a site's boot assets: held (and whether a plan needs them), missing at the edge, and what the controller is still fetching, with sizes",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			if site == "" {
				return errors.New("--site is required")
			}

			return adminClient(cfg, &output, 30*time.Second, func(ctx context.Context, c *admincli.Client) error {
				return c.ListAssets(ctx, site, cmd.OutOrStdout())
			})(cmd, args)
		},
	}

	bundle := &cobra.Command{
		Use:   "bundle --site SITE DIR",
		Short: "Write what a site needs and the controller holds (agent image, staged profiles, what its plans name) into a bundle directory for edge assets import, at a site reached only by hand; the edge refuses bundles of another controller",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			if site == "" {
				return errors.New("--site is required")
			}

			dir, err := filepath.Abs(args[0])
			if err != nil {
				return err
			}

			return adminClient(cfg, &output, 30*time.Minute, func(ctx context.Context, c *admincli.Client) error {
				return c.BundleAssets(ctx, site, dir, cmd.OutOrStdout())
			})(cmd, args)
		},
	}

	cmd.AddCommand(stage, unstage, list, bundle)

	return cmd
}
