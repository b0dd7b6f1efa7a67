// Command controller is Outpost's central controller: it talks to Omni, holds the machine lifecycle
// and serves the uplink that every site's edge dials. `controller site ...` are the operator commands.
package main

import (
	"context"
	"errors"
	"os"
	"time"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"
	"go.uber.org/zap"

	"github.com/outpost-metal/outpost/controller/admincli"
	"github.com/outpost-metal/outpost/controller/app"
	"github.com/outpost-metal/outpost/controller/assets"
	"github.com/outpost-metal/outpost/controller/config"
	"github.com/outpost-metal/outpost/controller/labels"
	"github.com/outpost-metal/outpost/controller/machines"
	"github.com/outpost-metal/outpost/shared/cli"
	"github.com/outpost-metal/outpost/shared/envflag"
	"github.com/outpost-metal/outpost/shared/metal"
)

func main() {
	root, _ := rootCommand(os.LookupEnv)
	cli.Main(root)
}

// rootCommand returns the controller's command tree, whose flags fall back to the variables lookup finds, and
// the binding that names each flag's variables.
func rootCommand(lookup func(string) (string, bool)) (*cobra.Command, *envflag.Binding) {
	cfg := config.Default()

	var env *envflag.Binding

	root := cli.Root("controller", "Outpost controller: Omni infra provider and the uplink every site's edge dials", &cfg.LogLevel,
		func() error {
			if err := env.Apply(lookup); err != nil {
				return err
			}

			return cfg.AbsolutePaths()
		},
		func(ctx context.Context, log *zap.Logger) error { return app.Run(ctx, cfg, log) })

	f := root.PersistentFlags()
	f.StringVar(&cfg.StateDir, "state-dir", cfg.StateDir, "directory for the CA, the site store and the admin socket")
	f.StringVar(&cfg.AdminSocket, "admin-socket", cfg.AdminSocket, "admin API unix socket (default <state-dir>/admin.sock)")

	f = root.Flags()
	f.StringVar(&cfg.UplinkListen, "uplink-listen", cfg.UplinkListen, "address edges connect to")
	f.StringVar(&cfg.HTTPListen, "http-listen", cfg.HTTPListen, "address for /metrics, /healthz and the status pages (/status), empty to disable")
	f.StringVar(&cfg.HTTPTokenFile, "http-token-file", cfg.HTTPTokenFile, "file with the bearer token every HTTP request must carry (required off loopback)")
	f.StringVar(&cfg.HTTPCertFile, "http-tls-cert", cfg.HTTPCertFile, "TLS certificate (PEM) of the HTTP listener (required off loopback)")
	f.StringVar(&cfg.HTTPKeyFile, "http-tls-key", cfg.HTTPKeyFile, "TLS key (PEM) of the HTTP listener (required off loopback)")
	f.StringVar(&cfg.LogLevel, "log-level", cfg.LogLevel, "debug, info, warn or error")
	f.DurationVar(&cfg.CertValidity, "cert-validity", cfg.CertValidity, "lifetime of edge certificates")
	f.StringSliceVar(&cfg.ServerNames, "server-name", cfg.ServerNames, "extra DNS names for the uplink certificate")
	ul := &cfg.UplinkLimits
	f.DurationVar(&ul.TLSTimeout, "uplink-tls-timeout", ul.TLSTimeout, "a new uplink connection not through TLS this long after connecting is closed")
	f.DurationVar(&ul.HandshakeTimeout, "uplink-handshake-timeout", ul.HandshakeTimeout, "a new uplink connection without a hello this long after connecting is closed")
	f.IntVar(&ul.MaxHandshakes, "uplink-max-handshakes", ul.MaxHandshakes, "uplink connections in TLS or hello at once")
	f.IntVar(&ul.SourceHandshakes, "uplink-source-handshakes", ul.SourceHandshakes, "uplink connections in TLS or hello at once from one address (IPv6: /64)")
	f.IntVar(&ul.SourceRate, "uplink-source-rate", ul.SourceRate, "new uplink connections per second from one address")
	f.IntVar(&ul.SourceBurst, "uplink-source-burst", ul.SourceBurst, "new uplink connections at once from one address")
	f.IntVar(&ul.MaxSources, "uplink-max-sources", ul.MaxSources, "addresses whose uplink connections are counted at once")
	f.IntVar(&ul.MaxEnrollSessions, "uplink-max-enrollments", ul.MaxEnrollSessions, "enrolment sessions at once")
	f.IntVar(&ul.SourceEnrollSessions, "uplink-source-enrollments", ul.SourceEnrollSessions, "enrolment sessions at once from one address")
	f.DurationVar(&ul.SourceLockout, "uplink-token-lockout", ul.SourceLockout, "how long an address that sent too many wrong join tokens cannot enrol")

	f.StringVar(&cfg.AssetsDir, "assets-dir", cfg.AssetsDir, "boot-asset files (named by SHA-256) to relay to edges (default <state-dir>/assets)")
	f.StringVar(&cfg.AgentAssetsDir, "agent-assets-dir", cfg.AgentAssetsDir, "agent-mode images (<arch>/vmlinuz, <arch>/initramfs.xz) every site is asked to cache")
	f.Var(assets.PolicyFlag(&cfg.DefaultAssetPolicy), "default-asset-policy", "asset policy of sites without their own: passthrough, cache or offline")

	f.StringVar(&cfg.Omni.Endpoint, "omni-endpoint", cfg.Omni.Endpoint, "Omni API URL; empty runs sites and edges only, without the lifecycle")
	f.BoolVar(&cfg.Omni.InsecureSkipVerify, "omni-insecure-skip-verify", cfg.Omni.InsecureSkipVerify, "skip TLS verification of Omni (labs only)")
	f.StringVar(&cfg.Omni.ProviderID, "provider-id", cfg.Omni.ProviderID, "infra provider ID the service account was created for")
	f.DurationVar(&cfg.Lifecycle.Cooldown, "power-cooldown", cfg.Lifecycle.Cooldown, "minimum time between a power-on or reboot and the next power-off or reboot")
	f.Var(machines.WipeMethodFlag(&cfg.Lifecycle.WipeMethod), "wipe-method", "how disks are wiped on accept and release: fast or zeroes")
	f.DurationVar(&cfg.Lifecycle.AgentReconnectGrace, "agent-reconnect-grace", cfg.Lifecycle.AgentReconnectGrace, "how long a machine whose agent went away may take to see it back before it is rebooted into agent mode")
	f.DurationVar(&cfg.Lifecycle.WipeTimeout, "wipe-timeout", cfg.Lifecycle.WipeTimeout, "how long a fast wipe may take")
	f.DurationVar(&cfg.Lifecycle.ZeroesWipeTimeout, "zeroes-wipe-timeout", cfg.Lifecycle.ZeroesWipeTimeout, "how long a zeroes wipe may take (size it to the largest disks)")
	f.DurationVar(&cfg.Lifecycle.PollInterval, "poll-interval", cfg.Lifecycle.PollInterval, "how often power and agent state are refreshed")
	f.DurationVar(&cfg.Lifecycle.InventoryInterval, "inventory-interval", cfg.Lifecycle.InventoryInterval, "how often a machine's hardware inventory is read again from its BMC (a new BMC is read at once)")
	f.StringVar(&cfg.Planner.AgentTalosVersion, "agent-talos-version", cfg.Planner.AgentTalosVersion, "Talos version booted in agent mode")
	f.StringVar(&cfg.Planner.Console, "console", cfg.Planner.Console, "console kernel argument for PXE boots")
	f.StringVar((*string)(&cfg.Planner.DiskMethod), "disk-method", string(cfg.Planner.DiskMethod), "how machines boot their disk: ipxe-exit, http-404 or ipxe-sanboot")
	f.StringVar(&cfg.InstallAssetsDir, "install-assets-dir", cfg.InstallAssetsDir, "local Talos install assets (<schematic>/<version>/kernel-<arch>, initramfs-<arch>.xz)")
	f.StringVar(&cfg.InstallAssetsURL, "install-assets-url", cfg.InstallAssetsURL, "where machines fetch local install assets (edge-relative path or URL)")
	f.StringVar(&cfg.ImageFactoryURL, "image-factory-url", cfg.ImageFactoryURL, "image factory URL (schematics) when no install assets directory is set")
	f.StringVar(&cfg.PXEBaseURL, "pxe-base-url", cfg.PXEBaseURL, "where the image factory serves PXE scripts and images (default: the factory URL)")
	f.StringVar(&cfg.TrustedRootsFile, "trusted-roots-file", cfg.TrustedRootsFile, "PEM CA bundle added to machines' join config (custom CA in front of Omni)")
	f.StringVar(&cfg.ExtraMachineConfigFile, "extra-machine-config-file", cfg.ExtraMachineConfigFile, "Talos multi-documents (network, resolvers, time servers, ...) served with the join config to machines in agent mode")
	f.DurationVar(&cfg.LeaseDuration, "lease-duration", cfg.LeaseDuration, "with Omni: a standby controller takes over after the active one has not renewed its lease this long")

	f.Var(labels.Flag(&cfg.MachineLabels), "machine-labels", "key=value labels published on every machine in Omni, besides its site label (comma separated)")
	f.Var(machines.BMCProtocolFlag(&cfg.BMCProtocol), "bmc-protocol", "how edges talk to BMCs: auto (Redfish when it answers, else IPMI), ipmi or redfish")
	f.Var(envflag.Parsed(&cfg.DefaultBootMode, "firmware", metal.ParseFirmware, metal.Firmware.String), "default-boot-mode", "firmware mode (uefi or bios) for a PXE boot of a machine whose firmware is not known yet")

	// The service-account key is a secret: it comes from the environment only, never from a flag (visible in ps).
	cfg.Omni.ServiceAccountKey, _ = lookup("OMNI_SERVICE_ACCOUNT_KEY")

	root.AddCommand(siteCommand(&cfg), machineCommand(&cfg), assetsCommand(&cfg))

	env = bindEnv(root)

	return root, env
}

// envAliases are environment variables kept besides the ones named after their flags: Omni's own names,
// as omnictl and the other infra providers use them, and the plural the uplink names had first.
var envAliases = map[string][]string{
	"omni-endpoint":             {"OMNI_ENDPOINT"},
	"omni-insecure-skip-verify": {"OMNI_INSECURE_SKIP_VERIFY"},
	"server-name":               {"OUTPOST_SERVER_NAMES"},
}

// bindEnv gives every flag of root and of its subcommands its OUTPOST_* variable (and envAliases); the
// returned binding applies them once the command line is parsed.
func bindEnv(root *cobra.Command) *envflag.Binding {
	sets := []*pflag.FlagSet{root.PersistentFlags()}

	var walk func(*cobra.Command)

	walk = func(c *cobra.Command) {
		sets = append(sets, c.PersistentFlags(), c.Flags())
		for _, sub := range c.Commands() {
			walk(sub)
		}
	}

	walk(root)

	return envflag.Bind("OUTPOST_", envAliases, sets...)
}

func siteCommand(cfg *config.Config) *cobra.Command {
	site := &cobra.Command{Use: "site", Short: "Manage sites: create (prints the join token once), list, token, revoke, delete"}

	var (
		description string
		opts        admincli.TokenOptions
		output      string
	)

	site.PersistentFlags().StringVarP(&output, "output", "o", string(admincli.OutputTable), "table or json (list, show)")

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
			return adminClient(cfg, &output, 30*time.Second, func(ctx context.Context, c *admincli.Client) error {
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
		Short: "Show a site: connection, boot assets (policy, cached, missing for current plans, bytes relayed) and its machines",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			return adminClient(cfg, &output, 30*time.Second, func(ctx context.Context, c *admincli.Client) error {
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

	site.AddCommand(create, token, list, show, policy, label, siteSetCommand(withClient), siteMachineCommand(withClient), revoke, del)

	return site
}

// clientRun wraps a command's body in a connection to the admin socket.
type clientRun func(fn func(ctx context.Context, c *admincli.Client) error) func(*cobra.Command, []string) error

// siteSetCommand is `controller site set`: a site's own discovery, BMC protocol, wipe method, extra
// documents and DHCP service; only the flags given change, and "default" (or an empty file name) hands one back.
func siteSetCommand(withClient clientRun) *cobra.Command {
	var (
		discovery, bmcProtocol, wipeMethod, extraConfig, secureBoot string
		dhcpMode, dhcpPool, dhcpSubnet, dhcpGateway                 string
		dhcpDNS, dhcpNTP                                            []string
		dhcpLease                                                   time.Duration
	)

	cmd := &cobra.Command{
		Use: "set SITE [--discovery all|known|off] [--bmc-protocol auto|ipmi|redfish] [--wipe-method fast|zeroes] [--secure-boot on|off|auto] [--extra-machine-config-file FILE] " +
			"[--dhcp proxy|full|off] [--dhcp-pool START-END|CIDR] [--dhcp-subnet CIDR] [--dhcp-gateway IP] [--dhcp-dns IP,...] [--dhcp-ntp IP,...] [--dhcp-lease-time D]",
		Short: "Set a site's own discovery policy, BMC protocol, wipe method, Secure Boot, extra machine-config documents or DHCP service (\"default\" returns one to the controller's)",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			var set admincli.SiteSettings

			given := func(name string, v *string) *string {
				if !cmd.Flags().Changed(name) {
					return nil
				}

				if *v == "default" {
					*v = ""
				}

				return v
			}

			set.Discovery, set.BMCProtocol, set.WipeMethod = given("discovery", &discovery), given("bmc-protocol", &bmcProtocol), given("wipe-method", &wipeMethod)
			set.ExtraConfigFile = given("extra-machine-config-file", &extraConfig)
			set.SecureBoot = given("secure-boot", &secureBoot)

			if set.SecureBoot != nil && *set.SecureBoot == "auto" {
				*set.SecureBoot = "" // the machines' BMCs say, as with default
			}
			set.DHCPMode, set.DHCPPool, set.DHCPSubnet = given("dhcp", &dhcpMode), given("dhcp-pool", &dhcpPool), given("dhcp-subnet", &dhcpSubnet)
			set.DHCPGateway = given("dhcp-gateway", &dhcpGateway)

			if cmd.Flags().Changed("dhcp-dns") {
				set.DHCPDNS = &dhcpDNS
			}

			if cmd.Flags().Changed("dhcp-ntp") {
				set.DHCPNTP = &dhcpNTP
			}

			if cmd.Flags().Changed("dhcp-lease-time") {
				set.DHCPLeaseTime = &dhcpLease
			}

			if set == (admincli.SiteSettings{}) {
				return errors.New("nothing to set: give --discovery, --bmc-protocol, --wipe-method, --secure-boot, --extra-machine-config-file or a --dhcp flag")
			}

			return withClient(func(ctx context.Context, c *admincli.Client) error {
				return c.SetSiteSettings(ctx, args[0], set, cmd.OutOrStdout())
			})(cmd, args)
		},
	}

	f := cmd.Flags()
	f.StringVar(&discovery, "discovery", "", "which PXE clients the site's ProxyDHCP answers: all, known (machines the controller knows or registered) or off")
	f.StringVar(&bmcProtocol, "bmc-protocol", "", "how the site's edge reaches BMCs: auto, ipmi or redfish")
	f.StringVar(&wipeMethod, "wipe-method", "", "how the site's machines are wiped: fast or zeroes")
	f.StringVar(&secureBoot, "secure-boot", "", "whether the site's machines enforce Secure Boot (only the signed image, never iPXE): on, off, "+
		"or auto (each machine's BMC says; an operator's word for a machine comes first)")
	f.StringVar(&extraConfig, "extra-machine-config-file", "", "Talos documents served with the join config at this site (\"\" or default clears them)")
	f.StringVar(&dhcpMode, "dhcp", "", "the site's DHCP service: proxy (ProxyDHCP beside the site's server), full (the edge is the site's DHCP server) or off")
	f.StringVar(&dhcpPool, "dhcp-pool", "", "full mode's address pool: START-END, or a CIDR range (also the subnet unless --dhcp-subnet is given)")
	f.StringVar(&dhcpSubnet, "dhcp-subnet", "", "full mode's subnet (CIDR): the clients' mask; the pool, gateway and reservations lie in it")
	f.StringVar(&dhcpGateway, "dhcp-gateway", "", "full mode's default router for clients (\"\" none)")
	f.StringSliceVar(&dhcpDNS, "dhcp-dns", nil, "full mode's DNS servers for clients (comma separated; \"\" none)")
	f.StringSliceVar(&dhcpNTP, "dhcp-ntp", nil, "full mode's NTP servers for clients (comma separated; \"\" none)")
	f.DurationVar(&dhcpLease, "dhcp-lease-time", 0, "full mode's lease time (0: the edge's default, 1h)")
	// The controller's own flags of these names have variables; an operator's shell that has them set must
	// not change a site with them.
	envflag.CommandLineOnly(f, "discovery", "bmc-protocol", "wipe-method", "secure-boot", "extra-machine-config-file",
		"dhcp", "dhcp-pool", "dhcp-subnet", "dhcp-gateway", "dhcp-dns", "dhcp-ntp", "dhcp-lease-time")

	return cmd
}

// siteMachineCommand is `controller site machine add|remove SITE MAC...`: machines registered before they
// boot, which a site with discovery known answers.
func siteMachineCommand(withClient clientRun) *cobra.Command {
	cmd := &cobra.Command{Use: "machine", Short: "Register machines at a site before they boot (discovery known answers them)"}

	for _, remove := range []bool{false, true} {
		use, short := "add SITE MAC...", "Register machines by MAC at a site (all or none: a malformed MAC changes nothing)"
		if remove {
			use, short = "remove SITE MAC...", "Unregister machines by MAC at a site"
		}

		var ip string

		sub := &cobra.Command{
			Use: use, Short: short, Args: cobra.MinimumNArgs(2),
			RunE: func(cmd *cobra.Command, args []string) error {
				return withClient(func(ctx context.Context, c *admincli.Client) error {
					return c.RegisterMachines(ctx, args[0], args[1:], remove, ip, cmd.OutOrStdout())
				})(cmd, args)
			},
		}

		if !remove {
			sub.Use = "add SITE MAC... [--ip A.B.C.D]"
			sub.Flags().StringVar(&ip, "ip", "", "reserve this address for the machine in full DHCP mode (one MAC; removing the MAC drops it)")
			envflag.CommandLineOnly(sub.Flags(), "ip")
		}

		cmd.AddCommand(sub)
	}

	var endpoint, user, passwordFile string

	boot := &cobra.Command{
		Use:   "boot SITE MAC --bmc-endpoint URL --bmc-user USER --bmc-password-file FILE",
		Short: "Boot a machine at a site without DHCP from virtual media the first time (its BMC mounts the edge's image)",
		Long: "The site's edge builds the agent-mode image with the address reserved for MAC (controller site machine add SITE MAC --ip),\n" +
			"the machine's Redfish BMC mounts it and the machine is powered on (or cycled) into it once. Its later boots need\n" +
			"nothing from the operator: the lifecycle boots it from images while the site's DHCP is off.",
		Args: cobra.ExactArgs(2),
		RunE: func(cmd *cobra.Command, args []string) error {
			return withClient(func(ctx context.Context, c *admincli.Client) error {
				return c.BootFromImage(ctx, args[0], args[1], endpoint, user, passwordFile, cmd.OutOrStdout())
			})(cmd, args)
		},
	}

	boot.Flags().StringVar(&endpoint, "bmc-endpoint", "", "the machine's BMC, a Redfish base URL (https://10.0.0.9)")
	boot.Flags().StringVar(&user, "bmc-user", "", "the BMC user")
	boot.Flags().StringVar(&passwordFile, "bmc-password-file", "", "a file holding the BMC user's password (a flag would show it in the process list)")

	for _, f := range []string{"bmc-endpoint", "bmc-user", "bmc-password-file"} {
		_ = boot.MarkFlagRequired(f) //nolint:errcheck // the flags exist
	}

	envflag.CommandLineOnly(boot.Flags(), "bmc-endpoint", "bmc-user", "bmc-password-file")
	cmd.AddCommand(boot)

	return cmd
}
