// Package rungroup runs a binary's long-running components by name under one errgroup: when one of them
// returns, for any reason, every other one is stopped, and once all of them have returned what was opened for
// them is closed, newest first. Both composition roots (controller/app, edge/app) and the controller's lease
// term run their components here, so a start, a stop and an early end read the same in both binaries' logs.
package rungroup

import (
	"context"
	"errors"
	"fmt"
	"net"
	"slices"
	"sync/atomic"

	"go.uber.org/zap"
	"golang.org/x/sync/errgroup"
)

// ErrStoppedOnItsOwn is returned, wrapped with the component's name, when a component returned nil before it
// was told to stop: what runs it cannot go on with a part gone, so every other component is stopped.
var ErrStoppedOnItsOwn = errors.New("stopped on its own")

// ErrAlreadyRun is returned by a Group's Run after its first Run or its Close: a group runs once.
var ErrAlreadyRun = errors.New("already run")

// Component is one long-running unit: Run returns nil once ctx is done, an error when it cannot go on.
type Component struct {
	// Name names the component in logs and in the error Run returns.
	Name string
	Run  func(ctx context.Context) error
}

// Run runs every component until ctx is done or one of them returns, then cancels the others and waits for
// all of them. It returns the first error, wrapped with its component's name (ErrStoppedOnItsOwn for a
// component that returned nil before ctx was done), and nil when ctx was cancelled and every component
// returned nil. Each start and stop is logged with the component's name.
func Run(ctx context.Context, log *zap.Logger, comps []Component) error {
	eg, ctx := errgroup.WithContext(ctx)

	for _, c := range comps {
		clog := log.With(zap.String("component", c.Name))

		eg.Go(func() error {
			clog.Info("component started")

			err := c.Run(ctx)

			switch {
			case err != nil:
				clog.Info("component stopped", zap.String("reason", "failed"))

				return fmt.Errorf("%s: %w", c.Name, err)
			case ctx.Err() == nil:
				clog.Info("component stopped", zap.String("reason", "ended early"))

				return fmt.Errorf("%s: %w", c.Name, ErrStoppedOnItsOwn)
			default:
				clog.Info("component stopped", zap.String("reason", "told to stop"))

				return nil
			}
		})
	}

	return eg.Wait()
}

// Group is what a composition root builds: the components to run and what to close once they have returned
// (stores, listeners, files). The zero value is not usable; see New.
type Group struct {
	log        *zap.Logger
	components []Component
	closers    []closer
	// used is set by the first Run or Close: the closers run once, after the components or instead of them.
	used atomic.Bool
}

// closer releases one thing opened for the components.
type closer struct {
	name  string
	close func() error
}

// New returns an empty group that logs to log.
func New(log *zap.Logger) *Group {
	return &Group{log: log}
}

// Go adds a component to run. Components are added while the group is built, before Run.
func (g *Group) Go(name string, run func(ctx context.Context) error) {
	g.components = append(g.components, Component{Name: name, Run: run})
}

// OnClose adds something to close once every component has returned (or on Close); the last added is closed
// first. Closing what is already closed (net.ErrClosed) is not a failure.
func (g *Group) OnClose(name string, fn func() error) {
	g.closers = append(g.closers, closer{name: name, close: fn})
}

// Run runs the components as the package's Run does, then closes what was added with OnClose, newest first.
// It returns the components' error joined with every failure to close. A group runs once: a second Run, or a
// Run after Close, returns ErrAlreadyRun and runs nothing.
func (g *Group) Run(ctx context.Context) error {
	if g.used.Swap(true) {
		return ErrAlreadyRun
	}

	err := Run(ctx, g.log, g.components)

	return errors.Join(err, g.close())
}

// Close closes what was added with OnClose, newest first, for a group that will not run (its construction
// failed, or its caller gave up before Run). After Run, or a first Close, it does nothing and returns nil.
func (g *Group) Close() error {
	if g.used.Swap(true) {
		return nil
	}

	return g.close()
}

// close runs the closers, newest first, and says what failed, each failure named.
func (g *Group) close() error {
	var errs []error

	for _, c := range slices.Backward(g.closers) {
		if err := IgnoreClosed(c.close()); err != nil {
			errs = append(errs, fmt.Errorf("close %s: %w", c.name, err))
		}
	}

	return errors.Join(errs...)
}

// IgnoreClosed drops the error of closing what was already closed (a listener its server closed on its way
// out): nil for net.ErrClosed, err otherwise.
func IgnoreClosed(err error) error {
	if errors.Is(err, net.ErrClosed) {
		return nil
	}

	return err
}
