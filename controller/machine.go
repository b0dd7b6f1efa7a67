package main

import (
	"context"
	"time"

	"github.com/spf13/cobra"

	"github.com/outpost-metal/outpost/controller/admincli"
	"github.com/outpost-metal/outpost/controller/config"
)

// adminClient runs fn with a client of the controller's admin socket printing as output says; a call gets
// timeout (0: until the command's context ends, for watches).
func adminClient(cfg *config.Config, output *string, timeout time.Duration, fn func(context.Context, *admincli.Client) error) func(*cobra.Command, []string) error {
	return func(cmd *cobra.Command, _ []string) error {
		out, err := admincli.ParseOutput(*output)
		if err != nil {
			return err
		}

		c, err := admincli.Dial(cfg.AdminSocketPath())
		if err != nil {
			return err
		}
		defer c.Close() //nolint:errcheck

		c.Output = out

		ctx := cmd.Context()

		if timeout > 0 {
			var cancel context.CancelFunc

			ctx, cancel = context.WithTimeout(ctx, timeout)
			defer cancel()
		}

		return fn(ctx, c)
	}
}

func machineCommand(cfg *config.Config) *cobra.Command {
	machine := &cobra.Command{Use: "machine", Short: "Show machines: list (by site and phase), show one with its timeline, why one did not boot; set a boot mode"}

	var (
		output string
		filter admincli.MachineFilter
		watch  bool
		every  time.Duration
	)

	machine.PersistentFlags().StringVarP(&output, "output", "o", string(admincli.OutputTable), "table or json")

	list := &cobra.Command{
		Use:   "list",
		Short: "List machines with site, phase, power, agent, BMC and last event (--watch redraws it live)",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			if watch {
				return adminClient(cfg, &output, 0, func(ctx context.Context, c *admincli.Client) error {
					return c.WatchMachines(ctx, filter, cmd.OutOrStdout(), every, time.Now)
				})(cmd, args)
			}

			return adminClient(cfg, &output, time.Minute, func(ctx context.Context, c *admincli.Client) error {
				return c.ListMachines(ctx, filter, cmd.OutOrStdout(), time.Now())
			})(cmd, args)
		},
	}
	list.Flags().StringVar(&filter.Site, "site", "", "only machines at this site")
	list.Flags().StringVar(&filter.Phase, "phase", "", "only machines in this phase (pending-acceptance, rejected, cordoned, awaiting-bmc, wiping, ready, installing, installed, unknown)")
	list.Flags().BoolVarP(&watch, "watch", "w", false, "redraw the list until interrupted")
	list.Flags().DurationVar(&every, "interval", 2*time.Second, "how often --watch redraws")

	show := &cobra.Command{
		Use:   "show MACHINE",
		Short: "Show a machine: site, phase, power, BMC, agent and its timeline",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			return adminClient(cfg, &output, 30*time.Second, func(ctx context.Context, c *admincli.Client) error {
				return c.ShowMachine(ctx, args[0], cmd.OutOrStdout(), time.Now())
			})(cmd, args)
		},
	}

	why := &cobra.Command{
		Use:   "why MACHINE",
		Short: "Say where a machine's current network boot stopped, with the evidence from its site's edge",
		Long: "Read the machine's timeline (its edge's journal and the lifecycle's steps) and say which step of its\n" +
			"current network boot did not happen within its grace (DHCP, boot file, boot script, agent tunnel,\n" +
			"install) after the last one that did, then list the entries of that boot.",
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			return adminClient(cfg, &output, 30*time.Second, func(ctx context.Context, c *admincli.Client) error {
				return c.WhyMachine(ctx, args[0], cmd.OutOrStdout())
			})(cmd, args)
		},
	}

	bootMode := &cobra.Command{
		Use:   "boot-mode MACHINE bios|uefi|auto",
		Short: "Set the firmware a machine's network boots use, over what it reports (auto: its reports decide again)",
		Long: "Set the firmware the controller assumes when it asks a machine's BMC for a one-time network boot. The\n" +
			"machine reports its own (DHCP option 93, its boot script request); an operator's word is above both\n" +
			"until it is handed back with auto. The machine must have booted through an edge once.",
		Args: cobra.ExactArgs(2),
		RunE: func(cmd *cobra.Command, args []string) error {
			return adminClient(cfg, &output, 30*time.Second, func(ctx context.Context, c *admincli.Client) error {
				return c.SetBootMode(ctx, args[0], args[1], cmd.OutOrStdout())
			})(cmd, args)
		},
	}

	secureBoot := &cobra.Command{
		Use:   "secure-boot MACHINE on|off|auto",
		Short: "Say whether a machine's firmware enforces Secure Boot, over its site's setting and its BMC (auto: they decide again)",
		Long: "Say whether a machine's firmware enforces Secure Boot. Such a machine is offered only its site's signed\n" +
			"image, never iPXE. The controller reads it from the machine's BMC (Redfish SecureBoot); a site's setting\n" +
			"(site set --secure-boot) is above that, and an operator's word for the machine above both until it is\n" +
			"handed back with auto. The machine must have booted through an edge once, or be in an edge's inventory.",
		Args: cobra.ExactArgs(2),
		RunE: func(cmd *cobra.Command, args []string) error {
			return adminClient(cfg, &output, 30*time.Second, func(ctx context.Context, c *admincli.Client) error {
				return c.SetSecureBoot(ctx, args[0], args[1], cmd.OutOrStdout())
			})(cmd, args)
		},
	}

	clearAlert := &cobra.Command{
		Use:   "clear-alert MACHINE",
		Short: "Clear a machine's identity alert (outpost-alert in Omni) once its cloned UUID or rogue host is dealt with",
		Long: "Clear the alert the controller raised when another host or a clone asked for the machine's agent tunnel, or\n" +
			"another site claimed it. A contested UUID (two machines booting as one) holds every agent call to the\n" +
			"machine until this is run; the others clear by themselves when the machine's own tunnel opens again.",
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			return adminClient(cfg, &output, 30*time.Second, func(ctx context.Context, c *admincli.Client) error {
				return c.ClearAlert(ctx, args[0], cmd.OutOrStdout())
			})(cmd, args)
		},
	}

	machine.AddCommand(list, show, why, bootMode, secureBoot, clearAlert, machineConsoleCommand(cfg, &output))

	return machine
}
