// Command edge is Outpost's per-site appliance: ProxyDHCP, TFTP, iPXE over HTTP, boot assets,
// BMC access and the agents' tunnels, connected to the controller by one outbound uplink.
package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/signal"
	"strconv"
	"syscall"

	"github.com/spf13/cobra"
	"go.uber.org/zap"

	"github.com/outpost-metal/outpost/edge/app"
	"github.com/outpost-metal/outpost/edge/assets"
	"github.com/outpost-metal/outpost/edge/assetscli"
	"github.com/outpost-metal/outpost/edge/config"
	"github.com/outpost-metal/outpost/shared/envflag"
	"github.com/outpost-metal/outpost/shared/logging"
	"github.com/outpost-metal/outpost/shared/version"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()

	if err := rootCommand().ExecuteContext(ctx); err != nil {
		fmt.Fprintln(os.Stderr, "edge:", err)
		os.Exit(1)
	}
}

func rootCommand() *cobra.Command {
	cfg := config.Default()

	env := envflag.New()
	ints := &intEnv{env: env}

	root := &cobra.Command{
		Use:           "edge",
		Short:         "Outpost edge: a site's boot services, BMC access and agent tunnels, connected to the controller",
		Version:       version.String(),
		SilenceUsage:  true,
		SilenceErrors: true,
		Args:          cobra.NoArgs,
		PersistentPreRunE: func(*cobra.Command, []string) error {
			if err := errors.Join(env.Err(), ints.err()); err != nil {
				return err
			}

			if err := cfg.AbsolutePaths(); err != nil {
				return err
			}

			return cfg.LoadJoinToken()
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
	f.StringVar(&cfg.StateDir, "state-dir", env.String("OUTPOST_STATE_DIR", cfg.StateDir), "directory for the edge's identity, boot table, journal and assets [OUTPOST_STATE_DIR]")

	f = root.Flags()
	f.StringVar(&cfg.LogLevel, "log-level", env.String("OUTPOST_LOG_LEVEL", cfg.LogLevel), "debug, info, warn or error [OUTPOST_LOG_LEVEL]")
	f.StringVar(&cfg.Uplink.ControllerAddress, "controller", env.String("OUTPOST_CONTROLLER", cfg.Uplink.ControllerAddress), "controller uplink address, host:port [OUTPOST_CONTROLLER]")
	f.StringVar(&cfg.Uplink.JoinToken, "join-token", env.String("OUTPOST_JOIN_TOKEN", cfg.Uplink.JoinToken), "join token from 'controller site create' (needed once, to enrol; prefer the variable or --join-token-file: a flag shows in the process list) [OUTPOST_JOIN_TOKEN]")
	f.StringVar(&cfg.JoinTokenFile, "join-token-file", env.String("OUTPOST_JOIN_TOKEN_FILE", cfg.JoinTokenFile), "file holding the join token [OUTPOST_JOIN_TOKEN_FILE]")
	f.DurationVar(&cfg.Uplink.BackoffMin, "reconnect-min", env.Duration("OUTPOST_RECONNECT_MIN", cfg.Uplink.BackoffMin), "shortest wait between reconnection attempts (each wait is jittered) [OUTPOST_RECONNECT_MIN]")
	f.DurationVar(&cfg.Uplink.BackoffMax, "reconnect-max", env.Duration("OUTPOST_RECONNECT_MAX", cfg.Uplink.BackoffMax), "longest wait between reconnection attempts [OUTPOST_RECONNECT_MAX]")
	f.StringVar(&cfg.DHCP.Interface, "interface", env.String("OUTPOST_INTERFACE", cfg.DHCP.Interface), "network interface the ProxyDHCP serves (SO_BINDTODEVICE); empty with no --server-ip turns it off [OUTPOST_INTERFACE]")
	f.StringVar((*string)(&cfg.AgentBinding), "agent-binding", env.String("OUTPOST_AGENT_BINDING", string(cfg.AgentBinding)), "what an agent tunnel must prove: address (it comes from the address the machine's boot fetched from) or off (trusted site networks only) [OUTPOST_AGENT_BINDING]")
	f.StringVar((*string)(&cfg.DHCP.Discovery), "discovery", env.String("OUTPOST_DISCOVERY", string(cfg.DHCP.Discovery)), "which PXE clients the ProxyDHCP answers: all, known (machines the controller knows or an operator registered) or off [OUTPOST_DISCOVERY]")
	f.StringVar((*string)(&cfg.DHCP.Mode), "proxydhcp-mode", env.String("OUTPOST_PROXYDHCP_MODE", string(cfg.DHCP.Mode)), "full (ports 67 and 4011) or 4011-only (beside a site DHCP server that offers PXE) [OUTPOST_PROXYDHCP_MODE]")
	f.StringVar(&cfg.DHCP.ServerIP, "server-ip", env.String("OUTPOST_SERVER_IP", cfg.DHCP.ServerIP), "the edge's address machines reach (default: the interface's first IPv4) [OUTPOST_SERVER_IP]")
	f.StringVar(&cfg.HTTP.Listen, "http-listen", env.String("OUTPOST_HTTP_LISTEN", cfg.HTTP.Listen), "address for iPXE scripts, binaries, assets, /config, /metrics and /healthz [OUTPOST_HTTP_LISTEN]")
	f.StringVar(&cfg.HTTP.AdvertiseHost, "advertise-host", env.String("OUTPOST_ADVERTISE_HOST", cfg.HTTP.AdvertiseHost), "host[:port] machines use for the HTTP server (default: the request's Host) [OUTPOST_ADVERTISE_HOST]")
	f.StringVar(&cfg.HTTP.AgentAddress, "agent-address", env.String("OUTPOST_AGENT_ADDRESS", cfg.HTTP.AgentAddress), "metal.provider.address given to agents (default: the advertised host with the API port) [OUTPOST_AGENT_ADDRESS]")
	f.StringVar(&cfg.TFTP.Listen, "tftp-listen", env.String("OUTPOST_TFTP_LISTEN", cfg.TFTP.Listen), "TFTP address, empty to turn TFTP off [OUTPOST_TFTP_LISTEN]")
	f.StringVar(&cfg.APIListen, "api-listen", env.String("OUTPOST_API_LISTEN", cfg.APIListen), "agent tunnel endpoint (HTTP/2) [OUTPOST_API_LISTEN]")
	f.StringVar(&cfg.IPXEDir, "ipxe-dir", env.String("OUTPOST_IPXE_DIR", cfg.IPXEDir), "directory of iPXE binaries (Debian's ipxe package) [OUTPOST_IPXE_DIR]")
	f.Int64Var(&cfg.Assets.MaxBytes, "assets-max-bytes", cfg.Assets.MaxBytes, "size cap of the boot-asset cache")
	f.StringVar(&cfg.AssetsPreseedDir, "assets-preseed-dir", env.String("OUTPOST_ASSETS_PRESEED_DIR", cfg.AssetsPreseedDir), "asset bundle to import at start (baked-in assets) [OUTPOST_ASSETS_PRESEED_DIR]")
	f.StringSliceVar(&cfg.HTTP.KernelArgs, "kernel-args", cfg.HTTP.KernelArgs, "kernel arguments for every PXE boot unless the controller sets them (consoles)")

	// What the site network may make the edge hold (see each component's Config for how the defaults are sized).
	f.IntVar(&cfg.TFTP.MaxTransfers, "tftp-max-transfers", ints.get("OUTPOST_TFTP_MAX_TRANSFERS", cfg.TFTP.MaxTransfers), "TFTP transfers in progress at once [OUTPOST_TFTP_MAX_TRANSFERS]")
	f.IntVar(&cfg.TFTP.MaxTransfersPerSource, "tftp-max-per-source", ints.get("OUTPOST_TFTP_MAX_PER_SOURCE", cfg.TFTP.MaxTransfersPerSource), "TFTP transfers in progress from one address [OUTPOST_TFTP_MAX_PER_SOURCE]")
	f.IntVar(&cfg.HTTP.MaxConns, "http-max-conns", ints.get("OUTPOST_HTTP_MAX_CONNS", cfg.HTTP.MaxConns), "HTTP connections open at once [OUTPOST_HTTP_MAX_CONNS]")
	f.IntVar(&cfg.HTTP.MaxConnsPerSource, "http-max-conns-per-source", ints.get("OUTPOST_HTTP_MAX_CONNS_PER_SOURCE", cfg.HTTP.MaxConnsPerSource), "HTTP connections open from one address [OUTPOST_HTTP_MAX_CONNS_PER_SOURCE]")
	f.IntVar(&cfg.Tunnels.MaxTunnels, "agent-max-tunnels", ints.get("OUTPOST_AGENT_MAX_TUNNELS", cfg.Tunnels.MaxTunnels), "agent tunnels open at once [OUTPOST_AGENT_MAX_TUNNELS]")
	f.IntVar(&cfg.Tunnels.MaxTunnelsPerSource, "agent-max-tunnels-per-source", ints.get("OUTPOST_AGENT_MAX_TUNNELS_PER_SOURCE", cfg.Tunnels.MaxTunnelsPerSource), "agent tunnels open from one address [OUTPOST_AGENT_MAX_TUNNELS_PER_SOURCE]")
	f.IntVar(&cfg.Tunnels.MaxConns, "agent-max-conns", ints.get("OUTPOST_AGENT_MAX_CONNS", cfg.Tunnels.MaxConns), "agent API connections open at once, at least --agent-max-tunnels [OUTPOST_AGENT_MAX_CONNS]")

	root.AddCommand(assetscli.NewCommand(func() (assets.Config, error) {
		c := cfg.Resolved().Assets
		if err := c.Validate(); err != nil {
			return c, fmt.Errorf("asset cache configuration: %w", err)
		}

		return c, nil
	}, func() *zap.Logger {
		log, err := logging.New(os.Stderr, "info")
		if err != nil {
			return zap.NewNop()
		}

		return log
	}))

	return root
}

// intEnv gives integer flags their environment-variable defaults; a variable that does not parse fails the
// start, as envflag's do.
type intEnv struct {
	env  *envflag.Env
	errs []error
}

func (e *intEnv) get(name string, def int) int {
	v := e.env.String(name, "")
	if v == "" {
		return def
	}

	n, err := strconv.Atoi(v)
	if err != nil {
		e.errs = append(e.errs, fmt.Errorf("%s=%q is not an integer", name, v))

		return def
	}

	return n
}

func (e *intEnv) err() error { return errors.Join(e.errs...) }
