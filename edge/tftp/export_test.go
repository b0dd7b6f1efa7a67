package tftp

import (
	"net/netip"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
)

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

// NormalizeRequest parses a request datagram as the filter does and returns it as pin/tftp is given it, with
// blksize clamped to limit.
func NormalizeRequest(b []byte, limit int) ([]byte, error) {
	req, err := parseRequest(b)
	if err != nil {
		return nil, err
	}

	return req.appendNormalized(nil, limit), nil
}

// ErrMalformed is what NormalizeRequest fails with.
var ErrMalformed = errMalformed

// SourceRates is the filter's per-source request rate: allow reports whether addr may send a request at now.
func SourceRates(perSecond, burst, maxSources int) (allow func(addr netip.Addr, now time.Time) bool, size func() int) {
	r := newSourceRates(perSecond, burst, maxSources)

	return r.allow, r.recent.Len
}
