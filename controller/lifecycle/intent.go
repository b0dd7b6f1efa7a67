package lifecycle

import (
	"context"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/outpost-metal/outpost/controller/resources/specs"
	intentspb "github.com/outpost-metal/outpost/shared/api/intents"
)

// IntentClient asks a site's edge what became of an intent: a destructive or disruptive call (a disk wipe, a
// power cycle) the lifecycle recorded before sending it with that ID (shared/api/intents).
//
// The protocol: a step writes the intent into its own record in Omni, then sends the call carrying the
// intent's ID; the edge carries out each ID at most once and keeps the outcome. When the call ends without an
// answer (an uplink cut, a controller crash), the intent stays open in the record; the step, in this process or
// the next controller, asks the edge before it acts again: done is recorded as done, failed or interrupted is
// closed and decided afresh, and anything else is sent again under the same ID, which the edge runs at most
// once.
type IntentClient interface {
	IntentOutcome(ctx context.Context, siteID, machineID, intentID string) (intentspb.State, error)
}

// Intent operations recorded in IntentSpec.op.
const (
	intentWipe        = "wipe"
	intentPowerCycle  = "power-cycle"
	intentIDRandBytes = 12
)

// intentBook opens intents and asks the edges what became of them (the wipe and reboot steps share it).
type intentBook struct {
	client IntentClient
	// rand is the source of intent IDs; now stamps them; callTimeout bounds each question to an edge.
	rand        io.Reader
	now         func() time.Time
	callTimeout time.Duration
	// journal is told what is unknown about an intent (optional: nil).
	journal Journal
}

// newIntent returns an open intent for op at site, serving cause (a wipe ID, a reboot request ID).
func (b *intentBook) newIntent(op, site, cause, reason string) (*specs.IntentSpec, error) {
	var id [intentIDRandBytes]byte
	if _, err := io.ReadFull(b.rand, id[:]); err != nil {
		return nil, fmt.Errorf("intent id: %w", err)
	}

	return &specs.IntentSpec{
		Id: op + "-" + hex.EncodeToString(id[:]), Op: op, SiteId: site, CreatedAt: timestamppb.New(b.now()), Cause: cause, Reason: reason,
	}, nil
}

// alert records, as an alert in the machine's timeline, what is unknown about an intent and what the
// lifecycle does about it.
func (b *intentBook) alert(machineID, text string) {
	if b.journal != nil {
		b.journal.Record(machineID, "intent", text, true)
	}
}

// intentClosed is a call whose intent the edge says ended without the effect asked for (failed) or with an
// effect nobody knows (interrupted by an edge restart): the step clears the intent from its record and decides
// afresh, under a new intent.
type intentClosed struct {
	state intentspb.State
	err   error
}

func (c *intentClosed) Error() string {
	if c.state == intentspb.State_STATE_INTERRUPTED {
		return fmt.Sprintf("interrupted by an edge restart, whether it took effect is unknown: %v", c.err)
	}

	return c.err.Error()
}

func (c *intentClosed) Unwrap() error { return c.err }

// errIntentOpen is a call whose intent the edge holds no word on yet (not received, or still running): it
// stays open and is sent again under the same ID.
var errIntentOpen = errors.New("intent still open at the edge")

// outcome asks the edge what became of intent in. done means it was carried out; a non-nil error is an
// *intentClosed (clear it), errIntentOpen, or the failure to ask (keep it open).
func (b *intentBook) outcome(ctx context.Context, machineID string, in *specs.IntentSpec) (done bool, err error) {
	callCtx, cancel := context.WithTimeout(ctx, b.callTimeout)
	defer cancel()

	state, err := b.client.IntentOutcome(callCtx, in.GetSiteId(), machineID, in.GetId())
	if status.Code(err) == codes.Unimplemented {
		// An edge of the release before intents: it cannot say, and carries out a repeat again (at least once).
		return false, fmt.Errorf("intent %s: %w: the edge keeps no intents (its release is older)", in.GetId(), errIntentOpen)
	}

	if err != nil {
		return false, fmt.Errorf("ask the edge about intent %s: %w", in.GetId(), err)
	}

	switch state {
	case intentspb.State_STATE_DONE:
		return true, nil
	case intentspb.State_STATE_FAILED, intentspb.State_STATE_INTERRUPTED:
		return false, &intentClosed{state: state, err: fmt.Errorf("intent %s %s at the edge", in.GetId(), stateWord(state))}
	default:
		return false, fmt.Errorf("intent %s: %w (%s)", in.GetId(), errIntentOpen, stateWord(state))
	}
}

// settle tells what a call sent under intent in that ended with callErr means: nil when the edge carried it
// out (only the answer was lost), an *intentClosed when the edge says it failed (with the call's own error) or
// was interrupted, and callErr itself while the intent is open.
func (b *intentBook) settle(ctx context.Context, machineID string, in *specs.IntentSpec, callErr error) error {
	if callErr == nil {
		return nil
	}

	done, err := b.outcome(context.WithoutCancel(ctx), machineID, in)

	var closed *intentClosed

	switch {
	case done:
		return nil
	case errors.As(err, &closed):
		if closed.state == intentspb.State_STATE_FAILED {
			closed.err = callErr
		}

		return closed
	default:
		return callErr
	}
}

func stateWord(s intentspb.State) string {
	switch s {
	case intentspb.State_STATE_RUNNING:
		return "running"
	case intentspb.State_STATE_DONE:
		return "done"
	case intentspb.State_STATE_FAILED:
		return "failed"
	case intentspb.State_STATE_INTERRUPTED:
		return "interrupted"
	default:
		return "not known"
	}
}
