package lifecycletest

import (
	"context"
	"sync"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	intentspb "github.com/outpost-metal/outpost/shared/api/intents"
)

// intentBook is the fake edge's record of intents, kept as the edge keeps its own (shared/api/intents): each
// intent ID carried out at most once, a repeat answered with the recorded outcome (a running one waited for),
// the call run apart from its caller, and an edge restart (RestartIntents) leaving what was running
// interrupted: never carried out again, its outcome unknown.
type intentBook struct {
	mu      sync.Mutex
	entries map[string]*intentEntry
}

type intentEntry struct {
	machine, op string
	state       intentspb.State
	err         error
	done        chan struct{} // closed when the call this edge ran ends
}

func newIntentBook() *intentBook { return &intentBook{entries: map[string]*intentEntry{}} }

// do carries out intent id (op on machine) with fn unless the book knows it.
func (b *intentBook) do(ctx context.Context, id, machine, op string, fn func(context.Context) error) error {
	if err := intentspb.CheckID(id); err != nil {
		return status.Error(codes.InvalidArgument, err.Error())
	}

	b.mu.Lock()

	e, known := b.entries[id]
	if !known {
		e = &intentEntry{machine: machine, op: op, state: intentspb.State_STATE_RUNNING, done: make(chan struct{})}
		b.entries[id] = e

		// apart from the caller's going away, not from its deadline (the edge's store does the same)
		runCtx, cancel := context.WithoutCancel(ctx), context.CancelFunc(func() {})
		if deadline, ok := ctx.Deadline(); ok {
			runCtx, cancel = context.WithDeadline(runCtx, deadline)
		}

		go func() {
			defer cancel()

			err := fn(runCtx)

			b.mu.Lock()
			if e.state == intentspb.State_STATE_RUNNING { // not interrupted by a restart meanwhile
				e.state, e.err = intentspb.State_STATE_DONE, err
				if err != nil {
					e.state = intentspb.State_STATE_FAILED
				}
			}
			b.mu.Unlock()
			close(e.done)
		}()
	}

	b.mu.Unlock()

	if e.machine != machine || e.op != op {
		return status.Errorf(codes.AlreadyExists, "intent %s is %s for machine %s", id, e.op, e.machine)
	}

	select {
	case <-e.done:
	case <-ctx.Done():
		return status.FromContextError(ctx.Err()).Err()
	}

	b.mu.Lock()
	defer b.mu.Unlock()

	switch e.state {
	case intentspb.State_STATE_DONE:
		return nil
	case intentspb.State_STATE_INTERRUPTED:
		return status.Errorf(codes.Aborted, "intent %s started before the edge restarted; whether it took effect is unknown", id)
	default:
		return e.err
	}
}

// restart interrupts what is running.
func (b *intentBook) restart() {
	b.mu.Lock()
	defer b.mu.Unlock()

	for _, e := range b.entries {
		if e.state == intentspb.State_STATE_RUNNING {
			e.state = intentspb.State_STATE_INTERRUPTED
		}
	}
}

func (b *intentBook) outcome(id, machine string) (intentspb.State, error) {
	b.mu.Lock()
	defer b.mu.Unlock()

	e, ok := b.entries[id]
	switch {
	case !ok:
		return intentspb.State_STATE_UNKNOWN, nil
	case e.machine != machine:
		return intentspb.State_STATE_UNKNOWN, status.Errorf(codes.AlreadyExists, "intent %s is for machine %s", id, e.machine)
	default:
		return e.state, nil
	}
}

// RestartIntents restarts the fake edge's intent record, as an edge restart does: intents that were running
// are interrupted.
func (f *FakeEdge) RestartIntents() { f.intents.restart() }

// LoseReplies makes the next n calls of machine id named call ("WipeDisks", "PowerCycle") reach the machine
// and then fail as a call whose reply an uplink cut lost does.
func (f *FakeEdge) LoseReplies(id, call string, n int) {
	f.mu.Lock()
	defer f.mu.Unlock()

	f.lose[id+" "+call] = n
}

// once runs do for machine id's call, through the intent record when the call carries an intent ID, and loses
// the reply when LoseReplies says so.
func (f *FakeEdge) once(ctx context.Context, id, call, method string, do func(context.Context) error) error {
	md, _ := metadata.FromOutgoingContext(ctx)

	intentID, err := intentspb.FromMetadata(md)
	if err != nil {
		return status.Error(codes.InvalidArgument, err.Error())
	}

	if intentID != "" {
		err = f.intents.do(ctx, intentID, id, method, do)
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

// IntentOutcome implements lifecycle.IntentClient.
func (f *FakeEdge) IntentOutcome(_ context.Context, site, id, intentID string) (intentspb.State, error) {
	f.mu.Lock()
	offline := f.offline[site]
	f.mu.Unlock()

	if offline {
		return intentspb.State_STATE_UNKNOWN, status.Error(codes.Unavailable, "site offline")
	}

	return f.intents.outcome(intentID, id)
}
