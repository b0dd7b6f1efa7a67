// Command edge is Outpost's per-site appliance: ProxyDHCP, TFTP, iPXE over HTTP, boot assets,
// BMC access and the agents' tunnels, connected to the controller by one outbound uplink.
package main

import (
	"context"
	"fmt"
	"os"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"
	"go.uber.org/zap"

	"github.com/outpost-metal/outpost/edge/app"
	"github.com/outpost-metal/outpost/edge/assetcache"
	"github.com/outpost-metal/outpost/edge/assetscli"
	"github.com/outpost-metal/outpost/edge/config"
	"github.com/outpost-metal/outpost/edge/uplink"
	"github.com/outpost-metal/outpost/shared/cli"
	"github.com/outpost-metal/outpost/shared/envflag"
	"github.com/outpost-metal/outpost/shared/logging"
)

func main() {
	root, _ := rootCommand(os.LookupEnv)
	cli.Main(root)
}

// rootCommand returns the edge's command tree, whose flags fall back to the variables lookup finds, and the
// binding that names each flag's variables.
func rootCommand(lookup func(string) (string, bool)) (*cobra.Command, *envflag.Binding) {
	cfg := config.Default()

	var env *envflag.Binding

	root := cli.Root("edge", "Outpost edge: a site's boot services, BMC access and agent tunnels, connected to the controller", &cfg.LogLevel,
		func() error {
			if err := env.Apply(lookup); err != nil {
				return err
			}

			if err := cfg.AbsolutePaths(); err != nil {
				return err
			}

			return cfg.LoadJoinToken()
		},
		func(ctx context.Context, log *zap.Logger) error { return app.Run(ctx, cfg, log) })

	f := root.PersistentFlags()
	f.StringVar(&cfg.StateDir, "state-dir", cfg.StateDir, "directory for the edge's identity, boot table, journal and assets")

	f = root.Flags()
	f.StringVar(&cfg.LogLevel, "log-level", cfg.LogLevel, "debug, info, warn or error")
	f.StringVar(&cfg.Uplink.ControllerAddress, "controller", cfg.Uplink.ControllerAddress, "controller uplink address, host:port; several, comma separated, for an active controller and its standbys (dialled in turn)")
	f.StringVar(&cfg.Uplink.JoinToken, "join-token", cfg.Uplink.JoinToken, "join token from 'controller site create' (needed once, to enrol; prefer the variable or --join-token-file: a flag shows in the process list)")
	f.StringVar(&cfg.JoinTokenFile, "join-token-file", cfg.JoinTokenFile, "file holding the join token")
	f.DurationVar(&cfg.Uplink.BackoffMin, "reconnect-min", cfg.Uplink.BackoffMin, "shortest wait between reconnection attempts (each wait is jittered)")
	f.DurationVar(&cfg.Uplink.BackoffMax, "reconnect-max", cfg.Uplink.BackoffMax, "longest wait between reconnection attempts")
	f.StringVar(&cfg.DHCP.Interface, "interface", cfg.DHCP.Interface, "network interface the ProxyDHCP serves (SO_BINDTODEVICE); empty with no --server-ip turns it off")
	f.StringVar((*string)(&cfg.AgentBinding), "agent-binding", string(cfg.AgentBinding), "what an agent tunnel must prove: address (it comes from the address the machine's boot fetched from) or off (trusted site networks only)")
	f.StringVar((*string)(&cfg.DHCP.Discovery), "discovery", string(cfg.DHCP.Discovery), "which PXE clients the ProxyDHCP answers: all, known (machines the controller knows or an operator registered) or off")
	f.DurationVar(&cfg.DHCP.GuardInterval, "dhcp-guard-interval", cfg.DHCP.GuardInterval, "with full DHCP mode asked for: how often the site network is checked for another DHCP server")
	f.StringVar((*string)(&cfg.DHCP.Mode), "proxydhcp-mode", string(cfg.DHCP.Mode), "full (ports 67 and 4011) or 4011-only (beside a site DHCP server that offers PXE)")
	f.StringVar(&cfg.DHCP.ServerIP, "server-ip", cfg.DHCP.ServerIP, "the edge's address machines reach (default: the interface's first IPv4)")
	f.StringVar(&cfg.HTTP.Listen, "http-listen", cfg.HTTP.Listen, "address for iPXE scripts, binaries, assets, /config, /metrics and /healthz")
	f.StringVar(&cfg.HTTP.AdvertiseHost, "advertise-host", cfg.HTTP.AdvertiseHost, "host[:port] machines use for the HTTP server (default: the request's Host)")
	f.StringVar(&cfg.HTTP.AgentAddress, "agent-address", cfg.HTTP.AgentAddress, "metal.provider.address given to agents (default: the advertised host with the API port)")
	f.StringVar(&cfg.TFTP.Listen, "tftp-listen", cfg.TFTP.Listen, "TFTP address, empty to turn TFTP off")
	f.StringVar(&cfg.APIListen, "api-listen", cfg.APIListen, "agent tunnel endpoint (HTTP/2)")
	f.StringVar(&cfg.IPXEDir, "ipxe-dir", cfg.IPXEDir, "directory of iPXE binaries (Debian's ipxe package)")
	f.StringVar(&cfg.VMediaLoader, "vmedia-loader", cfg.VMediaLoader, "EFI boot loader of virtual-media images (default: "+config.VMediaLoaderName+" in --ipxe-dir)")
	f.StringVar(&cfg.DHCP.Files.UEFIx86Signed, "secure-boot-file", cfg.DHCP.Files.UEFIx86Signed, "signed UKI in --ipxe-dir for UEFI x86 machines that enforce Secure Boot where the controller names no signed image for them (their plan, the site's agent image)")
	f.StringSliceVar(&cfg.DHCP.Files.SecureBoot, "secure-boot", cfg.DHCP.Files.SecureBoot, "MACs of the machines that enforce Secure Boot, or * for every UEFI machine, where the controller does not say (its plans and the site table come first): they get only a signed image (the controller's, else --secure-boot-file), never iPXE")
	f.Int64Var(&cfg.Assets.MaxBytes, "assets-max-bytes", cfg.Assets.MaxBytes, "size cap of the boot-asset cache")
	f.StringVar(&cfg.AssetsPreseedDir, "assets-preseed-dir", cfg.AssetsPreseedDir, "asset bundle to import at start (baked-in assets)")
	f.StringSliceVar(&cfg.HTTP.KernelArgs, "kernel-args", cfg.HTTP.KernelArgs, "kernel arguments for every PXE boot of an x86 machine unless the controller sets them (consoles); arm64 machines get console=tty0 console=ttyAMA0")

	// What the site network may make the edge hold (see each component's Config for how the defaults are sized).
	f.IntVar(&cfg.TFTP.MaxTransfers, "tftp-max-transfers", cfg.TFTP.MaxTransfers, "TFTP transfers in progress at once")
	f.IntVar(&cfg.TFTP.MaxTransfersPerSource, "tftp-max-per-source", cfg.TFTP.MaxTransfersPerSource, "TFTP transfers in progress from one address")
	f.IntVar(&cfg.HTTP.MaxConns, "http-max-conns", cfg.HTTP.MaxConns, "HTTP connections open at once")
	f.IntVar(&cfg.HTTP.MaxConnsPerSource, "http-max-conns-per-source", cfg.HTTP.MaxConnsPerSource, "HTTP connections open from one address")
	f.IntVar(&cfg.Tunnels.MaxTunnels, "agent-max-tunnels", cfg.Tunnels.MaxTunnels, "agent tunnels open at once")
	f.IntVar(&cfg.Tunnels.MaxTunnelsPerSource, "agent-max-tunnels-per-source", cfg.Tunnels.MaxTunnelsPerSource, "agent tunnels open from one address")
	f.IntVar(&cfg.Tunnels.MaxConns, "agent-max-conns", cfg.Tunnels.MaxConns, "agent API connections open at once, at least --agent-max-tunnels")

	root.AddCommand(assetscli.NewCommand(func() (assetcache.Config, error) {
		c := cfg.Resolved().Assets
		if err := c.Validate(); err != nil {
			return c, fmt.Errorf("asset cache configuration: %w", err)
		}

		// an enrolled edge imports only bundles of its own controller
		fp, err := uplink.ControllerFingerprint(cfg.Resolved().StateDir)
		if err != nil {
			return c, fmt.Errorf("edge identity: %w", err)
		}

		c.Controller = fp

		return c, nil
	}, func() *zap.Logger {
		log, err := logging.New(os.Stderr, "info")
		if err != nil {
			return zap.NewNop()
		}

		return log
	}))

	env = bindEnv(root)

	return root, env
}

// bindEnv gives every flag of root and of its subcommands its OUTPOST_* variable (named after the flag:
// --tftp-max-transfers is OUTPOST_TFTP_MAX_TRANSFERS); the returned binding applies them once the command
// line is parsed.
func bindEnv(root *cobra.Command) *envflag.Binding {
	var sets []*pflag.FlagSet

	var walk func(*cobra.Command)

	walk = func(c *cobra.Command) {
		sets = append(sets, c.PersistentFlags(), c.Flags())
		for _, sub := range c.Commands() {
			walk(sub)
		}
	}

	walk(root)

	return envflag.Bind("OUTPOST_", nil, sets...)
}
