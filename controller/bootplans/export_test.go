package bootplans

import (
	"context"
	"errors"
	"fmt"

	"google.golang.org/grpc"

	bootpb "github.com/outpost-metal/outpost/shared/api/boot"
)

// HandlerFunc adapts a function to Handler.
type HandlerFunc func(ctx context.Context, site string, e *bootpb.Event) error

// HandleEvent calls f.
func (f HandlerFunc) HandleEvent(ctx context.Context, site string, e *bootpb.Event) error {
	return f(ctx, site, e)
}

// Push sends tbl as a snapshot to the edge behind conn and returns the acknowledged version.
func Push(ctx context.Context, conn grpc.ClientConnInterface, tbl *bootpb.Table) (uint64, error) {
	resp, err := bootpb.NewBootPlansClient(conn).Apply(ctx, &bootpb.ApplyRequest{Change: &bootpb.ApplyRequest_Snapshot{Snapshot: tbl}})
	if err != nil {
		return 0, fmt.Errorf("push boot table %d: %w", tbl.GetVersion(), err)
	}

	if resp.GetVersion() != tbl.GetVersion() {
		return resp.GetVersion(), errors.New("edge acknowledged a different version")
	}

	return resp.GetVersion(), nil
}
