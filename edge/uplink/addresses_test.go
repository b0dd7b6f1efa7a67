package uplink_test

import (
	"context"
	"errors"
	"net"
	"sync"
	"testing"

	"github.com/stretchr/testify/require"
	"go.uber.org/zap/zaptest"

	"github.com/outpost-metal/outpost/edge/uplink"
)

func TestControllerAddresses(t *testing.T) {
	cfg := uplink.Default()
	cfg.StateDir = t.TempDir()

	for addr, ok := range map[string]bool{
		"controller:8443":                        true,
		"a:8443, b:8443":                         true,
		"a:8443,,b:8443,":                        true,
		"":                                       false,
		",":                                      false,
		"a:8443,b":                               false,
		"a:8443,b:1,c:1,d:1,e:1,f:1,g:1,h:1,i:1": false,
	} {
		cfg.ControllerAddress = addr
		require.Equal(t, ok, cfg.Validate() == nil, "%q: %v", addr, cfg.Validate())
	}

	cfg.ControllerAddress = " a:8443 ,b:8443"
	require.Equal(t, []string{"a:8443", "b:8443"}, cfg.Addresses())
}

// A standby controller does not listen: the edge dials the next address at once and starts with the one that
// answered next time.
func TestDialFindsTheActiveController(t *testing.T) {
	var (
		mu     sync.Mutex
		dialed []string
		active = "b:8443"
	)

	cfg := uplink.Default()
	cfg.StateDir = t.TempDir()
	cfg.ControllerAddress = "a:8443,b:8443,c:8443"

	c, err := uplink.New(cfg, uplink.Options{
		Logger: zaptest.NewLogger(t),
		Dial: func(_ context.Context, address string) (net.Conn, error) {
			mu.Lock()
			defer mu.Unlock()

			dialed = append(dialed, address)
			if address != active {
				return nil, errors.New("connection refused")
			}

			client, server := net.Pipe()
			server.Close() //nolint:errcheck

			return client, nil
		},
	})
	require.NoError(t, err)

	addr, err := c.DialController(t.Context())
	require.NoError(t, err)
	require.Equal(t, "b:8443", addr)
	require.Equal(t, []string{"a:8443", "b:8443"}, dialed)

	dialed = nil
	_, err = c.DialController(t.Context())
	require.NoError(t, err)
	require.Equal(t, []string{"b:8443"}, dialed, "the controller that answered last is dialed first")

	// The standby took over: the old active one refuses, the edge goes round to it.
	mu.Lock()
	active, dialed = "a:8443", nil
	mu.Unlock()

	addr, err = c.DialController(t.Context())
	require.NoError(t, err)
	require.Equal(t, "a:8443", addr)
	require.Equal(t, []string{"b:8443", "c:8443", "a:8443"}, dialed)

	// None answers: every address is named in the error.
	mu.Lock()
	active = "none"
	mu.Unlock()

	_, err = c.DialController(t.Context())
	require.ErrorContains(t, err, "a:8443")
	require.ErrorContains(t, err, "b:8443")
	require.ErrorContains(t, err, "c:8443")
}
