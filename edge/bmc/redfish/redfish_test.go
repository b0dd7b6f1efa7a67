package redfish_test

import (
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/outpost-metal/outpost/edge/bmc/redfish"
)

func FuzzProbe(f *testing.F) {
	var body atomic.Value

	body.Store([]byte{})

	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		_, _ = w.Write(body.Load().([]byte)) //nolint:errcheck
	}))
	defer srv.Close()

	f.Add([]byte(`{"@odata.id":"/redfish/v1","RedfishVersion":"1.6.0"}`))
	f.Add([]byte(`<html></html>`))
	f.Add([]byte(`{"@odata.id":`))

	hc := redfish.Config{}.HTTPClient()

	f.Fuzz(func(t *testing.T, b []byte) {
		body.Store(b)

		_ = redfish.Probe(t.Context(), hc, srv.URL) //nolint:errcheck // must only not crash or hang
	})
}

func TestProbe(t *testing.T) {
	t.Parallel()

	for _, tc := range []struct {
		name   string
		status int
		body   string
		ok     bool
	}{
		{name: "service root", status: 200, body: `{"@odata.id":"/redfish/v1","RedfishVersion":"1.6.0"}`, ok: true},
		{name: "html", status: 200, body: `<html>login</html>`},
		{name: "empty json", status: 200, body: `{}`},
		{name: "500", status: 500, body: `oops`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()

			srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
				w.WriteHeader(tc.status)
				_, _ = w.Write([]byte(tc.body)) //nolint:errcheck
			}))
			t.Cleanup(srv.Close)

			err := redfish.Probe(t.Context(), redfish.Config{}.HTTPClient(), srv.URL)
			if tc.ok {
				require.NoError(t, err)
			} else {
				require.ErrorIs(t, err, redfish.ErrNotRedfish)
			}
		})
	}
}

func TestStatusErrorPermanent(t *testing.T) {
	t.Parallel()

	for status, permanent := range map[int]bool{
		http.StatusBadRequest: true, http.StatusUnauthorized: true, http.StatusForbidden: true, http.StatusNotFound: true,
		http.StatusMethodNotAllowed: true, http.StatusConflict: true, http.StatusUnprocessableEntity: true,
		http.StatusRequestTimeout: false, http.StatusPreconditionFailed: false, http.StatusTooManyRequests: false,
		http.StatusInternalServerError: false, http.StatusNotImplemented: false, http.StatusBadGateway: false,
		http.StatusServiceUnavailable: false, http.StatusGatewayTimeout: false,
	} {
		err := &redfish.StatusError{Status: status}
		require.Equal(t, permanent, err.Permanent(), "%d", status)
		require.Contains(t, err.Error(), strings.ToLower(http.StatusText(status)))
	}
}
