// Command controller is Outpost's central controller: it talks to Omni, holds the machine lifecycle
// and serves the uplink that every site's edge dials. `controller site ...` are the operator commands.
package main

import (
	"context"
	"fmt"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/spf13/cobra"

	"github.com/outpost-metal/outpost/controller/admincli"
	"github.com/outpost-metal/outpost/controller/app"
	"github.com/outpost-metal/outpost/controller/config"
	"github.com/outpost-metal/outpost/shared/envflag"
	"github.com/outpost-metal/outpost/shared/logging"
	"github.com/outpost-metal/outpost/shared/version"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()

	if err := rootCommand().ExecuteContext(ctx); err != nil {
		fmt.Fprintln(os.Stderr, "controller:", err)
		os.Exit(1)
	}
}

func rootCommand() *cobra.Command {
	cfg := config.Default()

	env := envflag.New()

	root := &cobra.Command{
		Use:           "controller",
		Short:         "Outpost controller: Omni infra provider and the uplink every site's edge dials",
		Version:       version.String(),
		SilenceUsage:  true,
		SilenceErrors: true,
		Args:          cobra.NoArgs,
		PersistentPreRunE: func(*cobra.Command, []string) error {
			if err := env.Err(); err != nil {
				return err
			}

			return cfg.AbsolutePaths()
		},
		RunE: func(cmd *cobra.Command, _ []string) error {
			log, err := logging.New(os.Stderr, cfg.LogLevel)
			if err != nil {
				return err
			}
			defer log.Sync() //nolint:errcheck

			return app.Run(cmd.Context(), cfg, log)
		},
	}

	f := root.PersistentFlags()
	f.StringVar(&cfg.StateDir, "state-dir", env.String("OUTPOST_STATE_DIR", cfg.StateDir), "directory for the CA, the site store and the admin socket [OUTPOST_STATE_DIR]")
	f.StringVar(&cfg.AdminSocket, "admin-socket", env.String("OUTPOST_ADMIN_SOCKET", cfg.AdminSocket), "admin API unix socket (default <state-dir>/admin.sock) [OUTPOST_ADMIN_SOCKET]")

	f = root.Flags()
	f.StringVar(&cfg.UplinkListen, "uplink-listen", env.String("OUTPOST_UPLINK_LISTEN", cfg.UplinkListen), "address edges connect to [OUTPOST_UPLINK_LISTEN]")
	f.StringVar(&cfg.HTTPListen, "http-listen", env.String("OUTPOST_HTTP_LISTEN", cfg.HTTPListen), "address for /metrics and /healthz, empty to disable [OUTPOST_HTTP_LISTEN]")
	f.StringVar(&cfg.LogLevel, "log-level", env.String("OUTPOST_LOG_LEVEL", cfg.LogLevel), "debug, info, warn or error [OUTPOST_LOG_LEVEL]")
	f.DurationVar(&cfg.CertValidity, "cert-validity", env.Duration("OUTPOST_CERT_VALIDITY", cfg.CertValidity), "lifetime of edge certificates [OUTPOST_CERT_VALIDITY]")
	f.StringSliceVar(&cfg.ServerNames, "server-name", env.List("OUTPOST_SERVER_NAMES", cfg.ServerNames), "extra DNS names for the uplink certificate [OUTPOST_SERVER_NAMES]")
	ul := &cfg.UplinkLimits
	f.DurationVar(&ul.TLSTimeout, "uplink-tls-timeout", env.Duration("OUTPOST_UPLINK_TLS_TIMEOUT", ul.TLSTimeout), "a new uplink connection not through TLS this long after connecting is closed [OUTPOST_UPLINK_TLS_TIMEOUT]")
	f.DurationVar(&ul.HandshakeTimeout, "uplink-handshake-timeout", env.Duration("OUTPOST_UPLINK_HANDSHAKE_TIMEOUT", ul.HandshakeTimeout), "a new uplink connection without a hello this long after connecting is closed [OUTPOST_UPLINK_HANDSHAKE_TIMEOUT]")
	f.IntVar(&ul.MaxHandshakes, "uplink-max-handshakes", env.Int("OUTPOST_UPLINK_MAX_HANDSHAKES", ul.MaxHandshakes), "uplink connections in TLS or hello at once [OUTPOST_UPLINK_MAX_HANDSHAKES]")
	f.IntVar(&ul.SourceHandshakes, "uplink-source-handshakes", env.Int("OUTPOST_UPLINK_SOURCE_HANDSHAKES", ul.SourceHandshakes), "uplink connections in TLS or hello at once from one address (IPv6: /64) [OUTPOST_UPLINK_SOURCE_HANDSHAKES]")
	f.IntVar(&ul.SourceRate, "uplink-source-rate", env.Int("OUTPOST_UPLINK_SOURCE_RATE", ul.SourceRate), "new uplink connections per second from one address [OUTPOST_UPLINK_SOURCE_RATE]")
	f.IntVar(&ul.SourceBurst, "uplink-source-burst", env.Int("OUTPOST_UPLINK_SOURCE_BURST", ul.SourceBurst), "new uplink connections at once from one address [OUTPOST_UPLINK_SOURCE_BURST]")
	f.IntVar(&ul.MaxSources, "uplink-max-sources", env.Int("OUTPOST_UPLINK_MAX_SOURCES", ul.MaxSources), "addresses whose uplink connections are counted at once [OUTPOST_UPLINK_MAX_SOURCES]")
	f.IntVar(&ul.MaxEnrollSessions, "uplink-max-enrollments", env.Int("OUTPOST_UPLINK_MAX_ENROLLMENTS", ul.MaxEnrollSessions), "enrolment sessions at once [OUTPOST_UPLINK_MAX_ENROLLMENTS]")
	f.IntVar(&ul.SourceEnrollSessions, "uplink-source-enrollments", env.Int("OUTPOST_UPLINK_SOURCE_ENROLLMENTS", ul.SourceEnrollSessions), "enrolment sessions at once from one address [OUTPOST_UPLINK_SOURCE_ENROLLMENTS]")
	f.DurationVar(&ul.SourceLockout, "uplink-token-lockout", env.Duration("OUTPOST_UPLINK_TOKEN_LOCKOUT", ul.SourceLockout), "how long an address that sent too many wrong join tokens cannot enrol [OUTPOST_UPLINK_TOKEN_LOCKOUT]")

	f.StringVar(&cfg.AssetsDir, "assets-dir", env.String("OUTPOST_ASSETS_DIR", cfg.AssetsDir), "boot-asset files (named by SHA-256) to relay to edges (default <state-dir>/assets) [OUTPOST_ASSETS_DIR]")
	f.StringVar(&cfg.AgentAssetsDir, "agent-assets-dir", env.String("OUTPOST_AGENT_ASSETS_DIR", cfg.AgentAssetsDir), "agent-mode images (<arch>/vmlinuz, <arch>/initramfs.xz) every site is asked to cache [OUTPOST_AGENT_ASSETS_DIR]")
	f.StringVar(&cfg.DefaultAssetPolicy, "default-asset-policy", env.String("OUTPOST_DEFAULT_ASSET_POLICY", cfg.DefaultAssetPolicy), "asset policy of sites without their own: passthrough, cache or offline [OUTPOST_DEFAULT_ASSET_POLICY]")

	f.StringVar(&cfg.Omni.Endpoint, "omni-endpoint", env.String("OMNI_ENDPOINT", cfg.Omni.Endpoint), "Omni API URL; empty runs sites and edges only, without the lifecycle [OMNI_ENDPOINT]")
	f.BoolVar(&cfg.Omni.InsecureSkipVerify, "omni-insecure-skip-verify", env.Bool("OMNI_INSECURE_SKIP_VERIFY", cfg.Omni.InsecureSkipVerify), "skip TLS verification of Omni (labs only) [OMNI_INSECURE_SKIP_VERIFY]")
	f.StringVar(&cfg.Omni.ProviderID, "provider-id", env.String("OUTPOST_PROVIDER_ID", cfg.Omni.ProviderID), "infra provider ID the service account was created for [OUTPOST_PROVIDER_ID]")
	f.DurationVar(&cfg.Lifecycle.Cooldown, "power-cooldown", env.Duration("OUTPOST_POWER_COOLDOWN", cfg.Lifecycle.Cooldown), "minimum time between a power-on or reboot and the next power-off or reboot [OUTPOST_POWER_COOLDOWN]")
	f.StringVar(&cfg.Lifecycle.WipeMethod, "wipe-method", env.String("OUTPOST_WIPE_METHOD", cfg.Lifecycle.WipeMethod), "how disks are wiped on accept and release: fast or zeroes [OUTPOST_WIPE_METHOD]")
	f.DurationVar(&cfg.Lifecycle.WipeTimeout, "wipe-timeout", env.Duration("OUTPOST_WIPE_TIMEOUT", cfg.Lifecycle.WipeTimeout), "how long a fast wipe may take [OUTPOST_WIPE_TIMEOUT]")
	f.DurationVar(&cfg.Lifecycle.ZeroesWipeTimeout, "zeroes-wipe-timeout", env.Duration("OUTPOST_ZEROES_WIPE_TIMEOUT", cfg.Lifecycle.ZeroesWipeTimeout), "how long a zeroes wipe may take (size it to the largest disks) [OUTPOST_ZEROES_WIPE_TIMEOUT]")
	f.DurationVar(&cfg.Lifecycle.PollInterval, "poll-interval", env.Duration("OUTPOST_POLL_INTERVAL", cfg.Lifecycle.PollInterval), "how often power and agent state are refreshed [OUTPOST_POLL_INTERVAL]")
	f.StringVar(&cfg.Planner.AgentTalosVersion, "agent-talos-version", env.String("OUTPOST_AGENT_TALOS_VERSION", cfg.Planner.AgentTalosVersion), "Talos version booted in agent mode [OUTPOST_AGENT_TALOS_VERSION]")
	f.StringVar(&cfg.Planner.Console, "console", env.String("OUTPOST_CONSOLE", cfg.Planner.Console), "console kernel argument for PXE boots [OUTPOST_CONSOLE]")
	f.StringVar((*string)(&cfg.Planner.DiskMethod), "disk-method", env.String("OUTPOST_DISK_METHOD", string(cfg.Planner.DiskMethod)), "how machines boot their disk: ipxe-exit, http-404 or ipxe-sanboot [OUTPOST_DISK_METHOD]")
	f.StringVar(&cfg.InstallAssetsDir, "install-assets-dir", env.String("OUTPOST_INSTALL_ASSETS_DIR", cfg.InstallAssetsDir), "local Talos install assets (<schematic>/<version>/kernel-<arch>, initramfs-<arch>.xz) [OUTPOST_INSTALL_ASSETS_DIR]")
	f.StringVar(&cfg.InstallAssetsURL, "install-assets-url", env.String("OUTPOST_INSTALL_ASSETS_URL", cfg.InstallAssetsURL), "where machines fetch local install assets (edge-relative path or URL) [OUTPOST_INSTALL_ASSETS_URL]")
	f.StringVar(&cfg.ImageFactoryURL, "image-factory-url", env.String("OUTPOST_IMAGE_FACTORY_URL", cfg.ImageFactoryURL), "image factory URL (schematics) when no install assets directory is set [OUTPOST_IMAGE_FACTORY_URL]")
	f.StringVar(&cfg.PXEBaseURL, "pxe-base-url", env.String("OUTPOST_PXE_BASE_URL", cfg.PXEBaseURL), "where the image factory serves PXE scripts and images (default: the factory URL) [OUTPOST_PXE_BASE_URL]")
	f.StringVar(&cfg.TrustedRootsFile, "trusted-roots-file", env.String("OUTPOST_TRUSTED_ROOTS_FILE", cfg.TrustedRootsFile), "PEM CA bundle added to machines' join config (custom CA in front of Omni) [OUTPOST_TRUSTED_ROOTS_FILE]")

	f.StringSliceVar(&cfg.MachineLabels, "machine-labels", env.List("OUTPOST_MACHINE_LABELS", cfg.MachineLabels), "key=value labels published on every machine in Omni, besides its site label (comma separated) [OUTPOST_MACHINE_LABELS]")
	f.StringVar(&cfg.BMCProtocol, "bmc-protocol", env.String("OUTPOST_BMC_PROTOCOL", cfg.BMCProtocol), "how edges talk to BMCs: auto (Redfish when it answers, else IPMI), ipmi or redfish [OUTPOST_BMC_PROTOCOL]")
	f.StringVar(&cfg.DefaultBootMode, "default-boot-mode", env.String("OUTPOST_DEFAULT_BOOT_MODE", cfg.DefaultBootMode), "firmware mode (uefi or bios) for a PXE boot of a machine whose firmware is not known yet [OUTPOST_DEFAULT_BOOT_MODE]")

	// The service-account key is a secret: it comes from the environment only, never from a flag (visible in ps).
	cfg.Omni.ServiceAccountKey = os.Getenv("OMNI_SERVICE_ACCOUNT_KEY")

	root.AddCommand(siteCommand(&cfg))

	return root
}

func siteCommand(cfg *config.Config) *cobra.Command {
	site := &cobra.Command{Use: "site", Short: "Manage sites: create (prints the join token once), list, token, revoke, delete"}

	var (
		description string
		opts        admincli.TokenOptions
	)

	withClient := func(fn func(context.Context, *admincli.Client) error) func(*cobra.Command, []string) error {
		return func(cmd *cobra.Command, _ []string) error {
			c, err := admincli.Dial(cfg.AdminSocketPath())
			if err != nil {
				return err
			}
			defer c.Close() //nolint:errcheck

			ctx, cancel := context.WithTimeout(cmd.Context(), 30*time.Second)
			defer cancel()

			return fn(ctx, c)
		}
	}

	create := &cobra.Command{
		Use:   "create SITE",
		Short: "Create a site and print its join token (shown only once)",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			return withClient(func(ctx context.Context, c *admincli.Client) error {
				return c.CreateSite(ctx, args[0], description, opts, cmd.OutOrStdout(), cmd.ErrOrStderr())
			})(cmd, args)
		},
	}
	create.Flags().StringVar(&description, "description", "", "what and where the site is")

	token := &cobra.Command{
		Use:   "token SITE",
		Short: "Replace a site's join token (to enrol a replacement edge) and print it",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			return withClient(func(ctx context.Context, c *admincli.Client) error {
				return c.NewToken(ctx, args[0], opts, cmd.OutOrStdout(), cmd.ErrOrStderr())
			})(cmd, args)
		},
	}

	for _, c := range []*cobra.Command{create, token} {
		c.Flags().DurationVar(&opts.TTL, "token-ttl", 24*time.Hour, "how long the join token is valid")
		c.Flags().BoolVar(&opts.Reusable, "reusable", false, "let the token enrol more than one edge")
	}

	list := &cobra.Command{
		Use:   "list",
		Short: "List sites with connection state, edge version and last seen",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			return withClient(func(ctx context.Context, c *admincli.Client) error {
				return c.ListSites(ctx, cmd.OutOrStdout(), time.Now())
			})(cmd, args)
		},
	}

	revoke := &cobra.Command{
		Use:   "revoke SITE",
		Short: "Revoke a site: its certificates stop working and its edge is disconnected",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			return withClient(func(ctx context.Context, c *admincli.Client) error { return c.RevokeSite(ctx, args[0]) })(cmd, args)
		},
	}

	del := &cobra.Command{
		Use:   "delete SITE",
		Short: "Delete a site",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			return withClient(func(ctx context.Context, c *admincli.Client) error { return c.DeleteSite(ctx, args[0]) })(cmd, args)
		},
	}

	show := &cobra.Command{
		Use:   "show SITE",
		Short: "Show a site: connection, and boot assets (policy, cached, missing for current plans, bytes relayed)",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			return withClient(func(ctx context.Context, c *admincli.Client) error {
				return c.ShowSite(ctx, args[0], cmd.OutOrStdout(), time.Now())
			})(cmd, args)
		},
	}

	label := &cobra.Command{
		Use:   "label SITE [KEY=VALUE ...]",
		Short: "Set the labels published on every machine of a site (none clears them); Omni shows them as omni.sidero.dev/infra-provider/<id>/<key>",
		Args:  cobra.MinimumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			return withClient(func(ctx context.Context, c *admincli.Client) error {
				return c.SetSiteLabels(ctx, args[0], args[1:])
			})(cmd, args)
		},
	}

	policy := &cobra.Command{
		Use:   "policy SITE passthrough|cache|offline",
		Short: "Set a site's boot-asset policy",
		Args:  cobra.ExactArgs(2),
		RunE: func(cmd *cobra.Command, args []string) error {
			return withClient(func(ctx context.Context, c *admincli.Client) error {
				return c.SetAssetPolicy(ctx, args[0], args[1])
			})(cmd, args)
		},
	}

	site.AddCommand(create, token, list, show, policy, label, revoke, del)

	return site
}
