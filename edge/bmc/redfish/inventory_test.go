package redfish_test

import (
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/outpost-metal/outpost/edge/bmc/redfish"
)

// hostile is a Redfish service whose inventory answers are what a broken or hostile BMC may send; it counts the
// requests it gets.
type hostile struct {
	system     map[string]any
	storage    func(w http.ResponseWriter, r *http.Request)
	secureBoot func(w http.ResponseWriter, r *http.Request)
	requests   atomic.Int64
}

func (h *hostile) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	h.requests.Add(1)

	write := func(v any) {
		w.Header().Set("Content-Type", "application/json")
		_ = json.NewEncoder(w).Encode(v) //nolint:errcheck
	}

	switch path := strings.TrimSuffix(r.URL.Path, "/"); {
	case path == "/redfish/v1":
		write(map[string]any{"@odata.id": "/redfish/v1", "RedfishVersion": "1.6.0", "Systems": map[string]string{"@odata.id": "/redfish/v1/Systems"},
			"Links": map[string]any{"Sessions": map[string]string{"@odata.id": "/redfish/v1/SessionService/Sessions"}}})
	case path == "/redfish/v1/SessionService/Sessions" && r.Method == http.MethodPost:
		w.Header().Set("X-Auth-Token", "t")
		w.Header().Set("Location", "/redfish/v1/SessionService/Sessions/1")
		w.WriteHeader(http.StatusCreated)
		write(map[string]any{"@odata.id": "/redfish/v1/SessionService/Sessions/1", "Id": "1"})
	case path == "/redfish/v1/Systems":
		write(map[string]any{"@odata.id": path, "Members": []any{map[string]string{"@odata.id": "/redfish/v1/Systems/1"}}})
	case path == "/redfish/v1/Systems/1":
		write(h.system)
	case strings.HasPrefix(path, "/redfish/v1/Systems/1/Storage") && h.storage != nil:
		h.storage(w, r)
	case path == "/redfish/v1/Systems/1/SecureBoot" && h.secureBoot != nil:
		h.secureBoot(w, r)
	default:
		w.WriteHeader(http.StatusNotFound)
	}
}

func system(extra map[string]any) map[string]any {
	s := map[string]any{"@odata.id": "/redfish/v1/Systems/1", "Id": "1", "Manufacturer": "Acme", "Storage": map[string]string{"@odata.id": "/redfish/v1/Systems/1/Storage"}}
	for k, v := range extra {
		s[k] = v
	}

	return s
}

func TestInventoryBounded(t *testing.T) {
	t.Parallel()

	endless := func(w http.ResponseWriter, r *http.Request) {
		// every page links to a next one, and every member is another storage with its own drives
		w.Header().Set("Content-Type", "application/json")
		fmt.Fprintf(w, `{"@odata.id":%q,"Members":[{"@odata.id":"/redfish/v1/Systems/1/Storage/x"}],"Members@odata.nextLink":"/redfish/v1/Systems/1/Storage?page=%d"}`,
			r.URL.Path, len(r.URL.RawQuery)+1)
	}

	huge := func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		fmt.Fprintf(w, `{"Members":[{"@odata.id":"/x"}],"Name":"%s"}`, strings.Repeat("A", 3<<20))
	}

	secureBoot := func(body string) func(w http.ResponseWriter, r *http.Request) {
		return func(w http.ResponseWriter, _ *http.Request) {
			w.Header().Set("Content-Type", "application/json")
			fmt.Fprint(w, body)
		}
	}
	refused := func(w http.ResponseWriter, _ *http.Request) { w.WriteHeader(http.StatusInternalServerError) }
	withSecureBoot := system(map[string]any{"SecureBoot": map[string]string{"@odata.id": "/redfish/v1/Systems/1/SecureBoot"}})

	for _, tc := range []struct {
		name       string
		system     map[string]any
		storage    func(w http.ResponseWriter, r *http.Request)
		secureBoot func(w http.ResponseWriter, r *http.Request)
		wantErr    string
		want       redfish.Inventory
	}{
		{
			name: "secure boot enabled in deployed mode", system: withSecureBoot,
			secureBoot: secureBoot(`{"@odata.id":"/redfish/v1/Systems/1/SecureBoot","SecureBootEnable":true,"SecureBootMode":"DeployedMode"}`),
			want:       redfish.Inventory{Manufacturer: "Acme", SecureBoot: new(true)},
		},
		{
			name: "secure boot enabled in setup mode verifies nothing", system: withSecureBoot,
			secureBoot: secureBoot(`{"@odata.id":"/redfish/v1/Systems/1/SecureBoot","SecureBootEnable":true,"SecureBootMode":"SetupMode"}`),
			want:       redfish.Inventory{Manufacturer: "Acme", SecureBoot: new(false)},
		},
		{name: "secure boot refused: not known", system: withSecureBoot, secureBoot: refused, want: redfish.Inventory{Manufacturer: "Acme"}},
		{name: "secure boot answer too big", system: withSecureBoot, secureBoot: huge, wantErr: "more than 1048576 bytes"},
		{
			name:   "long and odd strings pass through for the caller to bound",
			system: system(map[string]any{"Model": strings.Repeat("\x1b[31mX", 1000), "ProcessorSummary": map[string]any{"Count": 4}}),
			want:   redfish.Inventory{Manufacturer: "Acme", Model: strings.Repeat("\x1b[31mX", 1000), CPUCount: 4},
		},
		{
			name:   "negative and huge numbers",
			system: system(map[string]any{"MemorySummary": map[string]any{"TotalSystemMemoryGiB": -5}, "ProcessorSummary": map[string]any{"Count": 1 << 40}}),
			want:   redfish.Inventory{Manufacturer: "Acme", CPUCount: 1<<32 - 1},
		},
		{name: "endless pages", system: system(nil), storage: endless, wantErr: "more than 256 requests"},
		{name: "an answer too big", system: system(nil), storage: huge, wantErr: "more than 1048576 bytes"},
		{name: "malformed system", system: map[string]any{"@odata.id": "/redfish/v1/Systems/1", "ProcessorSummary": "many"}, wantErr: "list systems"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()

			h := &hostile{system: tc.system, storage: tc.storage, secureBoot: tc.secureBoot}
			srv := httptest.NewServer(h)
			t.Cleanup(srv.Close)

			c, err := redfish.Dial(t.Context(), redfish.Config{Endpoint: srv.URL, Username: "u", Password: "p"})
			require.NoError(t, err)
			t.Cleanup(func() { c.Close(t.Context()) }) //nolint:errcheck

			inv, err := c.Inventory(t.Context())
			require.LessOrEqual(t, h.requests.Load(), int64(redfish.MaxInventoryRequests+8), "requests are bounded")

			if tc.wantErr != "" {
				require.ErrorContains(t, err, tc.wantErr)

				return
			}

			require.NoError(t, err)
			require.Equal(t, tc.want, inv)
		})
	}
}
