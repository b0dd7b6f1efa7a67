package fleet

import (
	"context"
	"sync"
	"time"

	"go.uber.org/zap"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/outpost-metal/outpost/edge/bmc"
	bmcpb "github.com/outpost-metal/outpost/shared/api/bmc"
)

// MethodWatchPoll is a PowerStatus the edge's own watcher asks (not the controller).
const MethodWatchPoll = "WatchPoll"

// edgeWatch is the real edge/bmc Watcher (its scheduling: interval, jitter, concurrency, change reports) asking
// the simulated BMCs, through the same per-BMC turn and rate limit as the controller's calls, plus what the
// fleet measures of the watch lists the controller sends.
type edgeWatch struct {
	w *bmc.Watcher

	mu sync.Mutex
	// watched is how many BMCs the last list named; lists counts the lists received; firstList is the first
	// one at or after mark (see markFrom).
	watched   int
	lists     int
	mark      time.Time
	firstList time.Time
}

// watchPoller asks a simulated BMC for the watcher.
type watchPoller struct{ svc *BMCService }

func (p watchPoller) PowerStatus(ctx context.Context, t bmc.Target, c bmc.Credentials) (bool, error) {
	// the credentials go with the target, as the edge's Manager has them: a BMC asked without a user refuses
	return p.svc.powerStatus(ctx, &bmcpb.Target{ // a port
		Host: t.Host, IpmiPort: uint32(t.IPMIPort), Username: c.Username, Password: c.Password,
	}, MethodWatchPoll)
}

func newEdgeWatch(svc *BMCService, sink bmc.PowerSink, cfg bmc.WatcherConfig) *edgeWatch {
	return &edgeWatch{w: bmc.NewWatcher(watchPoller{svc}, sink, cfg, zap.NewNop(), time.Now)}
}

func (e *edgeWatch) run(ctx context.Context) error { return e.w.Run(ctx) }

func (e *edgeWatch) serve(req *bmcpb.WatchRequest) (*bmcpb.WatchResponse, error) {
	resp, err := e.w.Serve(req)
	if err != nil {
		return nil, err
	}

	e.mu.Lock()
	defer e.mu.Unlock()

	e.watched = int(resp.GetWatching())
	e.lists++

	if !e.mark.IsZero() && e.firstList.IsZero() {
		e.firstList = time.Now()
	}

	return resp, nil
}

// markFrom starts watching for the first watch list received at or after t (a restarted controller's).
func (e *edgeWatch) markFrom(t time.Time) {
	e.mu.Lock()
	defer e.mu.Unlock()

	e.mark, e.firstList = t, time.Time{}
}

// listState returns how many BMCs are watched, how many lists came, and the first since the mark.
func (e *edgeWatch) listState() (watched, lists int, firstAfterMark time.Time) {
	e.mu.Lock()
	defer e.mu.Unlock()

	return e.watched, e.lists, e.firstList
}

// Watch implements bmcpb.BMCServer as edge/bmc's Service does with a Watcher.
func (s *BMCService) Watch(_ context.Context, req *bmcpb.WatchRequest) (*bmcpb.WatchResponse, error) {
	if s.watcher == nil {
		return nil, status.Error(codes.Unimplemented, "this edge does not watch BMCs")
	}

	return s.watcher.serve(req)
}
