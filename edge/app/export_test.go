package app

import (
	"context"

	"go.uber.org/zap"
)

// Component is a component for tests of the runner.
type Component = component

// NewComponent names a run function.
func NewComponent(name string, run func(context.Context) error) Component {
	return component{name, run}
}

// RunComponents exposes the runner to tests.
func RunComponents(ctx context.Context, log *zap.Logger, comps []Component) error {
	return runComponents(ctx, log, comps)
}

// Addrs returns the addresses the edge serves on.
func (e *Edge) Addrs() Addrs { return e.addrs }
