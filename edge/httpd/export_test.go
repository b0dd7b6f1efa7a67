package httpd

import (
	"github.com/prometheus/client_golang/prometheus"

	"github.com/outpost-metal/outpost/edge/limits"
)

// ConnStats returns the connection limiter's counts.
func (s *Server) ConnStats() limits.Stats { return s.conns.Stats() }

// ServedCounter exposes a boot-served counter to tests.
func (s *Server) ServedCounter(mode string) prometheus.Counter {
	return s.metrics.served.WithLabelValues(mode)
}

// RejectedCounter exposes a rejection counter to tests.
func (s *Server) RejectedCounter(reason Reason) prometheus.Counter {
	return s.metrics.rejected.WithLabelValues(string(reason))
}
