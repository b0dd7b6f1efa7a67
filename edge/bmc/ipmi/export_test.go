package ipmi

import (
	"context"

	"github.com/bougou/go-ipmi/pkg/types"
)

// Raw sends one request and classifies a failure like every other command (tests only: they ask a BMC for
// something it refuses).
func (c *Client) Raw(ctx context.Context, netFn types.NetFn, cmd uint8, data []byte) ([]byte, error) {
	resp, err := c.c.RawCommand(ctx, netFn, cmd, data, "raw")
	if err != nil {
		return nil, c.fail(types.Command{ID: cmd, NetFn: netFn, Name: "raw"}, err)
	}

	return resp.Response, nil
}
