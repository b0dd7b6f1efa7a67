// Command edge is Outpost's per-site appliance: ProxyDHCP, TFTP, iPXE over HTTP, boot assets,
// BMC access and the agents' tunnels, connected to the controller by one outbound uplink.
package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/spf13/cobra"

	"github.com/outpost-metal/outpost/edge/app"
	"github.com/outpost-metal/outpost/edge/config"
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

	var envErrs []error

	envDuration := func(name string, def time.Duration) time.Duration {
		if v, ok := os.LookupEnv(name); ok {
			d, err := time.ParseDuration(v)
			if err == nil {
				return d
			}

			envErrs = append(envErrs, fmt.Errorf("%s=%q is not a duration", name, v))
		}

		return def
	}

	root := &cobra.Command{
		Use:           "edge",
		Short:         "Outpost edge: a site's boot services, BMC access and agent tunnels, connected to the controller",
		Version:       version.String(),
		SilenceUsage:  true,
		SilenceErrors: true,
		Args:          cobra.NoArgs,
		PersistentPreRunE: func(*cobra.Command, []string) error {
			return errors.Join(envErrs...)
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
	f.StringVar(&cfg.StateDir, "state-dir", env("OUTPOST_STATE_DIR", cfg.StateDir), "directory for the edge's identity, boot table, journal and assets [OUTPOST_STATE_DIR]")

	f = root.Flags()
	f.StringVar(&cfg.LogLevel, "log-level", env("OUTPOST_LOG_LEVEL", cfg.LogLevel), "debug, info, warn or error [OUTPOST_LOG_LEVEL]")
	f.StringVar(&cfg.HTTPListen, "http-listen", env("OUTPOST_HTTP_LISTEN", cfg.HTTPListen), "address for iPXE scripts, assets, /config, /metrics and /healthz [OUTPOST_HTTP_LISTEN]")
	f.StringVar(&cfg.Uplink.ControllerAddress, "controller", env("OUTPOST_CONTROLLER", cfg.Uplink.ControllerAddress), "controller uplink address, host:port [OUTPOST_CONTROLLER]")
	f.StringVar(&cfg.Uplink.JoinToken, "join-token", env("OUTPOST_JOIN_TOKEN", cfg.Uplink.JoinToken), "join token from `controller site create` (needed once, to enrol) [OUTPOST_JOIN_TOKEN]")
	f.DurationVar(&cfg.Uplink.BackoffMax, "reconnect-max", envDuration("OUTPOST_RECONNECT_MAX", cfg.Uplink.BackoffMax), "longest wait between reconnection attempts [OUTPOST_RECONNECT_MAX]")

	return root
}

func env(name, def string) string {
	if v, ok := os.LookupEnv(name); ok {
		return v
	}

	return def
}
