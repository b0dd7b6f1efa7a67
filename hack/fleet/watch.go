package fleet

import (
	"context"
	"math/rand/v2"
	"sync"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	"github.com/outpost-metal/outpost/edge/bmc"
	bmcpb "github.com/outpost-metal/outpost/shared/api/bmc"
)

// MethodWatchPoll is a PowerStatus the edge's own watcher asks (not the controller).
const MethodWatchPoll = "WatchPoll"

// powerSink takes the watcher's power changes (the edge's journal recorder).
type powerSink interface {
	PowerChanged(machineID, state, reason string)
}

// powerWatcher is edge/bmc's Watcher over the simulated BMCs: it polls the BMCs the controller asked the edge
// to watch, every Interval with the same jitter and Concurrency, through the same per-BMC turn and rate limit as
// the controller's calls, and journals every change. (edge/bmc.Watcher takes a *bmc.Manager, which speaks IPMI
// only; this is its scheduling, kept line for line.)
type powerWatcher struct {
	svc  *BMCService
	sink powerSink
	cfg  bmc.WatcherConfig

	mu      sync.Mutex
	targets map[string]*watchedBMC
	wake    chan struct{}

	// lists counts the watch lists received; lastList is when the last one came and mark the time from which
	// firstList is the first (see markFrom).
	lists     int
	mark      time.Time
	firstList time.Time
}

type watchedBMC struct {
	t    *bmcpb.Target
	last string
	next time.Time
	busy bool
}

func newPowerWatcher(svc *BMCService, sink powerSink, cfg bmc.WatcherConfig) *powerWatcher {
	return &powerWatcher{svc: svc, sink: sink, cfg: cfg, targets: map[string]*watchedBMC{}, wake: make(chan struct{}, 1)}
}

func (w *powerWatcher) spread() time.Duration { return rand.N(w.cfg.Interval/4 + 1) } //nolint:gosec // scheduling jitter

// set replaces the watched BMCs as edge/bmc.Watcher.Set does.
func (w *powerWatcher) set(targets []*bmcpb.Target) int {
	w.mu.Lock()
	defer w.mu.Unlock()

	next := make(map[string]*watchedBMC, len(targets))
	now := time.Now()

	for _, t := range targets {
		if len(next) >= w.cfg.MaxTargets {
			break
		}

		if cur, ok := w.targets[t.GetMachineId()]; ok && proto.Equal(cur.t, t) {
			next[t.GetMachineId()] = cur

			continue
		}

		next[t.GetMachineId()] = &watchedBMC{t: t, next: now.Add(w.spread())}
	}

	w.targets = next
	w.lists++

	if !w.mark.IsZero() && w.firstList.IsZero() {
		w.firstList = now
	}

	select {
	case w.wake <- struct{}{}:
	default:
	}

	return len(next)
}

func (w *powerWatcher) known() []*bmcpb.WatchedPower {
	w.mu.Lock()
	defer w.mu.Unlock()

	out := make([]*bmcpb.WatchedPower, 0, len(w.targets))

	for id, t := range w.targets {
		if t.last != "" {
			out = append(out, &bmcpb.WatchedPower{MachineId: id, State: t.last})
		}
	}

	return out
}

// markFrom starts watching for the first watch list received at or after t (a restarted controller's).
func (w *powerWatcher) markFrom(t time.Time) {
	w.mu.Lock()
	defer w.mu.Unlock()

	w.mark, w.firstList = t, time.Time{}
}

// listState returns how many BMCs are watched, how many lists came, and the first since the mark.
func (w *powerWatcher) listState() (watched, lists int, firstAfterMark time.Time) {
	w.mu.Lock()
	defer w.mu.Unlock()

	return len(w.targets), w.lists, w.firstList
}

func (w *powerWatcher) run(ctx context.Context) error {
	slots := make(chan struct{}, w.cfg.Concurrency)
	tick := time.NewTicker(time.Second)

	defer tick.Stop()

	var wg sync.WaitGroup
	defer wg.Wait()

	for {
		select {
		case <-ctx.Done():
			return nil
		case <-tick.C:
		case <-w.wake:
		}

		for _, due := range w.due() {
			select {
			case slots <- struct{}{}:
			case <-ctx.Done():
				w.release(due)

				return nil
			}

			wg.Go(func() {
				defer func() { <-slots }()

				w.poll(ctx, due)
			})
		}
	}
}

func (w *powerWatcher) due() []string {
	w.mu.Lock()
	defer w.mu.Unlock()

	now := time.Now()

	var out []string

	for id, t := range w.targets {
		if !t.busy && !now.Before(t.next) {
			t.busy = true
			out = append(out, id)
		}
	}

	return out
}

func (w *powerWatcher) release(id string) {
	w.mu.Lock()
	defer w.mu.Unlock()

	if t, ok := w.targets[id]; ok {
		t.busy = false
	}
}

func (w *powerWatcher) poll(ctx context.Context, id string) {
	w.mu.Lock()
	t, ok := w.targets[id]
	w.mu.Unlock()

	if !ok {
		return
	}

	state, reason := bmc.PowerStateOff, ""

	on, err := w.svc.powerStatus(ctx, t.t, MethodWatchPoll)

	switch {
	case ctx.Err() != nil:
		w.release(id)

		return
	case err != nil:
		state, reason = bmc.PowerStateUnknown, err.Error()
	case on:
		state = bmc.PowerStateOn
	}

	w.mu.Lock()
	cur, still := w.targets[id]
	report := still && cur == t && cur.last != state

	if still && cur == t {
		cur.last, cur.busy = state, false
		cur.next = time.Now().Add(w.cfg.Interval - w.cfg.Interval/8 + rand.N(w.cfg.Interval/4+1)) //nolint:gosec // jitter
	}
	w.mu.Unlock()

	if report {
		w.sink.PowerChanged(id, state, reason)
	}
}

// Watch implements bmcpb.BMCServer as edge/bmc's Service does with a Watcher.
func (s *BMCService) Watch(_ context.Context, req *bmcpb.WatchRequest) (*bmcpb.WatchResponse, error) {
	if s.watcher == nil {
		return nil, status.Error(codes.Unimplemented, "this edge does not watch BMCs")
	}

	for _, t := range req.GetTargets() {
		if t.GetMachineId() == "" || t.GetHost() == "" {
			return nil, status.Error(codes.InvalidArgument, "watch: every target needs a machine id and a host")
		}
	}

	n := s.watcher.set(req.GetTargets())

	return &bmcpb.WatchResponse{Watching: uint32(n), Known: s.watcher.known()}, nil //nolint:gosec // bounded by MaxTargets
}
