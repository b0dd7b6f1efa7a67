// Package tunnel terminates the machine agents' reverse gRPC tunnels (jhump/grpctunnel) on the edge
// and forwards the controller's /management.AgentService/* calls to the tunnel of the machine named
// in the call's machine-id metadata.
package tunnel

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"slices"
	"sync"
	"time"

	"github.com/jhump/grpctunnel"
	"github.com/jhump/grpctunnel/tunnelpb"
	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/zap"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/keepalive"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/peer"
	"google.golang.org/grpc/status"

	"github.com/outpost-metal/outpost/edge/limits"
	bootpb "github.com/outpost-metal/outpost/shared/api/boot"
	"github.com/outpost-metal/outpost/shared/metal"
)

// Event describes a tunnel opening or closing.
type Event struct {
	// MachineID is the normalized (lower-case) SMBIOS UUID of the machine.
	MachineID string
	// RemoteAddr is the source address of the tunnel's connection.
	RemoteAddr netip.AddrPort
	// SeenAddr is the address DHCP or PXE last saw for this machine (invalid when unknown).
	SeenAddr netip.Addr
	// AddressMismatch is set when SeenAddr is known and differs from the tunnel's source address.
	AddressMismatch bool
	// Time is when the tunnel opened or closed.
	Time time.Time
}

// EventSink receives tunnel events; the edge journals them for the controller.
// Its methods are called synchronously on the tunnel's goroutine and must not block.
type EventSink interface {
	// TunnelOpened is called once a machine's agent has opened its tunnel.
	TunnelOpened(Event)
	// TunnelClosed is called when that tunnel has gone.
	TunnelClosed(Event)
}

// Refusal is an agent tunnel refused for a machine that booted through this edge (see RefusalSink).
type Refusal struct {
	MachineID string
	// Reason is contested machine ID, source not the boot address or duplicate machine ID (never no boot
	// evidence: those are not reported).
	Reason     bootpb.TunnelRefusal
	RemoteAddr netip.AddrPort
	Time       time.Time
}

// RefusalSink is an EventSink that also takes refused tunnels of machines the edge knows: another host, or
// a clone, asking for a machine's tunnel. Each machine and reason reaches it at most once a minute; tunnels
// of machines with no boot evidence here never do. Called synchronously; must not block.
type RefusalSink interface {
	TunnelRefused(Refusal)
}

// AddressBook tells which address DHCP or PXE last saw for a machine.
type AddressBook interface {
	// SeenAddr returns the address last seen for the machine, if any.
	SeenAddr(machineID metal.ID) (netip.Addr, bool)
}

// Options configures a Server.
type Options struct {
	// Logger is required.
	Logger *zap.Logger
	// Events receives tunnel open and close events (optional).
	Events EventSink
	// Addresses compares each tunnel's source with what DHCP/PXE saw (optional).
	Addresses AddressBook
	// Now is the clock (default time.Now).
	Now func() time.Time
	// DefaultCallTimeout bounds a proxied call whose caller set no deadline (default 10 minutes).
	DefaultCallTimeout time.Duration
	// Limits bounds tunnels and connections (default DefaultLimits(); see Limits.Validate).
	Limits Limits
	// Binding is what a tunnel must prove (default BindAddress, with Evidence).
	Binding Binding
	// Evidence tells what each machine's boot showed (the address the edge served its boot script to).
	Evidence Evidence
	// Clock paces the journaled events and the refusal log (default: the wall clock).
	Clock limits.Clock
	// Intents carries out agent calls that carry an intent ID at most once (optional: without it such calls
	// are forwarded like any other).
	Intents IntentRunner
}

// Server is the agent tunnel endpoint and the agent call proxy.
type Server struct {
	log      *zap.Logger
	sink     EventSink
	book     AddressBook
	now      func() time.Time
	timeout  time.Duration
	intents  IntentRunner
	handler  *grpctunnel.TunnelServiceHandler
	rejected *prometheus.CounterVec
	failures *prometheus.CounterVec
	events   *prometheus.CounterVec

	limits  Limits
	binder  *binder
	tunnels *limiter
	conns   *limits.Limiter
	gate    *eventGate
	// reported is when each machine and refusal reason last reached the sink (reportRefusal).
	reportMu sync.Mutex
	reported map[string]time.Time
	refusals *limits.RejectLog // tunnels and connections refused
	overflow *limits.RejectLog // tunnel events over the journal budget
}

// New returns a Server.
func New(opts Options) *Server {
	if opts.Logger == nil {
		panic("tunnel: Options.Logger is required")
	}

	if opts.Limits == (Limits{}) {
		opts.Limits = DefaultLimits()
	}

	if err := opts.Limits.Validate(); err != nil {
		panic("tunnel: Options.Limits: " + err.Error()) // callers validate their configuration first
	}

	if opts.Clock == nil {
		opts.Clock = limits.SystemClock()
	}

	log := opts.Logger.With(zap.String("component", "tunnel"))

	s := &Server{
		log:      log,
		sink:     opts.Events,
		reported: map[string]time.Time{},
		limits:   opts.Limits,
		binder:   newBinder(opts.Binding, opts.Evidence),
		conns:    limits.New(limits.Config{Total: opts.Limits.MaxConns, PerSource: opts.Limits.MaxConnsPerSource}),
		refusals: limits.NewRejectLog(log, "agent tunnel refused", limits.DefaultLogInterval, opts.Clock),
		overflow: limits.NewRejectLog(log, "agent tunnel events over the journal budget", limits.DefaultLogInterval, opts.Clock),
		book:     opts.Addresses,
		now:      opts.Now,
		timeout:  opts.DefaultCallTimeout,
		intents:  opts.Intents,
		rejected: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "outpost_edge_agent_tunnels_rejected_total",
			Help: "Agent tunnels refused, by reason.",
		}, []string{"reason"}),
		failures: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "outpost_edge_agent_calls_failed_total",
			Help: "Proxied agent calls that failed at the edge, by reason.",
		}, []string{"reason"}),
		events: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "outpost_edge_agent_tunnel_events_total",
			Help: "Agent tunnel events, by what became of them (opened, closed, opened_late: journaled; coalesced: an open and its close over the budget, neither journaled).",
		}, []string{"event"}),
	}

	s.tunnels = newLimiter(opts.Limits, s.refusals, func(reason string) { s.rejected.WithLabelValues(reason).Inc() })
	s.gate = newEventGate(opts.Limits, opts.Clock, s.overflow, s.emit, func() { s.events.WithLabelValues("coalesced").Inc() })

	if s.now == nil {
		s.now = time.Now
	}

	if s.timeout <= 0 {
		s.timeout = 10 * time.Minute
	}

	s.handler = grpctunnel.NewTunnelServiceHandler(grpctunnel.TunnelServiceHandlerOptions{
		OnReverseTunnelOpen:  s.opened,
		OnReverseTunnelClose: s.closed,
		AffinityKey:          affinityKey,
	})

	return s
}

// Collectors returns the Server's prometheus metrics for the caller to register.
func (s *Server) Collectors() []prometheus.Collector {
	return []prometheus.Collector{
		s.rejected, s.failures, s.events,
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "outpost_edge_agent_tunnels_open", Help: "Agent tunnels open now."},
			func() float64 { return float64(s.tunnels.lim.Stats().Held) }),
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "outpost_edge_agent_tunnel_events_held_back", Help: "Agent tunnel opens waiting for the journal budget."},
			func() float64 { _, n := s.gate.snapshot(); return float64(n) }),
		s.conns.Collector("outpost_edge_agent_connections", "Agent API connections"),
	}
}

// LimitStats returns the counts of the tunnel limiter (tunnels held, refused) and the connection limiter.
func (s *Server) LimitStats() (tunnels, conns limits.Stats) {
	return s.tunnels.lim.Stats(), s.conns.Stats()
}

// Register registers the TunnelService (reverse tunnels only) on r.
func (s *Server) Register(r grpc.ServiceRegistrar) {
	tunnelpb.RegisterTunnelServiceServer(r, guardedService{inner: s.handler.Service(), s: s})
}

// Serve serves the TunnelService over plain HTTP/2 (h2c) on ln until ctx ends.
func (s *Server) Serve(ctx context.Context, ln net.Listener) error {
	return s.serve(ctx, ln)
}

// ServeTLS serves the TunnelService over TLS with cfg on ln until ctx ends.
func (s *Server) ServeTLS(ctx context.Context, ln net.Listener, cfg *tls.Config) error {
	return s.serve(ctx, ln, grpc.Creds(credentials.NewTLS(cfg)))
}

func (s *Server) serve(ctx context.Context, ln net.Listener, opts ...grpc.ServerOption) error {
	defer s.refusals.Flush()
	defer s.overflow.Flush()

	ln = limits.NewListener(ln, s.conns, s.refusals, map[limits.Reason]string{
		limits.PerSource: fmt.Sprintf("this address already holds %d agent API connections", s.limits.MaxConnsPerSource),
		limits.Total:     fmt.Sprintf("%d agent API connections open (--agent-max-conns); raise it if real agents are refused", s.limits.MaxConns),
	})

	opts = append(opts,
		// A connection that never completes its HTTP/2 handshake, or that carries no tunnel for long, goes.
		grpc.ConnectionTimeout(10*time.Second),
		// An agent needs one stream; a few more for a reconnect. Refused streams cost a goroutine each meanwhile.
		grpc.MaxConcurrentStreams(16),
		// A dead agent (machine powered off) must free its tunnel within seconds.
		grpc.KeepaliveParams(keepalive.ServerParameters{Time: 10 * time.Second, Timeout: 5 * time.Second, MaxConnectionIdle: 2 * time.Minute}),
		grpc.KeepaliveEnforcementPolicy(keepalive.EnforcementPolicy{MinTime: 5 * time.Second, PermitWithoutStream: true}),
		// Stop returns only once every tunnel handler has finished (and reported its close), so nothing of
		// the server runs after Serve returned.
		grpc.WaitForHandlers(true),
	)

	srv := grpc.NewServer(opts...)
	s.Register(srv)

	errCh := make(chan error, 1)

	go func() { errCh <- srv.Serve(ln) }()

	select {
	case <-ctx.Done():
		s.handler.InitiateShutdown()
		srv.Stop()

		if err := <-errCh; err != nil && !errors.Is(err, grpc.ErrServerStopped) {
			return fmt.Errorf("serve agent tunnels on %s: %w", ln.Addr(), err)
		}

		return nil
	case err := <-errCh:
		srv.Stop() // the listener failed: end the tunnels too, so nothing runs after Serve returns

		if err != nil && !errors.Is(err, grpc.ErrServerStopped) {
			return fmt.Errorf("serve agent tunnels on %s: %w", ln.Addr(), err)
		}

		return nil
	}
}

// Channel returns the direct channel to a machine's agent (a call on it goes through the tunnel
// without the proxy). Calls fail with Unavailable when the machine has no tunnel.
func (s *Server) Channel(machineID string) grpc.ClientConnInterface {
	return s.handler.KeyAsChannel(keyOf(machineID))
}

// keyOf is the tunnel key of the machine a caller names (leniently, as peers write IDs): its metal.ID, as
// affinityKey keys tunnels; a malformed ID keys no tunnel.
func keyOf(machineID string) metal.ID {
	id, err := metal.ParsePeerID(machineID)
	if err != nil {
		return ""
	}

	return id
}

// Open returns the machine IDs with an agent tunnel open now, sorted.
func (s *Server) Open() []string {
	seen := map[metal.ID]bool{}

	var out []string

	for _, ch := range s.handler.AllReverseTunnels() {
		if id, ok := affinityKey(ch).(metal.ID); ok && !seen[id] && !closed(ch) {
			seen[id] = true
			out = append(out, id.String())
		}
	}

	slices.Sort(out)

	return out
}

func closed(ch grpctunnel.TunnelChannel) bool {
	select {
	case <-ch.Done():
		return true
	default:
		return false
	}
}

// EndBoot closes machineID's agent tunnel if it was opened before t, when the edge powered the machine off or
// reset it at t: the OS that opened the tunnel is gone. A machine switched off sends nothing, so without this
// its tunnel would stay open on a connection no one answers until keepalive ends it (15 s and more): meanwhile
// the controller would believe the agent runs (and send it calls that hang), and the next boot's agent would
// be refused as a duplicate. A tunnel opened at or after t (the next boot's) is left alone.
func (s *Server) EndBoot(machineID string, t time.Time) {
	id := keyOf(machineID)

	remote, ok := s.binder.boundBefore(id, t)
	if !ok {
		return
	}

	for _, ch := range s.handler.AllReverseTunnels() {
		if affinityKey(ch) == id && remoteAddr(ch.Context()) == remote {
			s.log.Info("agent tunnel ended: the edge powered its machine off or reset it", zap.Stringer("machine_id", id), zap.Stringer("remote", remote))
			ch.Close()
		}
	}
}

// Connected reports whether the machine's agent has a tunnel open.
func (s *Server) Connected(machineID string) bool {
	return s.handler.KeyAsChannel(keyOf(machineID)).Ready()
}

// guardedService refuses forward tunnels and reverse tunnels without a valid machine-id before
// grpctunnel registers them.
type guardedService struct {
	tunnelpb.UnimplementedTunnelServiceServer

	inner tunnelpb.TunnelServiceServer
	s     *Server
}

func (g guardedService) OpenTunnel(tunnelpb.TunnelService_OpenTunnelServer) error {
	g.s.rejected.WithLabelValues("forward_tunnel").Inc()

	return status.Error(codes.Unimplemented, "forward tunnels are not offered")
}

func (g guardedService) OpenReverseTunnel(stream tunnelpb.TunnelService_OpenReverseTunnelServer) error {
	md, _ := metadata.FromIncomingContext(stream.Context())

	if _, err := MachineIDFromMetadata(md); err != nil {
		g.s.rejected.WithLabelValues("machine_id").Inc()
		g.s.log.Debug("agent tunnel refused", zap.Stringer("remote", remoteAddr(stream.Context())), zap.Error(err))

		return status.Errorf(codes.InvalidArgument, "open agent tunnel: %v", err)
	}

	id, _ := MachineIDFromMetadata(md) //nolint:errcheck // checked above

	release, err := g.s.tunnels.admit(stream.Context())
	if err != nil {
		return err
	}
	defer release()

	// one live tunnel per machine, bound to its boot: only then does grpctunnel route calls to it
	unbind, err := g.s.admitBound(stream.Context(), id)
	if err != nil {
		return err
	}
	defer unbind()

	return g.inner.OpenReverseTunnel(stream)
}

// MachineIDFromMetadata returns the machine-id from md, parsed (metal.ParseID), or metal.ErrMalformedID.
func MachineIDFromMetadata(md metadata.MD) (metal.ID, error) {
	vals := md.Get(metal.MetadataKey)
	if len(vals) != 1 {
		return "", fmt.Errorf("%w: want exactly one %s value, got %d", metal.ErrMalformedID, metal.MetadataKey, len(vals))
	}

	return metal.ParseID(vals[0])
}

func affinityKey(ch grpctunnel.TunnelChannel) any {
	md, _ := metadata.FromIncomingContext(ch.Context())

	id, err := MachineIDFromMetadata(md)
	if err != nil {
		// Unreachable: guardedService refused such tunnels already.
		return nil
	}

	return id
}

func (s *Server) event(ch grpctunnel.TunnelChannel) Event {
	id, _ := affinityKey(ch).(metal.ID)

	ev := Event{MachineID: id.String(), RemoteAddr: remoteAddr(ch.Context()), Time: s.now()}

	if s.book != nil {
		if seen, ok := s.book.SeenAddr(id); ok {
			ev.SeenAddr = seen
			ev.AddressMismatch = seen.Unmap() != ev.RemoteAddr.Addr().Unmap()
		}
	}

	return ev
}

func (s *Server) opened(ch grpctunnel.TunnelChannel) { s.gate.opened(ch, s.event(ch)) }

func (s *Server) closed(ch grpctunnel.TunnelChannel) { s.gate.closed(ch, s.event(ch)) }

// emit logs and journals an event the gate passed on (at most EventBurst at once, EventRate per second).
func (s *Server) emit(open bool, ev Event, late bool) {
	fields := []zap.Field{zap.String("machine_id", ev.MachineID), zap.Stringer("remote", ev.RemoteAddr)}

	switch {
	case !open:
		s.events.WithLabelValues("closed").Inc()
		s.log.Info("agent tunnel closed", fields...)
	case ev.AddressMismatch:
		fields = append(fields, zap.Stringer("seen_addr", ev.SeenAddr))
		s.log.Warn("agent tunnel opened from an address other than DHCP/PXE saw", fields...)
	default:
		s.log.Info("agent tunnel opened", append(fields, zap.Bool("late", late))...)
	}

	if open {
		s.events.WithLabelValues(map[bool]string{false: "opened", true: "opened_late"}[late]).Inc()
	}

	if s.sink == nil {
		return
	}

	if open {
		s.sink.TunnelOpened(ev)
	} else {
		s.sink.TunnelClosed(ev)
	}
}

func remoteAddr(ctx context.Context) netip.AddrPort {
	p, ok := peer.FromContext(ctx)
	if !ok || p.Addr == nil {
		return netip.AddrPort{}
	}

	ap, err := netip.ParseAddrPort(p.Addr.String())
	if err != nil {
		return netip.AddrPort{}
	}

	return ap
}
