package boottables

import (
	"context"
	"errors"
	"fmt"

	"google.golang.org/grpc"

	bootpb "github.com/outpost-metal/outpost/shared/api/boot"
)

// PushSnapshot sends tbl as a snapshot to the edge behind conn and returns the acknowledged version.
func PushSnapshot(ctx context.Context, conn grpc.ClientConnInterface, tbl *bootpb.Table) (uint64, error) {
	resp, err := bootpb.NewBootPlansClient(conn).Apply(ctx, &bootpb.ApplyRequest{Change: &bootpb.ApplyRequest_Snapshot{Snapshot: tbl}})
	if err != nil {
		return 0, fmt.Errorf("push boot table %d: %w", tbl.GetVersion(), err)
	}

	if resp.GetVersion() != tbl.GetVersion() {
		return resp.GetVersion(), errors.New("edge acknowledged a different version")
	}

	return resp.GetVersion(), nil
}
