package main

import (
	"context"
	"os"
	"os/user"

	"github.com/spf13/cobra"
	"golang.org/x/term"

	"github.com/outpost-metal/outpost/controller/admincli"
	"github.com/outpost-metal/outpost/controller/config"
)

// machineConsoleCommand is "machine console": a machine's serial console through its edge and BMC.
func machineConsoleCommand(cfg *config.Config, output *string) *cobra.Command {
	var write bool

	cmd := &cobra.Command{
		Use:   "console MACHINE",
		Short: "Attach to a machine's serial console (IPMI serial-over-LAN through its site's edge); read-only unless --write",
		Long: "Show the machine's serial console as its BMC's serial-over-LAN carries it, through the machine's site's\n" +
			"edge. Read-only unless --write; one writer per machine at a time (a second is refused with the name of\n" +
			"the one holding it). With --write on a terminal, keys go to the machine as typed and Ctrl-] detaches.\n" +
			"Every session is logged at the controller and the edge (who, read or write, bytes).",
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			return adminClient(cfg, output, 0, func(ctx context.Context, c *admincli.Client) error {
				in := cmd.InOrStdin()

				if f, ok := in.(*os.File); ok && write && term.IsTerminal(int(f.Fd())) {
					old, err := term.MakeRaw(int(f.Fd()))
					if err == nil {
						defer term.Restore(int(f.Fd()), old) //nolint:errcheck
					}
				}

				return c.Console(ctx, args[0], operator(), write, in, cmd.OutOrStdout(), cmd.ErrOrStderr())
			})(cmd, args)
		},
	}
	cmd.Flags().BoolVar(&write, "write", false, "type at the console too (one writer per machine)")

	return cmd
}

// operator names who attaches, for the logs and for a second writer's refusal.
func operator() string {
	name := "unknown"
	if u, err := user.Current(); err == nil {
		name = u.Username
	}

	host, _ := os.Hostname()

	return name + "@" + host
}
