package sites

import "github.com/prometheus/client_golang/prometheus"

// Reasons a connection is turned away, as counted in outpost_uplink_rejected_total.
const (
	reasonTLS             = "tls_handshake"
	reasonBadMagic        = "bad_magic"
	reasonMalformed       = "malformed_hello"
	reasonProtocolVersion = "protocol_version"
	reasonBadCertificate  = "bad_certificate"
	reasonSiteMismatch    = "site_mismatch"
	reasonUnknownSite     = "unknown_site"
	reasonRevoked         = "revoked"
	reasonOverload        = "overload"
	reasonInternal        = "internal"
)

type metrics struct {
	rejected    *prometheus.CounterVec
	sessions    prometheus.Counter
	connected   prometheus.Gauge
	enrollments *prometheus.CounterVec
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
	}

	for _, c := range []prometheus.Collector{m.rejected, m.sessions, m.connected, m.enrollments} {
		if err := reg.Register(c); err != nil {
			return nil, err
		}
	}

	return m, nil
}
