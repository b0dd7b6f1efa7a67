package bmc

import (
	"context"
	"math/rand/v2"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/zap"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	bmcpb "github.com/outpost-metal/outpost/shared/api/bmc"
)

// PowerSink is told about every change of a watched machine's power state (and its first), in order per
// machine; reason says why the state is unknown. It must not block (the edge's journal recorder).
type PowerSink interface {
	PowerChanged(machineID string, state bmcpb.PowerState, reason string)
}

// WatcherConfig tunes a Watcher.
type WatcherConfig struct {
	// Interval is how often each BMC is asked (spread with jitter).
	Interval time.Duration
	// Concurrency bounds the BMCs asked at once (each BMC is asked in turn by the Manager anyway).
	Concurrency int
	// MaxTargets bounds the BMCs watched (a controller sending more is refused the rest).
	MaxTargets int
}

// DefaultWatcher returns the watcher defaults: every BMC every 20 s, 32 at once, up to 20,000 BMCs.
func DefaultWatcher() WatcherConfig {
	return WatcherConfig{Interval: 20 * time.Second, Concurrency: 32, MaxTargets: 20000}
}

// PowerReader answers a BMC's power state (the Manager; a simulated fleet's BMCs in hack/fleet).
type PowerReader interface {
	PowerStatus(ctx context.Context, t Target, c Credentials) (on bool, err error)
}

// Watcher polls the power state of the BMCs the controller asks it to watch, from the site itself, and
// reports changes to a PowerSink: the controller never polls BMCs across the WAN, and power state stays fresh
// (journaled, delivered in order) while the uplink is down. A BMC that does not answer costs one of
// Concurrency slots for at most the Manager's call timeout; the others go on.
type Watcher struct {
	m    PowerReader
	sink PowerSink
	cfg  WatcherConfig
	log  *zap.Logger
	now  func() time.Time

	mu      sync.Mutex
	targets map[string]*watched // by machine ID
	wake    chan struct{}

	polls *prometheus.CounterVec
}

type watched struct {
	t    Target
	c    Credentials
	last bmcpb.PowerState
	next time.Time
	busy bool
}

// NewWatcher returns a Watcher asking m, reporting to sink.
func NewWatcher(m PowerReader, sink PowerSink, cfg WatcherConfig, log *zap.Logger, now func() time.Time) *Watcher {
	if cfg.Interval <= 0 || cfg.Concurrency <= 0 || cfg.MaxTargets <= 0 {
		cfg = DefaultWatcher()
	}

	return &Watcher{
		m: m, sink: sink, cfg: cfg, log: log.With(zap.String("component", "bmc_watcher")), now: now,
		targets: map[string]*watched{}, wake: make(chan struct{}, 1),
		polls: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "outpost_edge_bmc_watch_polls_total", Help: "Power-state polls of watched BMCs, by result (on, off, unknown).",
		}, []string{"result"}),
	}
}

// Collectors returns the watcher's metrics.
func (w *Watcher) Collectors() []prometheus.Collector { return []prometheus.Collector{w.polls} }

// Target is one BMC to watch.
type WatchTarget struct {
	MachineID   string
	Target      Target
	Credentials Credentials
}

// Serve takes a controller's watch list (the BMC service's Watch) and answers with what is watched and the
// states known now.
func (w *Watcher) Serve(req *bmcpb.WatchRequest) (*bmcpb.WatchResponse, error) {
	targets := make([]WatchTarget, 0, len(req.GetTargets()))

	for _, t := range req.GetTargets() {
		if t.GetMachineId() == "" || t.GetHost() == "" {
			return nil, status.Error(codes.InvalidArgument, "watch: every target needs a machine id and a host")
		}

		target, creds := fromProto(t)
		targets = append(targets, WatchTarget{MachineID: t.GetMachineId(), Target: target, Credentials: creds})
	}

	resp := &bmcpb.WatchResponse{Watching: uint32(w.Set(targets))} // bounded by MaxTargets

	for id, state := range w.Known() {
		resp.Known = append(resp.Known, bmcpb.NewWatchedPower(id, state))
	}

	return resp, nil
}

// Known returns the last state polled for each watched machine (machines not polled yet are left out).
func (w *Watcher) Known() map[string]bmcpb.PowerState {
	w.mu.Lock()
	defer w.mu.Unlock()

	out := make(map[string]bmcpb.PowerState, len(w.targets))

	for id, t := range w.targets {
		if t.last != bmcpb.PowerState_POWER_STATE_UNSPECIFIED {
			out[id] = t.last
		}
	}

	return out
}

// Set replaces the watched BMCs; a machine watched before keeps its last state (no repeated report) unless
// its BMC changed. It returns how many are watched (at most MaxTargets).
func (w *Watcher) Set(targets []WatchTarget) int {
	w.mu.Lock()
	defer w.mu.Unlock()

	next := make(map[string]*watched, len(targets))
	now := w.now()

	for _, t := range targets {
		if len(next) >= w.cfg.MaxTargets {
			w.log.Warn("more BMCs to watch than the edge takes; the rest are not watched", zap.Int("max", w.cfg.MaxTargets),
				zap.Int("asked", len(targets)))

			break
		}

		if cur, ok := w.targets[t.MachineID]; ok && cur.t == t.Target && cur.c == t.Credentials {
			next[t.MachineID] = cur

			continue
		}

		// new or changed: asked soon, spread over the first interval so a full list does not burst
		next[t.MachineID] = &watched{t: t.Target, c: t.Credentials, next: now.Add(w.spread())}
	}

	w.targets = next

	select {
	case w.wake <- struct{}{}:
	default:
	}

	return len(next)
}

func (w *Watcher) spread() time.Duration {
	return rand.N(w.cfg.Interval/4 + 1) // scheduling jitter
}

// Run polls until ctx ends; it returns nil.
func (w *Watcher) Run(ctx context.Context) error {
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

			wg.Add(1)

			go func() {
				defer wg.Done()
				defer func() { <-slots }()

				w.poll(ctx, due)
			}()
		}
	}
}

// due marks and returns the machines whose poll is due.
func (w *Watcher) due() []string {
	w.mu.Lock()
	defer w.mu.Unlock()

	now := w.now()

	var out []string

	for id, t := range w.targets {
		if !t.busy && !now.Before(t.next) {
			t.busy = true
			out = append(out, id)
		}
	}

	return out
}

func (w *Watcher) release(id string) {
	w.mu.Lock()
	defer w.mu.Unlock()

	if t, ok := w.targets[id]; ok {
		t.busy = false
	}
}

func (w *Watcher) poll(ctx context.Context, id string) {
	w.mu.Lock()
	t, ok := w.targets[id]

	var (
		target Target
		creds  Credentials
	)

	if ok {
		target, creds = t.t, t.c
	}
	w.mu.Unlock()

	if !ok {
		return
	}

	state, reason := bmcpb.PowerState_POWER_STATE_OFF, ""

	on, err := w.m.PowerStatus(ctx, target, creds)

	switch {
	case ctx.Err() != nil:
		w.release(id)

		return
	case err != nil:
		state, reason = bmcpb.PowerState_POWER_STATE_UNKNOWN, err.Error()
	case on:
		state = bmcpb.PowerState_POWER_STATE_ON
	}

	w.polls.WithLabelValues(state.Name()).Inc()

	w.mu.Lock()
	cur, still := w.targets[id]
	report := still && cur == t && cur.last != state

	if still && cur == t {
		cur.last, cur.busy = state, false
		cur.next = w.now().Add(w.cfg.Interval - w.cfg.Interval/8 + rand.N(w.cfg.Interval/4+1)) // jitter
	}
	w.mu.Unlock()

	if report {
		w.sink.PowerChanged(id, state, reason)
	}
}
