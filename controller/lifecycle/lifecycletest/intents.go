package lifecycletest

import (
	"context"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	"github.com/outpost-metal/outpost/edge/intents"
	intentspb "github.com/outpost-metal/outpost/shared/api/intents"
)

// RestartIntents closes the fake edge's intent store and opens it again from its directory, as an edge
// restart does: intents that were running are interrupted.
func (f *FakeEdge) RestartIntents() error {
	f.mu.Lock()
	defer f.mu.Unlock()

	if f.intents != nil {
		f.intents.Close() //nolint:errcheck // reopened from the file, which every record was synced to
	}

	cfg := intents.Default()
	cfg.Dir = f.intentDir

	store, err := intents.Open(cfg, f.zlog, time.Now)
	if err != nil {
		return err
	}

	f.intents = store

	return nil
}

// LoseReplies makes the next n calls of machine id named call ("WipeDisks", "PowerCycle") reach the machine
// and then fail as a call whose reply an uplink cut lost does.
func (f *FakeEdge) LoseReplies(id, call string, n int) {
	f.mu.Lock()
	defer f.mu.Unlock()

	f.lose[id+" "+call] = n
}

// once runs do for machine id's call, through the intent store when the call carries an intent ID and the
// fake edge has one, and loses the reply when LoseReplies says so.
func (f *FakeEdge) once(ctx context.Context, id, call, method string, do func(context.Context) error) error {
	f.mu.Lock()
	store := f.intents
	f.mu.Unlock()

	md, _ := metadata.FromOutgoingContext(ctx)

	intentID, err := intentspb.FromMetadata(md)
	if err != nil {
		return status.Error(codes.InvalidArgument, err.Error())
	}

	if store != nil && intentID != "" {
		_, err = store.Do(ctx, intentID, id, method, func(ctx context.Context) ([]byte, error) { return nil, do(ctx) })
	} else {
		err = do(ctx)
	}

	f.mu.Lock()
	defer f.mu.Unlock()

	if key := id + " " + call; f.lose[key] > 0 {
		f.lose[key]--

		return status.Error(codes.Unavailable, "error reading from server: EOF")
	}

	return err
}

// IntentOutcome implements lifecycle.IntentClient: what the intent store says (an edge without one answers
// Unimplemented, as one of the release before intents does).
func (f *FakeEdge) IntentOutcome(_ context.Context, site, id, intentID string) (intentspb.State, error) {
	f.mu.Lock()
	store, offline := f.intents, f.offline[site]
	f.mu.Unlock()

	switch {
	case offline:
		return intentspb.State_STATE_UNKNOWN, status.Error(codes.Unavailable, "site offline")
	case store == nil:
		return intentspb.State_STATE_UNKNOWN, status.Error(codes.Unimplemented, "no intent store")
	}

	out, err := store.Outcome(intentID, id)
	if err != nil {
		return intentspb.State_STATE_UNKNOWN, err
	}

	return out.GetState(), nil
}
