package tunnel

import (
	"context"
	"net/netip"
	"sync"
	"time"

	"go.uber.org/zap"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	bootpb "github.com/outpost-metal/outpost/shared/api/boot"
	"github.com/outpost-metal/outpost/shared/metal"
)

// Binding is how much an agent's tunnel must prove before it speaks for a machine. The real metal agent sends
// nothing but its machine ID (no client certificate, no secret), so the proof is the edge's own: the address
// it served this machine's boot script to in this boot (BootBook).
type Binding string

// Bindings.
const (
	// BindAddress admits a tunnel for machine X only from the address this edge last served X's boot script
	// to (boot.ipxe?uuid=X&mac=..., in a boot whose DHCP or PXE request the edge answered where it answers
	// that MAC's; never a config fetch), only while X has no other tunnel, and never while two machines claim
	// X (clones, or a forger: two MACs asked for X's boot script lately).
	BindAddress Binding = "address"
	// BindOff admits the first tunnel for each machine ID whatever its source (machines that do not boot
	// through the edge; a trusted site network only). Still one tunnel per machine.
	BindOff Binding = "off"
)

// Evidence tells what this boot showed of a machine: the address the edge last served its boot script to,
// and whether two machines claimed its ID lately.
type Evidence interface {
	// BootAddr returns the address the edge last served machineID's boot script to.
	BootAddr(machineID metal.ID) (netip.Addr, bool)
	// Contested reports whether two machines (two MACs) asked for machineID's boot script lately.
	Contested(machineID metal.ID) bool
}

// binder keeps one live tunnel per machine ID, bound to the evidence of the machine's boot.
type binder struct {
	mode     Binding
	evidence Evidence

	mu    sync.Mutex
	bound map[metal.ID]binding // machine ID -> its one live tunnel
}

// binding is a machine's live tunnel: where it came from, and when it was bound.
type binding struct {
	remote netip.AddrPort
	at     time.Time
}

func newBinder(mode Binding, evidence Evidence) *binder {
	if mode == "" {
		mode = BindAddress
	}

	return &binder{mode: mode, evidence: evidence, bound: map[metal.ID]binding{}}
}

// Refusal reasons, as the journal carries them; their names are the metric labels.
const (
	refuseDuplicate = bootpb.TunnelRefusal_TUNNEL_REFUSAL_DUPLICATE_MACHINE_ID
	refuseNoBoot    = bootpb.TunnelRefusal_TUNNEL_REFUSAL_NO_BOOT_EVIDENCE
	refuseElsewhere = bootpb.TunnelRefusal_TUNNEL_REFUSAL_SOURCE_NOT_BOOT_ADDRESS
	refuseContested = bootpb.TunnelRefusal_TUNNEL_REFUSAL_CONTESTED_MACHINE_ID
)

// bindError is a refused binding: a status for the agent, a reason for the metrics and the log.
type bindError struct {
	reason bootpb.TunnelRefusal
	err    error
}

func (e *bindError) Error() string { return e.err.Error() }

func (e *bindError) GRPCStatus() *status.Status { return status.Convert(e.err) }

// bind admits a tunnel for id from remote at now, or says why not; release ends the binding when the tunnel
// goes.
func (b *binder) bind(id metal.ID, remote netip.AddrPort, now time.Time) (release func(), err error) {
	src := remote.Addr().Unmap()

	if b.mode != BindOff {
		if b.evidence == nil {
			return nil, &bindError{refuseNoBoot, status.Errorf(codes.PermissionDenied,
				"agent tunnel for %s refused: the edge holds no boot evidence to bind it to", id)}
		}

		switch addr, ok := b.evidence.BootAddr(id); {
		case b.evidence.Contested(id):
			return nil, &bindError{refuseContested, status.Errorf(codes.PermissionDenied,
				"agent tunnel for %s refused: two machines asked for its boot script lately (cloned UUID, or a forger); fix the duplicate", id)}
		case !ok:
			return nil, &bindError{refuseNoBoot, status.Errorf(codes.PermissionDenied,
				"agent tunnel for %s refused: the machine did not boot through this edge (no boot script served)", id)}
		case addr.Unmap() != src:
			return nil, &bindError{refuseElsewhere, status.Errorf(codes.PermissionDenied,
				"agent tunnel for %s from %s refused: the machine booted from %s", id, src, addr.Unmap())}
		}
	}

	b.mu.Lock()
	defer b.mu.Unlock()

	if cur, ok := b.bound[id]; ok {
		return nil, &bindError{refuseDuplicate, status.Errorf(codes.AlreadyExists,
			"agent tunnel for %s refused: the machine already has one (from %s); a new one is taken once it is gone", id, cur.remote.Addr())}
	}

	b.bound[id] = binding{remote: remote, at: now}

	return func() {
		b.mu.Lock()
		defer b.mu.Unlock()

		if b.bound[id].remote == remote {
			delete(b.bound, id)
		}
	}, nil
}

// boundBefore returns the source of id's live tunnel if it was bound before t.
func (b *binder) boundBefore(id metal.ID, t time.Time) (netip.AddrPort, bool) {
	b.mu.Lock()
	defer b.mu.Unlock()

	cur, ok := b.bound[id]
	if !ok || !cur.at.Before(t) {
		return netip.AddrPort{}, false
	}

	return cur.remote, true
}

// admitBound binds the tunnel of stream's context to id, counting and logging a refusal.
func (s *Server) admitBound(ctx context.Context, id metal.ID) (func(), error) {
	release, err := s.binder.bind(id, remoteAddr(ctx), s.now())
	if err != nil {
		reason := refuseNoBoot
		if be, ok := err.(*bindError); ok { //nolint:errorlint // bind returns it unwrapped
			reason = be.reason
		}

		s.rejected.WithLabelValues(reason.Name()).Inc()
		s.refusals.Note(reason.Name(), zap.Stringer("machine", id), zap.Stringer("remote", remoteAddr(ctx)), zap.Error(err))
		s.reportRefusal(id, reason, remoteAddr(ctx))

		return nil, err
	}

	return release, nil
}

// refusalReportInterval is how often one machine's refusals of one reason reach the sink; maxRefusalReports
// bounds the machines remembered for it (a flood of them starts it afresh).
const (
	refusalReportInterval = time.Minute
	maxRefusalReports     = 4096
)

// reportRefusal passes a refused tunnel of a machine that booted here to the sink, paced per machine and
// reason. A machine the edge has no boot evidence of is not reported: made-up UUIDs are free to send.
func (s *Server) reportRefusal(id metal.ID, reason bootpb.TunnelRefusal, remote netip.AddrPort) {
	sink, ok := s.sink.(RefusalSink)
	if !ok || reason == refuseNoBoot {
		return
	}

	now := s.now()
	key := id.String() + " " + reason.Name()

	s.reportMu.Lock()
	last, seen := s.reported[key]

	if seen && now.Sub(last) < refusalReportInterval {
		s.reportMu.Unlock()

		return
	}

	if len(s.reported) >= maxRefusalReports {
		s.reported = map[string]time.Time{}
	}

	s.reported[key] = now
	s.reportMu.Unlock()

	sink.TunnelRefused(Refusal{MachineID: id.String(), Reason: reason, RemoteAddr: remote, Time: now})
}
