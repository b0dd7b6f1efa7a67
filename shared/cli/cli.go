// Package cli is what the controller's and the edge's main packages share: the root command's settings and
// running it until an interrupt.
package cli

import (
	"context"
	"fmt"
	"os"
	"os/signal"
	"syscall"

	"github.com/spf13/cobra"
	"go.uber.org/zap"

	"github.com/outpost-metal/outpost/shared/logging"
	"github.com/outpost-metal/outpost/shared/version"
)

// Root returns a binary's root command: it takes no arguments, reports the build's version, prints no usage on
// a failure, runs prepare before any command (flags parsed: apply their environment variables, resolve paths),
// and, run without a subcommand, logs at *level (read once flags are parsed) and runs serve until its context
// ends.
func Root(use, short string, level *string, prepare func() error, serve func(context.Context, *zap.Logger) error) *cobra.Command {
	return &cobra.Command{
		Use:               use,
		Short:             short,
		Version:           version.String(),
		SilenceUsage:      true,
		SilenceErrors:     true,
		Args:              cobra.NoArgs,
		PersistentPreRunE: func(*cobra.Command, []string) error { return prepare() },
		RunE: func(cmd *cobra.Command, _ []string) error {
			log, err := logging.New(os.Stderr, *level)
			if err != nil {
				return err
			}
			defer log.Sync() //nolint:errcheck

			log.Info("outpost "+use, zap.String("version", version.String()))

			return serve(cmd.Context(), log)
		},
	}
}

// Main runs root with a context that an interrupt or SIGTERM cancels, and exits 1 saying "<name>: <error>" when
// it fails.
func Main(root *cobra.Command) {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)

	err := root.ExecuteContext(ctx)

	stop()

	if err != nil {
		fmt.Fprintln(os.Stderr, root.Name()+":", err)
		os.Exit(1)
	}
}
