package tftp

import "github.com/prometheus/client_golang/prometheus/testutil"

// RequestCount is outpost_tftp_requests_total for one result.
func (s *Server) RequestCount(result string) int {
	return int(testutil.ToFloat64(s.requests.WithLabelValues(result)))
}

// TransferCount is outpost_tftp_transfers_total for one outcome.
func (s *Server) TransferCount(outcome string) int {
	return int(testutil.ToFloat64(s.transfers.WithLabelValues(outcome)))
}

// DroppedCounts are the error replies and journal events left out for their rate limits.
func (s *Server) DroppedCounts() (errorReplies, events int) {
	return int(testutil.ToFloat64(s.errorsDropped)), int(testutil.ToFloat64(s.eventsDropped))
}
