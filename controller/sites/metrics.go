package sites

import "github.com/prometheus/client_golang/prometheus"

// Reasons a connection is turned away, as counted in outpost_uplink_rejected_total: a fixed set, so the
// label's cardinality is bounded whatever the clients send.
const (
	reasonTLS              = "tls_handshake"
	reasonTLSTimeout       = "tls_timeout"
	reasonBadMagic         = "bad_magic"
	reasonMalformed        = "malformed_hello"
	reasonHelloTimeout     = "hello_timeout"
	reasonProtocolVersion  = "protocol_version"
	reasonEdgeVersion      = "edge_version"
	reasonBadCertificate   = "bad_certificate"
	reasonSiteMismatch     = "site_mismatch"
	reasonUnknownSite      = "unknown_site"
	reasonRevoked          = "revoked"
	reasonOverload         = "overload"
	reasonSourceHandshakes = "source_handshakes"
	reasonSourceRate       = "source_rate"
	reasonSourcesFull      = "sources_full"
	reasonNoToken          = "no_join_token"
	reasonTokenRejected    = "token_rejected"
	reasonLockedSource     = "locked_source"
	reasonLockedSite       = "locked_site"
	reasonEnrollOverload   = "enroll_overload"
	reasonEnrollSource     = "enroll_source"
	reasonEnrollSite       = "enroll_site"
	reasonInternal         = "internal"
)

type metrics struct {
	rejected       *prometheus.CounterVec
	sessions       prometheus.Counter
	connected      prometheus.Gauge
	enrollments    *prometheus.CounterVec
	handshakes     prometheus.Gauge
	enrollSessions prometheus.Gauge
	lockouts       *prometheus.CounterVec
}

func newMetrics(reg prometheus.Registerer) (*metrics, error) {
	m := &metrics{
		rejected: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "outpost_uplink_rejected_total",
			Help: "Uplink connections turned away, by reason.",
		}, []string{"reason"}),
		sessions: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "outpost_uplink_sessions_total",
			Help: "Uplink sessions accepted.",
		}),
		connected: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "outpost_uplink_sites_connected",
			Help: "Sites with a live uplink session.",
		}),
		enrollments: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "outpost_uplink_enrollments_total",
			Help: "Enrollment attempts, by result.",
		}, []string{"result"}),
		handshakes: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "outpost_uplink_handshakes_in_progress",
			Help: "Uplink connections in TLS or hello.",
		}),
		enrollSessions: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "outpost_uplink_enroll_sessions",
			Help: "Enrolment sessions open.",
		}),
		lockouts: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "outpost_uplink_lockouts_total",
			Help: "Enrolment lockouts started by wrong join tokens, by scope (source or site).",
		}, []string{"scope"}),
	}

	for _, c := range []prometheus.Collector{m.rejected, m.sessions, m.connected, m.enrollments, m.handshakes, m.enrollSessions, m.lockouts} {
		if err := reg.Register(c); err != nil {
			return nil, err
		}
	}

	return m, nil
}
