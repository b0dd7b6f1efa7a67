package app

import (
	"context"
	"errors"
	"fmt"

	"go.uber.org/zap"
	"golang.org/x/sync/errgroup"
)

// ErrEndedEarly is returned (wrapped, naming the component) when a component returned nil before the edge
// was stopped: the edge does not go on with a part of it gone.
var ErrEndedEarly = errors.New("ended before the edge was stopped")

// component is one long-running part of the edge.
type component struct {
	name string
	run  func(ctx context.Context) error
}

// runComponents runs every component under one errgroup until ctx ends or one of them returns: an error, or
// nil before ctx ended (ErrEndedEarly), cancels all the others. It returns once every component has
// returned, with the first component's error, named; nil when ctx ended and all stopped cleanly.
func runComponents(ctx context.Context, log *zap.Logger, comps []component) error {
	eg, ctx := errgroup.WithContext(ctx)

	for _, c := range comps {
		clog := log.With(zap.String("component", c.name))

		eg.Go(func() error {
			clog.Info("component starting")

			err := c.run(ctx)

			switch {
			case err != nil:
				clog.Info("component stopped", zap.Bool("failed", true))

				return fmt.Errorf("%s: %w", c.name, err)
			case ctx.Err() == nil:
				clog.Info("component stopped", zap.Bool("ended_early", true))

				return fmt.Errorf("%s: %w", c.name, ErrEndedEarly)
			default:
				clog.Info("component stopped")

				return nil
			}
		})
	}

	return eg.Wait()
}

// closer releases one thing Build opened, once every component has returned.
type closer struct {
	name  string
	close func() error
}

// closeAll closes in reverse order of opening and returns every failure, named.
func closeAll(closers []closer) error {
	var errs []error

	for i := len(closers) - 1; i >= 0; i-- {
		if err := closers[i].close(); err != nil {
			errs = append(errs, fmt.Errorf("close %s: %w", closers[i].name, err))
		}
	}

	return errors.Join(errs...)
}
