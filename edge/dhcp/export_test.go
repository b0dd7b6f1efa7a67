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

// Other is the other server the guard last found (invalid: none).
func (g *Guard) Other() OtherServer { return g.state.Load().other }

// Lease returns the client's lease or offer.
func (st *LeaseState) Lease(mac [6]byte) (Lease, bool) {
	if l := st.byMAC[mac]; l != nil {
		return *l, true
	}

	return Lease{}, false
}

// NaksCounter exposes full mode's NAK counter of one reason to tests.
func (s *Server) NaksCounter(reason DropReason) prometheus.Counter {
	return s.naks.WithLabelValues(string(reason))
}

// LeaseCounts is what the lease gauges read: live bound leases, pending offers, addresses held back.
func (s *Server) LeaseCounts() (bound, offered, heldBack int) { return s.leaseCounts() }

// RequestsCounter exposes the request counter of one port role ("dhcp", "pxe") to tests.
func (s *Server) RequestsCounter(role string) prometheus.Counter {
	return s.requests.WithLabelValues(role)
}

// Writes is how many times the store wrote its file.
func (s *LeaseStore) Writes() uint64 {
	s.mu.Lock()
	defer s.mu.Unlock()

	return s.writes
}
