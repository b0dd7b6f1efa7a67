package app

import (
	"context"
	"net"
)

// UplinkAddr is where the uplink listens.
func (c *Controller) UplinkAddr() net.Addr { return c.uplinkAddr }

// HTTPAddr is where /metrics and /healthz are served (nil when disabled).
func (c *Controller) HTTPAddr() net.Addr { return c.httpAddr }

// AddComponent adds a component to the run list, as an optional step would.
func (c *Controller) AddComponent(name string, run func(ctx context.Context) error) {
	c.group.Go(name, run)
}

// AddCloser adds something to close after the components, as a step would; it is closed first.
func (c *Controller) AddCloser(name string, fn func() error) {
	c.group.OnClose(name, fn)
}
