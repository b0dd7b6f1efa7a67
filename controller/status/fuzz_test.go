package status_test

import (
	"net/url"
	"testing"

	"github.com/outpost-metal/outpost/controller/status"
)

// FuzzParseQuery feeds arbitrary query strings (any client sends them): a clear error or a bounded query.
func FuzzParseQuery(f *testing.F) {
	for _, s := range []string{"site=a&phase=ready&page=2", "phase=unknown", "page=0", "site=%00", "page=99999999999"} {
		f.Add(s)
	}

	f.Fuzz(func(t *testing.T, raw string) {
		q, err := url.ParseQuery(raw)
		if err != nil {
			return
		}

		pq, err := status.ParseQuery(q)
		if err != nil {
			return
		}

		if pq.Page < 1 || pq.Page > 1<<20 || len(pq.Filter.Site) > 64 || len(pq.Filter.Phase) > 32 {
			t.Fatalf("unbounded query accepted: %+v", pq)
		}
	})
}
