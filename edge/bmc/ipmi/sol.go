package ipmi

import (
	"context"
	"fmt"
	"io"
	"time"

	"github.com/bougou/go-ipmi/pkg/command/transport"
	"github.com/bougou/go-ipmi/pkg/types"
)

// solInstance is the SOL payload instance a console activates (IPMI v2.0 §24.1; BMCs serve instance 1).
const solInstance = 1

// SOL activates the serial-over-LAN payload (IPMI v2.0 §24.1) and exchanges console bytes through go-ipmi's
// SOLStream: in is typed at the machine's serial console, its output is written to out. It returns when ctx
// ends (nil), in ends (nil) or the session fails; the payload is deactivated on the way out (§24.2).
func (c *Client) SOL(ctx context.Context, in io.Reader, out io.Writer) error {
	if _, err := c.c.ActivatePayload(ctx, &transport.ActivatePayloadRequest{
		PayloadType: types.PayloadTypeSOL, PayloadInstance: solInstance,
	}); err != nil {
		return fmt.Errorf("activate sol: %w", c.fail(types.CommandActivatePayload, err))
	}

	defer func() {
		done, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
		defer cancel()

		c.c.DeactivatePayload(done, &transport.DeactivatePayloadRequest{ //nolint:errcheck // the session closes next anyway
			PayloadType: types.PayloadTypeSOL, PayloadInstance: solInstance,
		})
	}()

	err := c.c.SOLStream(ctx, in, out, nil)
	if err != nil && ctx.Err() == nil {
		return fmt.Errorf("sol stream: %w", c.fail(types.CommandActivatePayload, err))
	}

	return nil
}
