package bootevents

import (
	"context"

	bootpb "github.com/outpost-metal/outpost/shared/api/boot"
)

// HandlerFunc adapts a function to Handler.
type HandlerFunc func(ctx context.Context, site string, e *bootpb.Event) error

// HandleEvent calls f.
func (f HandlerFunc) HandleEvent(ctx context.Context, site string, e *bootpb.Event) error {
	return f(ctx, site, e)
}
