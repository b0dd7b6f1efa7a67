package dhcp

import (
	"context"
	"crypto/sha256"
	"net"
	"net/netip"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/zap"
)

// OtherServer is another DHCP server that answered the guard's DISCOVER on the segment.
type OtherServer struct {
	// Addr is the source address of its OFFER; ServerID its option 54 (RFC 2131 §4.3.1).
	Addr, ServerID netip.Addr
}

// Discoverer sends a DISCOVER with the client hardware address mac on the segment and returns the servers
// whose OFFER came back within its window.
type Discoverer interface {
	Discover(ctx context.Context, mac net.HardwareAddr) ([]OtherServer, error)
}

// GuardConfig configures the guard against a second DHCP server.
type GuardConfig struct {
	// Interval is how often the segment is checked again while full mode is asked for.
	Interval time.Duration
}

// Guard keeps full DHCP mode off a segment that has another DHCP server: before full mode serves, and then
// every Interval, it sends its own DISCOVER (with a MAC of its own making) and, while another server OFFERs,
// full mode is refused (the edge answers PXE clients as a ProxyDHCP), the other server is named in the log and
// outpost_dhcp_other_server is 1.
type Guard struct {
	cfg    GuardConfig
	log    *zap.Logger
	disc   Discoverer
	mac    net.HardwareAddr
	wanted func() bool

	state atomicGuardState
	kick  chan struct{}

	other  prometheus.Gauge
	checks *prometheus.CounterVec
}

// GuardMAC is the guard's client hardware address for an interface's: locally administered, unicast, stable.
func GuardMAC(iface net.HardwareAddr) net.HardwareAddr {
	sum := sha256.Sum256(append([]byte("outpost dhcp guard "), iface...))
	mac := net.HardwareAddr(sum[:6])
	mac[0] = mac[0]&0xfc | 0x02

	return mac
}

// NewGuard builds a guard that checks with disc as mac while wanted reports full mode asked for (disc leaves
// out the edge's own answers).
func NewGuard(cfg GuardConfig, log *zap.Logger, disc Discoverer, mac net.HardwareAddr, wanted func() bool, reg prometheus.Registerer) (*Guard, error) {
	g := &Guard{
		cfg: cfg, log: log.With(zap.String("component", "dhcp-guard")), disc: disc, mac: mac, wanted: wanted,
		kick: make(chan struct{}, 1),
		other: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "outpost_dhcp_other_server", Help: "1 while another DHCP server answers on the segment and full DHCP mode is refused.",
		}),
		checks: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "outpost_dhcp_guard_checks_total", Help: "Checks of the segment for another DHCP server, by result (clear, other_server, failed).",
		}, []string{"result"}),
	}

	g.state.Store(&guardState{})

	if reg != nil {
		for _, c := range []prometheus.Collector{g.other, g.checks} {
			if err := reg.Register(c); err != nil {
				return nil, err
			}
		}
	}

	return g, nil
}

// MAC is the guard's client hardware address (the edge's own server ignores it).
func (g *Guard) MAC() net.HardwareAddr { return g.mac }

// Clear reports whether the segment was checked and no other server answered: full mode may serve.
func (g *Guard) Clear() bool {
	st := g.state.Load()

	return st.checked && !st.other.Addr.IsValid()
}

// Kick asks for a check now (full mode is asked for and the segment is not checked yet).
func (g *Guard) Kick() {
	select {
	case g.kick <- struct{}{}:
	default:
	}
}

// Check checks the segment once and records what it found.
func (g *Guard) Check(ctx context.Context) {
	offers, err := g.disc.Discover(ctx, g.mac)
	if err != nil {
		if ctx.Err() == nil {
			g.checks.WithLabelValues("failed").Inc()
			g.log.Warn("cannot check the segment for another dhcp server; full mode stays refused", zap.Error(err))
		}

		return
	}

	var other OtherServer
	if len(offers) > 0 {
		other = offers[0]
	}

	prev := g.state.Load()
	g.state.Store(&guardState{checked: true, other: other, at: time.Now()})

	switch {
	case other.Addr.IsValid():
		g.checks.WithLabelValues("other_server").Inc()
		g.other.Set(1)

		if prev.other != other {
			g.log.Warn("another DHCP server answers on this segment: full DHCP mode refused (PXE clients get ProxyDHCP answers); stop it or set the site to --dhcp proxy",
				zap.Stringer("other_server_address", other.Addr), zap.Stringer("other_server_identifier", other.ServerID))
		}
	default:
		g.checks.WithLabelValues("clear").Inc()
		g.other.Set(0)

		if prev.other.Addr.IsValid() || !prev.checked {
			g.log.Info("no other DHCP server answers on this segment: full DHCP mode serves")
		}
	}
}

// Run checks the segment while full mode is asked for: at once, when kicked, and every Interval, until ctx ends.
func (g *Guard) Run(ctx context.Context) error {
	tick := time.NewTicker(g.cfg.Interval)
	defer tick.Stop()

	for {
		if g.wanted() {
			g.Check(ctx)
		} else if g.state.Load().checked {
			g.state.Store(&guardState{}) // checked again before full mode serves next time
			g.other.Set(0)
		}

		select {
		case <-ctx.Done():
			return nil
		case <-tick.C:
		case <-g.kick:
		}
	}
}
