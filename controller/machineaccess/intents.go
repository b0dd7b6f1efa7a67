package machineaccess

import (
	"context"
	"fmt"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	intentspb "github.com/outpost-metal/outpost/shared/api/intents"
)

// IntentOutcome asks the site's edge what became of an intent it may have carried out for machineID.
func (c *Client) IntentOutcome(ctx context.Context, siteID, machineID, intentID string) (*intentspb.IntentOutcome, error) {
	if err := c.check(siteID, machineID); err != nil {
		return nil, status.Error(codes.Aborted, err.Error())
	}

	conn, err := c.conn(siteID)
	if err != nil {
		return nil, status.Error(codes.Unavailable, fmt.Sprintf("reach the edge of site %s: %v", siteID, err))
	}

	return intentspb.NewIntentsClient(conn).Outcome(ctx, &intentspb.OutcomeRequest{IntentId: intentID, MachineId: machineID})
}
