// Command omnistandin runs the Omni stand-in and performs user actions on it (accept, allocate, release, ...)
// by writing Omni's resources with the admin service account, as Omni's UI does.
//
//	omnistandin serve --listen 127.0.0.1:8099 --state-dir /tmp/omni --key-dir /tmp/omni/keys
//	export OMNI_ENDPOINT=grpc://127.0.0.1:8099 OMNI_ADMIN_KEY=@/tmp/omni/keys/admin.key
//	OMNI_SERVICE_ACCOUNT_KEY=$(cat /tmp/omni/keys/provider.key) controller ...   # the controller's key
//	omnistandin provision <uuid>        # a machine joins (what its agent does over SideroLink)
//	omnistandin accept <uuid>
//	omnistandin allocate <uuid> --talos-version v1.11.0 --extensions siderolabs/iscsi-tools
//	omnistandin install-event <uuid>    # Talos reported installed
//	omnistandin release <uuid>          # new wipe ID
//	omnistandin list
package main

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"net"
	"net/url"
	"os"
	"os/signal"
	"path/filepath"
	"strings"
	"syscall"
	"text/tabwriter"

	"github.com/siderolabs/omni/client/api/omni/specs"
	"github.com/siderolabs/omni/client/pkg/client"
	pb "github.com/siderolabs/siderolink/api/siderolink"
	"github.com/spf13/cobra"
	"go.uber.org/zap"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/outpost-metal/outpost/qemu/omni"
	"github.com/outpost-metal/outpost/shared/logging"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()

	if err := root().ExecuteContext(ctx); err != nil {
		fmt.Fprintln(os.Stderr, "error:", err)
		os.Exit(1)
	}
}

func envOr(key, def string) string {
	if v, ok := os.LookupEnv(key); ok {
		return v
	}

	return def
}

func root() *cobra.Command {
	var (
		endpoint, adminKey string
		insecureSkipVerify bool
	)

	cmd := &cobra.Command{Use: "omnistandin", Short: "Omni stand-in for the Outpost lab", SilenceUsage: true, SilenceErrors: true}
	cmd.PersistentFlags().StringVar(&endpoint, "endpoint", envOr("OMNI_ENDPOINT", "grpc://127.0.0.1:8099"), "stand-in endpoint (OMNI_ENDPOINT)")
	cmd.PersistentFlags().BoolVar(&insecureSkipVerify, "insecure-skip-verify", envOr("OMNI_INSECURE_SKIP_VERIFY", "") == "true",
		"skip TLS verification of an https:// endpoint (OMNI_INSECURE_SKIP_VERIFY)")
	cmd.PersistentFlags().StringVar(&adminKey, "admin-key", envOr("OMNI_ADMIN_KEY", ""), "admin service-account key, or @file (OMNI_ADMIN_KEY)")

	admin := func(ctx context.Context, fn func(*omni.Admin) error) error {
		key := adminKey
		if strings.HasPrefix(key, "@") {
			b, err := os.ReadFile(key[1:])
			if err != nil {
				return fmt.Errorf("read admin key: %w", err)
			}

			key = strings.TrimSpace(string(b))
		}

		if key == "" {
			return errors.New("no admin key: set --admin-key or OMNI_ADMIN_KEY")
		}

		c, err := client.New(endpoint, client.WithServiceAccount(key), client.WithInsecureSkipTLSVerify(insecureSkipVerify))
		if err != nil {
			return fmt.Errorf("connect to %s: %w", endpoint, err)
		}
		defer c.Close() //nolint:errcheck

		return fn(omni.NewAdmin(c.Omni().State()))
	}

	simple := func(use, short string, fn func(*omni.Admin, context.Context, string) error) *cobra.Command {
		return &cobra.Command{Use: use + " <machine-uuid>", Short: short, Args: cobra.ExactArgs(1), RunE: func(c *cobra.Command, args []string) error {
			return admin(c.Context(), func(a *omni.Admin) error { return fn(a, c.Context(), args[0]) })
		}}
	}

	cmd.AddCommand(
		serveCmd(),
		simple("accept", "accept a pending machine", (*omni.Admin).Accept),
		simple("reject", "reject a machine", (*omni.Admin).Reject),
		simple("cordon", "cordon a machine", func(a *omni.Admin, ctx context.Context, id string) error { return a.Cordon(ctx, id, true) }),
		simple("uncordon", "uncordon a machine", func(a *omni.Admin, ctx context.Context, id string) error { return a.Cordon(ctx, id, false) }),
		simple("reboot", "request a reboot", func(a *omni.Admin, ctx context.Context, id string) error { _, err := a.Reboot(ctx, id); return err }),
		simple("power-off", "request a shutdown", func(a *omni.Admin, ctx context.Context, id string) error { _, err := a.PowerOff(ctx, id); return err }),
		simple("release", "remove the machine from its cluster", (*omni.Admin).Release),
		simple("delete", "delete the machine from Omni", (*omni.Admin).Delete),
		simple("install-event", "count an install event (Talos installed on disk)", (*omni.Admin).ReportInstalled),
		&cobra.Command{Use: "power-state <machine-uuid> default|on|off", Short: "set the preferred power state", Args: cobra.ExactArgs(2),
			RunE: func(c *cobra.Command, args []string) error {
				return admin(c.Context(), func(a *omni.Admin) error { return a.SetPowerState(c.Context(), args[0], args[1]) })
			}},
		allocateCmd(admin),
		provisionCmd(&endpoint, &insecureSkipVerify, admin),
		bmcCmd(admin),
		&cobra.Command{Use: "list", Short: "list InfraMachines and their status", Args: cobra.NoArgs, RunE: func(c *cobra.Command, _ []string) error {
			return admin(c.Context(), func(a *omni.Admin) error { return list(c.Context(), a) })
		}},
	)

	return cmd
}

func serveCmd() *cobra.Command {
	cfg := omni.Default()

	var (
		listen, keyDir, level string
		selfSigned            bool
	)

	cmd := &cobra.Command{Use: "serve", Short: "serve Omni's State API and SideroLink Provision", Args: cobra.NoArgs,
		RunE: func(c *cobra.Command, _ []string) error {
			logger, err := logging.New(os.Stderr, level)
			if err != nil {
				return err
			}

			cfg.Logger = logger

			if selfSigned {
				host, _, err := net.SplitHostPort(listen)
				if err != nil {
					return fmt.Errorf("listen address: %w", err)
				}

				if cfg.TLSCertificate, err = omni.SelfSignedCertificate(host, "localhost"); err != nil {
					return err
				}
			}

			s, err := omni.New(cfg)
			if err != nil {
				return err
			}
			defer s.Close() //nolint:errcheck

			if keyDir != "" {
				if err = os.MkdirAll(keyDir, 0o700); err != nil {
					return fmt.Errorf("key directory: %w", err)
				}

				for name, key := range map[string]string{"provider.key": s.ProviderKey(), "admin.key": s.AdminKey()} {
					if err = os.WriteFile(filepath.Join(keyDir, name), []byte(key+"\n"), 0o600); err != nil {
						return fmt.Errorf("write %s: %w", name, err)
					}
				}
			}

			ln, err := net.Listen("tcp", listen)
			if err != nil {
				return fmt.Errorf("listen: %w", err)
			}

			logger.Info("omni stand-in serving", zap.String("component", "omni_stand_in"), zap.String("address", ln.Addr().String()),
				zap.String("provider_id", cfg.ProviderID))

			return s.Serve(c.Context(), ln)
		}}

	cmd.Flags().StringVar(&listen, "listen", envOr("OMNI_LISTEN", "127.0.0.1:8099"), "address to serve on (OMNI_LISTEN)")
	cmd.Flags().StringVar(&cfg.ProviderID, "provider-id", envOr("OMNI_PROVIDER_ID", cfg.ProviderID), "infra provider ID (OMNI_PROVIDER_ID)")
	cmd.Flags().StringVar(&cfg.StateDir, "state-dir", envOr("OMNI_STATE_DIR", ""), "persist state here; empty keeps it in memory (OMNI_STATE_DIR)")
	cmd.Flags().StringVar(&cfg.AdvertiseAddress, "advertise", envOr("OMNI_ADVERTISE", ""), "host:port machines reach SideroLink at (OMNI_ADVERTISE)")
	cmd.Flags().BoolVar(&cfg.CollectInfoOnProvision, "collect-info-on-provision", envOr("OMNI_COLLECT_INFO_ON_PROVISION", "") == "true",
		"count a machine's information as collected when it provisions (a real Omni needs a real Talos for that) (OMNI_COLLECT_INFO_ON_PROVISION)")
	cmd.Flags().StringVar(&keyDir, "key-dir", envOr("OMNI_KEY_DIR", ""), "write provider.key and admin.key here (OMNI_KEY_DIR)")
	cmd.Flags().BoolVar(&selfSigned, "tls-self-signed", envOr("OMNI_TLS_SELF_SIGNED", "") == "true",
		"serve TLS with a self-signed certificate (clients use https:// and skip verification) (OMNI_TLS_SELF_SIGNED)")
	cmd.Flags().StringVar(&level, "log-level", envOr("OMNI_LOG_LEVEL", "info"), "log level (OMNI_LOG_LEVEL)")

	return cmd
}

func allocateCmd(admin func(context.Context, func(*omni.Admin) error) error) *cobra.Command {
	var (
		cluster, talosVersion string
		extensions            []string
		controlPlane          bool
	)

	cmd := &cobra.Command{Use: "allocate <machine-uuid>", Short: "add the machine to a cluster", Args: cobra.ExactArgs(1),
		RunE: func(c *cobra.Command, args []string) error {
			return admin(c.Context(), func(a *omni.Admin) error {
				return a.Allocate(c.Context(), args[0], cluster, talosVersion, extensions, controlPlane)
			})
		}}

	cmd.Flags().StringVar(&cluster, "cluster", "lab", "cluster name")
	cmd.Flags().StringVar(&talosVersion, "talos-version", "1.11.5", "cluster Talos version (Omni's form, without v)")
	cmd.Flags().StringSliceVar(&extensions, "extensions", nil, "system extensions, e.g. siderolabs/iscsi-tools")
	cmd.Flags().BoolVar(&controlPlane, "control-plane", false, "allocate as a control plane node")

	return cmd
}

func bmcCmd(admin func(context.Context, func(*omni.Admin) error) error) *cobra.Command {
	ipmi := &specs.InfraMachineBMCConfigSpec_IPMI{}

	cmd := &cobra.Command{Use: "bmc-config <machine-uuid>", Short: "set operator-supplied IPMI credentials", Args: cobra.ExactArgs(1),
		RunE: func(c *cobra.Command, args []string) error {
			return admin(c.Context(), func(a *omni.Admin) error { return a.SetBMCConfig(c.Context(), args[0], ipmi) })
		}}

	cmd.Flags().StringVar(&ipmi.Address, "address", "", "IPMI address")
	cmd.Flags().Uint32Var(&ipmi.Port, "port", 623, "IPMI port")
	cmd.Flags().StringVar(&ipmi.Username, "username", "", "IPMI user")
	cmd.Flags().StringVar(&ipmi.Password, "password", "", "IPMI password")

	return cmd
}

func list(ctx context.Context, a *omni.Admin) error {
	ms, err := a.List(ctx)
	if err != nil {
		return err
	}

	w := tabwriter.NewWriter(os.Stdout, 2, 4, 2, ' ', 0)
	fmt.Fprintln(w, "ID\tACCEPTANCE\tPREFERRED\tTALOS\tWIPE ID\tINSTALLS\tPOWER\tREADY\tINSTALLED")

	for _, m := range ms {
		power, ready, installed := "-", "-", "-"
		if m.Status != nil {
			power = m.Status.PowerState.String()
			ready = fmt.Sprint(m.Status.ReadyToUse)
			installed = fmt.Sprint(m.Status.Installed)
		}

		fmt.Fprintf(w, "%s\t%s\t%s\t%s\t%s\t%d\t%s\t%s\t%s\n", m.ID, m.Spec.AcceptanceStatus, m.Spec.PreferredPowerState,
			m.Spec.ClusterTalosVersion, m.Spec.WipeId, m.Spec.InstallEventId, power, ready, installed)
	}

	return w.Flush()
}

func provisionCmd(endpoint *string, insecureSkipVerify *bool, admin func(context.Context, func(*omni.Admin) error) error) *cobra.Command {
	var providerID, talosVersion string

	cmd := &cobra.Command{Use: "provision <machine-uuid>", Short: "join a machine over SideroLink as its agent would (lab without an agent)",
		Args: cobra.ExactArgs(1), RunE: func(c *cobra.Command, args []string) error {
			return admin(c.Context(), func(a *omni.Admin) error {
				token, err := a.JoinToken(c.Context(), providerID)
				if err != nil {
					return err
				}

				u, err := url.Parse(*endpoint)
				if err != nil {
					return fmt.Errorf("endpoint: %w", err)
				}

				creds := insecure.NewCredentials()
				if u.Scheme == "https" {
					creds = credentials.NewTLS(&tls.Config{InsecureSkipVerify: *insecureSkipVerify}) // lab flag
				}

				conn, err := grpc.NewClient(u.Host, grpc.WithTransportCredentials(creds))
				if err != nil {
					return fmt.Errorf("dial %s: %w", u.Host, err)
				}
				defer conn.Close() //nolint:errcheck

				_, err = pb.NewProvisionServiceClient(conn).Provision(c.Context(), &pb.ProvisionRequest{
					NodeUuid: args[0], NodePublicKey: "lab", JoinToken: &token, TalosVersion: &talosVersion,
				})
				if err != nil {
					return fmt.Errorf("provision %s: %w", args[0], err)
				}

				return nil
			})
		}}

	cmd.Flags().StringVar(&providerID, "provider-id", "bare-metal", "provider whose join token the machine presents")
	cmd.Flags().StringVar(&talosVersion, "talos-version", "v1.11.0", "Talos version the machine reports")

	return cmd
}
