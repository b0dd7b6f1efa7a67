package machineaccess

import (
	"context"
	"errors"
	"fmt"
	"io"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/zap"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	bmcpb "github.com/outpost-metal/outpost/shared/api/bmc"
	consolepb "github.com/outpost-metal/outpost/shared/api/console"
)

// consoleInputFrame bounds one frame of typed bytes, as the edge does (edge/bmc.ConsoleInputFrame).
const consoleInputFrame = 1 << 10

// Targets tells a managed machine's site and BMC (machines.WatchLists).
type Targets interface {
	Target(machineID string) (site string, target *bmcpb.Target, ok bool)
}

// Consoles serves consolepb.ConsoleServer on the admin socket: an operator's console of a machine, carried to
// the machine's site's edge with its BMC and credentials, which the operator never sees. Every session is
// logged (who, when, read or write, bytes each way). Output flows at the operator's pace: a slow reader holds
// the stream back, and the edge drops and reports what its bounded queue cannot keep.
type Consoles struct {
	consolepb.UnimplementedConsoleServer

	access  *Client
	targets Targets
	log     *zap.Logger
	now     func() time.Time

	sessions *prometheus.CounterVec
	attached prometheus.Gauge
	bytes    *prometheus.CounterVec
}

// Results of an operator's console request, as counted in outpost_console_sessions_total: a fixed set.
const (
	consoleOK       = "ok"        // attached (counted when the session ends)
	consoleUnknown  = "unknown"   // no BMC is known for the machine
	consoleOffline  = "offline"   // the machine's site has no live uplink, or its edge did not take the call
	consoleRefused  = "refused"   // the edge refused it (another writer, a BMC without SOL, a dead BMC)
	consoleBadFrame = "bad_frame" // the first frame opened no machine
)

// NewConsoles returns the console service over the controller's edge connections.
func NewConsoles(access *Client, targets Targets, log *zap.Logger, now func() time.Time) *Consoles {
	return &Consoles{
		access: access, targets: targets, log: log.With(zap.String("component", "console")), now: now,
		sessions: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "outpost_console_sessions_total",
			Help: "Operators' serial console requests through the controller, by mode (read, write) and result (ok, unknown, offline, refused, bad_frame).",
		}, []string{"mode", "result"}),
		attached: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "outpost_console_sessions_attached",
			Help: "Serial console sessions attached through the controller now.",
		}),
		bytes: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "outpost_console_bytes_total",
			Help: "Serial console bytes relayed through the controller, by direction (out: to operators, in: typed).",
		}, []string{"direction"}),
	}
}

// Collectors returns the service's metrics.
func (s *Consoles) Collectors() []prometheus.Collector {
	return []prometheus.Collector{s.sessions, s.attached, s.bytes}
}

// mode is the label of a request's mode.
func mode(write bool) string {
	if write {
		return "write"
	}

	return "read"
}

// Attach implements consolepb.ConsoleServer.
func (s *Consoles) Attach(stream consolepb.Console_AttachServer) error {
	first, err := stream.Recv()
	if err != nil {
		return err
	}

	open := first.GetOpen()
	if open == nil || open.GetMachine() == "" {
		s.sessions.WithLabelValues(mode(open.GetWrite()), consoleBadFrame).Inc()

		return status.Error(codes.InvalidArgument, "console: the first frame must open a machine")
	}

	id, asked := open.GetMachine(), mode(open.GetWrite())

	site, target, ok := s.targets.Target(id)
	if !ok {
		s.sessions.WithLabelValues(asked, consoleUnknown).Inc()

		return status.Errorf(codes.NotFound, "console of %s: no bmc is known for it (a managed machine with a bmc configuration)", id)
	}

	conn, err := s.access.conn(site)
	if err != nil {
		s.sessions.WithLabelValues(asked, consoleOffline).Inc()

		return status.Errorf(codes.Unavailable, "console of %s: site %s is offline: %v", id, site, err)
	}

	ctx, cancel := context.WithCancel(stream.Context())
	defer cancel()

	edge, err := consolepb.NewConsoleClient(conn).Attach(ctx)
	if err != nil {
		s.sessions.WithLabelValues(asked, consoleOffline).Inc()

		return status.Errorf(codes.Unavailable, "console of %s at site %s: %v", id, site, err)
	}

	target.MachineId = id
	if err := edge.Send(&consolepb.Input{Kind: &consolepb.Input_Open{Open: &consolepb.Open{
		Machine: id, Target: target, Write: open.GetWrite(), Operator: open.GetOperator(),
	}}}); err != nil {
		s.sessions.WithLabelValues(asked, consoleOffline).Inc()

		return status.Errorf(codes.Unavailable, "console of %s at site %s: %v", id, site, err)
	}

	attached, err := edge.Recv()
	if err != nil {
		s.sessions.WithLabelValues(asked, consoleRefused).Inc()
		s.log.Info("console refused", zap.String("machine_id", id), zap.String("site", site),
			zap.String("operator", open.GetOperator()), zap.Bool("write", open.GetWrite()), zap.Error(err))

		return err // the edge's status: FailedPrecondition names the writer holding the console
	}

	start := s.now()
	s.log.Info("console attached", zap.String("machine_id", id), zap.String("site", site),
		zap.String("operator", open.GetOperator()), zap.Bool("write", attached.GetAttached().GetWrite()))

	granted := mode(attached.GetAttached().GetWrite())

	s.attached.Inc()

	var in, out atomic.Int64

	defer func() {
		s.attached.Dec()
		s.sessions.WithLabelValues(granted, consoleOK).Inc()
		s.bytes.WithLabelValues("out").Add(float64(out.Load()))
		s.bytes.WithLabelValues("in").Add(float64(in.Load()))
	}()

	if err := stream.Send(attached); err != nil {
		return nil // the operator left
	}

	typed := make(chan error, 1)

	// Not waited for: its Recv ends when Attach returns.
	go func() { typed <- s.relayInput(stream, edge, &in) }()

	err = s.relayOutput(stream, edge, &out)

	cancel()

	select {
	case e := <-typed:
		if err == nil {
			err = e
		}
	default:
	}

	s.log.Info("console session ended", zap.String("machine_id", id), zap.String("site", site),
		zap.String("operator", open.GetOperator()), zap.Bool("write", attached.GetAttached().GetWrite()),
		zap.Time("attached_at", start), zap.Duration("duration", s.now().Sub(start)),
		zap.Int64("bytes_out", out.Load()), zap.Int64("bytes_in", in.Load()), zap.Error(err))

	return err
}

// relayInput carries the operator's typing to the edge until the operator closes its side.
func (s *Consoles) relayInput(stream consolepb.Console_AttachServer, edge consolepb.Console_AttachClient, n *atomic.Int64) error {
	for {
		f, err := stream.Recv()
		if err != nil {
			edge.CloseSend() //nolint:errcheck // the edge ends the session on it

			return nil
		}

		data := f.GetData()
		if len(data) > consoleInputFrame {
			edge.CloseSend() //nolint:errcheck // ends the session

			return status.Errorf(codes.InvalidArgument, "console: an input frame of %d bytes (at most %d)", len(data), consoleInputFrame)
		}

		if len(data) == 0 {
			continue
		}

		if err := edge.Send(&consolepb.Input{Kind: &consolepb.Input_Data{Data: data}}); err != nil {
			return nil // the edge's end shows in relayOutput
		}

		n.Add(int64(len(data)))
	}
}

// relayOutput carries the edge's output to the operator, at the operator's pace.
func (s *Consoles) relayOutput(stream consolepb.Console_AttachServer, edge consolepb.Console_AttachClient, n *atomic.Int64) error {
	for {
		f, err := edge.Recv()
		if errors.Is(err, io.EOF) || stream.Context().Err() != nil {
			return nil
		}

		if err != nil {
			return fmt.Errorf("console stream from the edge: %w", err)
		}

		if err := stream.Send(f); err != nil {
			return nil // the operator left
		}

		n.Add(int64(len(f.GetData())))
	}
}
