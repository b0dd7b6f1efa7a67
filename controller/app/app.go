// Package app is the controller's composition root. Build constructs every component from the
// configuration, in dependency order, and starts nothing; Controller.Run then runs the long-running ones,
// each by name, under one errgroup, and closes what Build opened once all of them have returned.
//
// Files: build.go (the order of construction and the place where optional components join), edges.go (the
// controller's side of the edges: locations, boot tables, BMC and agent clients), lifecycle.go (the Omni
// connection and the lifecycle on it), planassets.go (plans that name the assets their site must hold),
// servers.go (the state store, listeners and the admin and HTTP servers).
package app

import (
	"context"
	"errors"
	"fmt"
	"net"
	"slices"
	"sync/atomic"

	"go.uber.org/zap"
	"golang.org/x/sync/errgroup"

	"github.com/outpost-metal/outpost/controller/config"
	"github.com/outpost-metal/outpost/controller/lease"
)

// ErrStoppedOnItsOwn means a component returned before the controller was told to stop: the controller
// cannot go on without it, so Run stops every other one and returns this (wrapped with the component's name).
var ErrStoppedOnItsOwn = errors.New("stopped on its own")

// Run builds the controller and runs it until ctx is done or a component stops.
func Run(ctx context.Context, cfg config.Config, log *zap.Logger) error {
	c, err := Build(ctx, cfg, log)
	if err != nil {
		return err
	}

	return c.Run(ctx)
}

// Controller is a built controller: its components, ready to run, and what to close after them.
type Controller struct {
	log        *zap.Logger
	components []component
	closers    []closer
	ran        atomic.Bool

	uplinkAddr, httpAddr net.Addr
	// elector is the lease this controller campaigns for (nil without Omni: it always acts).
	elector *lease.Elector
}

// component is one long-running unit: run returns nil once ctx is done.
type component struct {
	name string
	run  func(ctx context.Context) error
}

// closer releases something Build opened (a store, a listener).
type closer struct {
	name  string
	close func() error
}

// Run runs every component until ctx is done or one of them returns, then stops the others, waits for all
// of them and closes what Build opened, in reverse order. It returns nil after a cancellation of ctx, the
// first component's error (named) otherwise, joined with any failure to close. A Controller runs once.
func (c *Controller) Run(ctx context.Context) error {
	if c.ran.Swap(true) {
		return errors.New("controller: Run called twice")
	}

	eg, ctx := errgroup.WithContext(ctx)

	for _, comp := range c.components {
		eg.Go(func() error {
			name := zap.String("component", comp.name)
			c.log.Info("component started", name)

			err := comp.run(ctx)

			switch {
			case err != nil:
				err = fmt.Errorf("%s: %w", comp.name, err)
			case ctx.Err() == nil:
				err = fmt.Errorf("%s: %w", comp.name, ErrStoppedOnItsOwn)
			}

			c.log.Info("component stopped", name, zap.Bool("failed", err != nil))

			return err
		})
	}

	err := eg.Wait()

	return errors.Join(err, c.close())
}

// close closes what Build opened, newest first, and says what failed.
func (c *Controller) close() error {
	var errs []error

	for _, cl := range slices.Backward(c.closers) {
		if err := cl.close(); err != nil && !errors.Is(err, net.ErrClosed) {
			errs = append(errs, fmt.Errorf("close %s: %w", cl.name, err))
		}
	}

	c.closers = nil

	return errors.Join(errs...)
}
