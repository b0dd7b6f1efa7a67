package tunnel

import (
	"sync"
	"time"

	"go.uber.org/zap"
	"golang.org/x/time/rate"

	"github.com/outpost-metal/outpost/edge/limits"
)

// eventGate passes tunnel events to the journal (and the log) at a bounded rate, coalescing what is over it:
//
//   - an open within the budget (a token bucket of EventBurst, EventRate per second) is passed on at once;
//   - an open over it is held back, oldest first, and passed on when the budget allows, if its tunnel is
//     still open then (marked late);
//   - a tunnel that closes while its open is held back produces no event at all (counted as coalesced);
//   - the close of a passed-on open is always passed on, so closes are bounded by opens.
//
// So the controller never sees an open without its close, learns of every tunnel that stays open (late
// rather than never, and the inventory at the next session start has them all), and a flood of short-lived
// tunnels costs the journal at most EventRate opens and their closes per second. Coalescing rather than
// dropping: a held-back open of a live agent is what the controller waits for before it can use the agent.
type eventGate struct {
	emit      func(open bool, ev Event, late bool)
	coalesced func()
	budget    *rate.Limiter
	clock     limits.Clock
	over      *limits.RejectLog

	// mu serializes the events passed on, so a tunnel's close never overtakes its late open.
	mu      sync.Mutex
	pending []held
	passed  map[any]bool // tunnels whose open was passed on
	stop    func() bool  // the scheduled flush of pending opens
	counts  gateCounts
}

type held struct {
	key any
	ev  Event
}

// gateCounts are the gate's totals, for metrics and tests.
type gateCounts struct {
	Passed, Late, Coalesced int64
}

func newEventGate(l Limits, clock limits.Clock, over *limits.RejectLog, emit func(open bool, ev Event, late bool), coalesced func()) *eventGate {
	return &eventGate{
		emit: emit, coalesced: coalesced, clock: clock, over: over,
		budget: rate.NewLimiter(rate.Limit(l.EventRate), l.EventBurst),
		passed: map[any]bool{},
	}
}

// opened is told that the tunnel key opened.
func (g *eventGate) opened(key any, ev Event) {
	g.mu.Lock()
	defer g.mu.Unlock()

	if len(g.pending) == 0 && g.budget.AllowN(g.clock.Now(), 1) {
		g.pass(key, ev, false)

		return
	}

	g.pending = append(g.pending, held{key: key, ev: ev})
	g.over.Note("held_back", zap.String("machine_id", ev.MachineID), zap.Stringer("remote", ev.RemoteAddr), zap.Int("held_back_now", len(g.pending)),
		zap.String("hint", "more agent tunnel opens than the journal budget: passed on later, or not at all if closed meanwhile"))
	g.schedule()
}

// closed is told that the tunnel key closed.
func (g *eventGate) closed(key any, ev Event) {
	g.mu.Lock()
	defer g.mu.Unlock()

	if g.passed[key] {
		delete(g.passed, key)
		g.emit(false, ev, false)

		return
	}

	for i, h := range g.pending {
		if h.key == key {
			g.pending = append(g.pending[:i], g.pending[i+1:]...)
			g.counts.Coalesced++
			g.coalesced()
			g.over.Note("coalesced", zap.String("machine_id", ev.MachineID), zap.Stringer("remote", ev.RemoteAddr),
				zap.String("hint", "an agent tunnel opened and closed while over the journal budget: neither is journaled"))

			break
		}
	}

	if len(g.pending) == 0 && g.stop != nil {
		g.stop()
		g.stop = nil
	}
}

func (g *eventGate) pass(key any, ev Event, late bool) {
	g.passed[key] = true
	g.counts.Passed++

	if late {
		g.counts.Late++
	}

	g.emit(true, ev, late)
}

// schedule arranges a flush for when the budget has the next token.
func (g *eventGate) schedule() {
	if g.stop != nil {
		return
	}

	wait := time.Duration(float64(time.Second) / float64(g.budget.Limit()))
	g.stop = g.clock.AfterFunc(wait, g.flush)
}

func (g *eventGate) flush() {
	g.mu.Lock()
	defer g.mu.Unlock()

	g.stop = nil

	for len(g.pending) > 0 && g.budget.AllowN(g.clock.Now(), 1) {
		h := g.pending[0]
		g.pending = g.pending[1:]
		g.pass(h.key, h.ev, true)
	}

	if len(g.pending) > 0 {
		g.schedule()
	}
}

func (g *eventGate) snapshot() (gateCounts, int) {
	g.mu.Lock()
	defer g.mu.Unlock()

	return g.counts, len(g.pending)
}
