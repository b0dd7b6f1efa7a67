package dhcp

import "github.com/prometheus/client_golang/prometheus"

// RepliesCounter exposes one reply counter to tests.
func (s *Server) RepliesCounter(role, firmware string) prometheus.Counter {
	return s.replies.WithLabelValues(role, firmware)
}

// DropsCounter exposes one drop counter to tests.
func (s *Server) DropsCounter(reason DropReason) prometheus.Counter {
	return s.drops.WithLabelValues(string(reason))
}

// LeaseRepliesCounter exposes full mode's reply counter of one message type (OFFER, ACK, NAK) to tests.
func (s *Server) LeaseRepliesCounter(msgType string) prometheus.Counter {
	return s.leaseReplies.WithLabelValues(msgType)
}
