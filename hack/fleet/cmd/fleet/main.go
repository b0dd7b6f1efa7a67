// Command fleet runs the fleet simulator (`make bench-fleet`): simulated sites and machines against the real
// controller binary and the Omni stand-in, printing one FLEET summary line on stdout and writing the figures
// to the output directory. `fleet omni` is the stand-in's child process it starts.
//
//	fleet --controller _out/fleet/bin/controller --sites 50 --machines 40
package main

import (
	"context"
	"fmt"
	"os"
	"os/signal"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"

	"github.com/spf13/cobra"
	"go.uber.org/zap"

	"github.com/outpost-metal/outpost/hack/fleet"
	"github.com/outpost-metal/outpost/shared/envflag"
	"github.com/outpost-metal/outpost/shared/logging"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()

	if err := root().ExecuteContext(ctx); err != nil {
		fmt.Fprintln(os.Stderr, "fleet:", err)
		os.Exit(1)
	}
}

// floatVar is a float flag whose default comes from an environment variable.
func floatVar(cmd *cobra.Command, p *float64, name, envName string, def float64, usage string, errs *[]error) {
	if v, ok := os.LookupEnv(envName); ok {
		f, err := strconv.ParseFloat(v, 64)
		if err != nil {
			*errs = append(*errs, fmt.Errorf("%s=%q: %w", envName, v, err))
		} else {
			def = f
		}
	}

	cmd.Flags().Float64Var(p, name, def, usage+" ["+envName+"]")
}

func root() *cobra.Command {
	cfg := fleet.Default()
	env := envflag.New()

	var (
		errs     []error
		logLevel string
	)

	cmd := &cobra.Command{
		Use:           "fleet",
		Short:         "Fleet simulator: many sites and machines against the real controller and the Omni stand-in",
		SilenceUsage:  true,
		SilenceErrors: true,
		Args:          cobra.NoArgs,
		RunE: func(c *cobra.Command, _ []string) error {
			if err := env.Err(); err != nil {
				return err
			}

			if len(errs) > 0 {
				return errs[0]
			}

			log, err := logging.New(os.Stderr, logLevel)
			if err != nil {
				return err
			}

			cfg.OpenFiles = raiseOpenFiles(log)

			if cfg.Self, err = os.Executable(); err != nil {
				return err
			}

			if cfg.WorkDir == "" {
				if cfg.WorkDir, err = os.MkdirTemp("", "outpost-fleet-"); err != nil {
					return err
				}

				defer os.RemoveAll(cfg.WorkDir) //nolint:errcheck
			}

			for _, p := range []*string{&cfg.ControllerBinary, &cfg.OutDir, &cfg.WorkDir} {
				if *p, err = filepath.Abs(*p); err != nil {
					return err
				}
			}

			r, err := fleet.Run(c.Context(), cfg, log)
			if r != nil {
				fmt.Fprintln(c.OutOrStdout(), r.Summary())
			}

			return err
		},
	}

	f := cmd.Flags()
	f.StringVar(&logLevel, "log-level", env.String("FLEET_LOG_LEVEL", "info"), "the simulator's own log level [FLEET_LOG_LEVEL]")
	f.StringVar(&cfg.ControllerBinary, "controller", env.String("FLEET_CONTROLLER", "_out/fleet/bin/controller"), "controller binary (go build ./controller) [FLEET_CONTROLLER]")
	f.StringVar(&cfg.OutDir, "out", env.String("FLEET_OUT", cfg.OutDir), "where the figures and logs go [FLEET_OUT]")
	f.StringVar(&cfg.WorkDir, "work-dir", env.String("FLEET_WORK_DIR", cfg.WorkDir), "state of every process (default: a temporary directory, removed) [FLEET_WORK_DIR]")
	f.IntVar(&cfg.Sites, "sites", env.Int("FLEET_SITES", cfg.Sites), "sites [FLEET_SITES]")
	f.IntVar(&cfg.MachinesPerSite, "machines", env.Int("FLEET_MACHINES", cfg.MachinesPerSite), "machines per site [FLEET_MACHINES]")
	f.DurationVar(&cfg.PollInterval, "poll-interval", env.Duration("FLEET_POLL_INTERVAL", cfg.PollInterval), "controller --poll-interval [FLEET_POLL_INTERVAL]")
	f.DurationVar(&cfg.Cooldown, "cooldown", env.Duration("FLEET_COOLDOWN", cfg.Cooldown), "controller --power-cooldown [FLEET_COOLDOWN]")
	f.StringVar(&cfg.ControllerLogLevel, "controller-log-level", env.String("FLEET_CONTROLLER_LOG_LEVEL", cfg.ControllerLogLevel), "controller --log-level [FLEET_CONTROLLER_LOG_LEVEL]")
	f.StringVar(&cfg.EdgeLogLevel, "edge-log-level", env.String("FLEET_EDGE_LOG_LEVEL", cfg.EdgeLogLevel), "the simulated edges' log level (edges.log) [FLEET_EDGE_LOG_LEVEL]")
	floatVar(cmd, &cfg.OnFraction, "on-fraction", "FLEET_ON_FRACTION", cfg.OnFraction, "fraction of machines the user keeps on", &errs)
	floatVar(cmd, &cfg.DeadBMCFraction, "dead-bmcs", "FLEET_DEAD_BMCS", cfg.DeadBMCFraction, "fraction of BMCs that never answer", &errs)
	floatVar(cmd, &cfg.OfflineSiteFraction, "offline-sites", "FLEET_OFFLINE_SITES", cfg.OfflineSiteFraction, "fraction of sites offline in the steady state", &errs)
	floatVar(cmd, &cfg.BMC.FailureRate, "bmc-failure-rate", "FLEET_BMC_FAILURE_RATE", cfg.BMC.FailureRate, "fraction of live-BMC calls that fail", &errs)
	f.DurationVar(&cfg.BMC.Latency, "bmc-latency", env.Duration("FLEET_BMC_LATENCY", cfg.BMC.Latency), "latency of every BMC call [FLEET_BMC_LATENCY]")
	f.DurationVar(&cfg.BMC.Jitter, "bmc-jitter", env.Duration("FLEET_BMC_JITTER", cfg.BMC.Jitter), "up to this much more per BMC call [FLEET_BMC_JITTER]")
	f.DurationVar(&cfg.BMC.DeadAfter, "bmc-dead-after", env.Duration("FLEET_BMC_DEAD_AFTER", cfg.BMC.DeadAfter), "how long a call to a dead BMC takes to fail [FLEET_BMC_DEAD_AFTER]")
	f.DurationVar(&cfg.BootDelay, "boot-delay", env.Duration("FLEET_BOOT_DELAY", cfg.BootDelay), "power-on to DHCP [FLEET_BOOT_DELAY]")
	f.DurationVar(&cfg.WipeTime, "wipe-time", env.Duration("FLEET_WIPE_TIME", cfg.WipeTime), "a disk wipe's duration [FLEET_WIPE_TIME]")
	f.IntVar(&cfg.BootRate, "boot-rate", env.Int("FLEET_BOOT_RATE", cfg.BootRate), "machines powered on per second at start [FLEET_BOOT_RATE]")
	f.StringVar(&cfg.AgentConns, "agent-conns", env.String("FLEET_AGENT_CONNS", cfg.AgentConns), "machine: one connection per agent from its own address; site: a few per site, 8 agents on each [FLEET_AGENT_CONNS]")
	f.BoolVar(&cfg.WatchBMCs, "watch-bmcs", env.Bool("FLEET_WATCH_BMCS", cfg.WatchBMCs), "edges watch their BMCs as the real edge does [FLEET_WATCH_BMCS]")
	f.BoolVar(&cfg.ProvisionEveryBoot, "provision-every-boot", env.Bool("FLEET_PROVISION_EVERY_BOOT", cfg.ProvisionEveryBoot), "SideroLink Provision on every agent boot [FLEET_PROVISION_EVERY_BOOT]")
	f.DurationVar(&cfg.ReadyTimeout, "ready-timeout", env.Duration("FLEET_READY_TIMEOUT", cfg.ReadyTimeout), "bound on the wait for a ready fleet [FLEET_READY_TIMEOUT]")
	f.DurationVar(&cfg.Settle, "settle", env.Duration("FLEET_SETTLE", cfg.Settle), "wait after the sites go offline [FLEET_SETTLE]")
	f.DurationVar(&cfg.Window, "duration", env.Duration("FLEET_DURATION", cfg.Window), "steady-state window [FLEET_DURATION]")
	f.IntVar(&cfg.IntentSamples, "intent-samples", env.Int("FLEET_INTENT_SAMPLES", cfg.IntentSamples), "user requests timed [FLEET_INTENT_SAMPLES]")
	f.DurationVar(&cfg.IntentSpacing, "intent-spacing", env.Duration("FLEET_INTENT_SPACING", cfg.IntentSpacing), "time between two timed requests [FLEET_INTENT_SPACING]")
	f.DurationVar(&cfg.IntentTimeout, "intent-timeout", env.Duration("FLEET_INTENT_TIMEOUT", cfg.IntentTimeout), "wait for a request to reach its BMC [FLEET_INTENT_TIMEOUT]")
	f.DurationVar(&cfg.RestartTimeout, "restart-timeout", env.Duration("FLEET_RESTART_TIMEOUT", cfg.RestartTimeout), "bound on the restart's measures [FLEET_RESTART_TIMEOUT]")
	f.BoolVar(&cfg.Perf, "perf", env.Bool("FLEET_PERF", cfg.Perf), "profile the controller with perf during the window [FLEET_PERF]")
	f.DurationVar(&cfg.OmniLatency, "omni-latency", env.Duration("FLEET_OMNI_LATENCY", cfg.OmniLatency), "the stand-in delays every call this long (a slow Omni) [FLEET_OMNI_LATENCY]")
	f.IntVar(&cfg.FlappingSites, "flapping-sites", env.Int("FLEET_FLAPPING_SITES", cfg.FlappingSites), "sites whose WAN link drops every --flap-every from the steady state on [FLEET_FLAPPING_SITES]")
	f.DurationVar(&cfg.FlapEvery, "flap-every", env.Duration("FLEET_FLAP_EVERY", cfg.FlapEvery), "a flapping site's link is down half of this, up the other half [FLEET_FLAP_EVERY]")
	f.StringVar(&cfg.Label, "label", env.String("FLEET_LABEL", ""), "free text kept with the figures (a commit, a change) [FLEET_LABEL]")
	f.Uint64Var(&cfg.Seed, "seed", uint64(env.Int("FLEET_SEED", int(cfg.Seed))), "chooses dead BMCs, offline sites and samples [FLEET_SEED]") // small

	cmd.AddCommand(omniCommand())

	return cmd
}

// raiseOpenFiles lifts the open-file limit as far as it may go (the soft limit to the hard one; past it where the
// process may, up to the kernel's nr_open) and returns it: every simulated agent holds a connection, both of whose
// ends are in this process.
func raiseOpenFiles(log *zap.Logger) uint64 {
	var lim syscall.Rlimit
	if err := syscall.Getrlimit(syscall.RLIMIT_NOFILE, &lim); err != nil {
		return 0
	}

	want := uint64(1 << 20)
	if b, err := os.ReadFile("/proc/sys/fs/nr_open"); err == nil {
		if n, err := strconv.ParseUint(strings.TrimSpace(string(b)), 10, 64); err == nil {
			want = n
		}
	}

	if err := syscall.Setrlimit(syscall.RLIMIT_NOFILE, &syscall.Rlimit{Cur: want, Max: max(want, lim.Max)}); err != nil {
		lim.Cur = lim.Max
		if err := syscall.Setrlimit(syscall.RLIMIT_NOFILE, &lim); err != nil {
			log.Warn("open-file limit not raised", zap.Error(err))
		}
	}

	if err := syscall.Getrlimit(syscall.RLIMIT_NOFILE, &lim); err != nil {
		return 0
	}

	return lim.Cur
}

func omniCommand() *cobra.Command {
	cfg := fleet.OmniConfig{ProviderID: "bare-metal"}

	var level string

	cmd := &cobra.Command{
		Use:    "omni",
		Short:  "the Omni stand-in with a call counter (the simulator's child process)",
		Hidden: true,
		Args:   cobra.NoArgs,
		RunE: func(c *cobra.Command, _ []string) error {
			log, err := logging.New(os.Stderr, level)
			if err != nil {
				return err
			}

			cfg.Logger = log.With(zap.String("component", "omni_standin"))

			return fleet.ServeOmni(c.Context(), cfg, c.OutOrStdout())
		},
	}

	cmd.Flags().StringVar(&cfg.Listen, "listen", "127.0.0.1:0", "State API and SideroLink address")
	cmd.Flags().StringVar(&cfg.CallsListen, "calls-listen", "127.0.0.1:0", "call counts address (GET /calls)")
	cmd.Flags().StringVar(&cfg.StateDir, "state-dir", "", "persist the stand-in's state here (empty: memory)")
	cmd.Flags().DurationVar(&cfg.Latency, "latency", 0, "delay every State API call this long (a slow Omni)")
	cmd.Flags().StringVar(&level, "log-level", "warn", "log level")

	return cmd
}
