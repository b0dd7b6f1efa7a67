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
	"net"

	"go.uber.org/zap"

	"github.com/outpost-metal/outpost/controller/config"
	"github.com/outpost-metal/outpost/shared/rungroup"
)

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
	group *rungroup.Group

	uplinkAddr, httpAddr net.Addr
}

// Run runs every component until ctx is done or one of them returns, then stops the others, waits for all
// of them and closes what Build opened, in reverse order. It returns nil after a cancellation of ctx, the
// first component's error (named; rungroup.ErrStoppedOnItsOwn for one that returned on its own) otherwise,
// joined with any failure to close. A Controller runs once (rungroup.ErrAlreadyRun).
func (c *Controller) Run(ctx context.Context) error {
	return c.group.Run(ctx)
}

// Close closes what Build opened, for a controller that is not run (Run closes it itself): its store, its
// listeners and its Omni connection are released.
func (c *Controller) Close() error {
	return c.group.Close()
}
