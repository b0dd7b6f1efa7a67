package tunnel

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"sync"

	"go.uber.org/zap"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/outpost-metal/outpost/edge/limits"
)

// Limits bounds what the site network can open on the agent API port. It is orthogonal to how tunnels are
// keyed and calls routed: it counts tunnels and connections by where they come from, whatever machine they name.
type Limits struct {
	// MaxTunnels bounds the agent tunnels open at once, MaxTunnelsPerSource those from one address,
	// MaxTunnelsPerConn those on one connection. Over a bound a tunnel is refused (ResourceExhausted): an open
	// tunnel is a live agent's, so none is ended to make room.
	MaxTunnels          int
	MaxTunnelsPerSource int
	MaxTunnelsPerConn   int
	// MaxConns and MaxConnsPerSource bound the port's connections, with or without tunnels.
	MaxConns          int
	MaxConnsPerSource int
	// EventRate and EventBurst bound the tunnel opens journaled per second (see eventGate); the close of a
	// journaled open is always journaled.
	EventRate  float64
	EventBurst int
}

// DefaultLimits returns limits sized for a site: agents run while machines are discovered or wiped, one
// tunnel on one connection each (two for a moment after a reconnect, until keepalive ends the dead one), so
// 4,096 tunnels cover thousands of machines in agent mode at once, a whole rack far inside. Each costs the
// edge about 70 KiB with its connection (measured by TestTunnelFlood), so the bound is some 280 MiB.
// A burst of 200 journals a rack's opens at once, 20/s more after it.
func DefaultLimits() Limits {
	return Limits{
		MaxTunnels: 4096, MaxTunnelsPerSource: 4, MaxTunnelsPerConn: 2,
		MaxConns: 5000, MaxConnsPerSource: 8,
		EventRate: 20, EventBurst: 200,
	}
}

// Validate checks the limits.
func (l Limits) Validate() error {
	var errs []error

	for name, pair := range map[string][2]int{
		"tunnels (--agent-max-tunnels, --agent-max-tunnels-per-source)": {l.MaxTunnels, l.MaxTunnelsPerSource},
		"connections (--agent-max-conns)":                               {l.MaxConns, l.MaxConnsPerSource},
	} {
		if pair[0] <= 0 || pair[1] <= 0 || pair[1] > pair[0] {
			errs = append(errs, fmt.Errorf("%s: %d in total and %d per source: both positive, per source at most the total", name, pair[0], pair[1]))
		}
	}

	if l.MaxTunnelsPerConn <= 0 {
		errs = append(errs, errors.New("tunnels per connection must be positive"))
	}

	if l.EventRate <= 0 || l.EventBurst <= 0 {
		errs = append(errs, errors.New("the event rate and burst must be positive"))
	}

	return errors.Join(errs...)
}

// Refusal reasons (the "reason" label of outpost_edge_agent_tunnels_rejected_total, beside forward_tunnel and machine_id).
const (
	reasonPerSource = "per_source"
	reasonTotal     = "total"
	reasonPerConn   = "per_connection"
)

// limiter admits agent tunnels within Limits: per source address and in total (a limits.Limiter) and per
// connection (by the connection's remote address and port, which is one TCP connection while it is open).
type limiter struct {
	lim     *limits.Limiter
	perConn int
	hints   map[string]string
	rejects *limits.RejectLog
	count   func(reason string)

	mu    sync.Mutex
	conns map[netip.AddrPort]int
}

func newLimiter(l Limits, rejects *limits.RejectLog, count func(string)) *limiter {
	return &limiter{
		lim:     limits.New(limits.Config{Total: l.MaxTunnels, PerSource: l.MaxTunnelsPerSource}),
		perConn: l.MaxTunnelsPerConn,
		rejects: rejects,
		count:   count,
		conns:   map[netip.AddrPort]int{},
		hints: map[string]string{
			reasonPerSource: fmt.Sprintf("this address already has %d agent tunnels (--agent-max-tunnels-per-source); an agent opens one", l.MaxTunnelsPerSource),
			reasonTotal:     fmt.Sprintf("%d agent tunnels open (--agent-max-tunnels); raise it if real agents are refused", l.MaxTunnels),
			reasonPerConn:   fmt.Sprintf("this connection already carries %d tunnels; an agent opens one per connection", l.MaxTunnelsPerConn),
		},
	}
}

// admit takes a place for a tunnel from the stream's peer, or returns the ResourceExhausted status to answer.
// release gives the place back when the tunnel ends.
func (l *limiter) admit(ctx context.Context) (release func(), err error) {
	remote := remoteAddr(ctx)

	l.mu.Lock()
	if remote.IsValid() && l.conns[remote] >= l.perConn { // a peer without an address (an in-memory pipe) is not a connection to count
		l.mu.Unlock()

		return nil, l.refuse(remote, reasonPerConn, l.perConn, fmt.Sprintf("connection %s already carries %d tunnels", remote, l.perConn))
	}

	l.conns[remote]++
	l.mu.Unlock()

	unconn := func() {
		l.mu.Lock()
		defer l.mu.Unlock()

		if l.conns[remote]--; l.conns[remote] <= 0 {
			delete(l.conns, remote)
		}
	}

	slot, err := l.lim.Acquire(remote.Addr(), nil)
	if err != nil {
		unconn()

		re, _ := limits.AsRefused(err)
		if re == nil {
			return nil, status.Errorf(codes.ResourceExhausted, "open agent tunnel: %v", err)
		}

		return nil, l.refuse(remote, string(re.Reason), re.Limit, re.Error())
	}

	return func() {
		slot.Release()
		unconn()
	}, nil
}

func (l *limiter) refuse(remote netip.AddrPort, reason string, limit int, msg string) error {
	l.count(reason)
	l.rejects.Note(reason, zap.Stringer("remote", remote), zap.Int("limit", limit), zap.String("hint", l.hints[reason]))

	return status.Errorf(codes.ResourceExhausted, "open agent tunnel: %s", msg)
}
