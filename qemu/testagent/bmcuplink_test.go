package testagent_test

import (
	"net"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/outpost-metal/outpost/edge/bmc"
	"github.com/outpost-metal/outpost/qemu/vbmc"
	bmcpb "github.com/outpost-metal/outpost/shared/api/bmc"
)

// TestBMCOverUplinkQueueing shows, from the controller through the uplink, that calls to one BMC
// are serialized, that an unreachable BMC times out with a clear error without holding up another
// BMC, and that the Redfish probe result expires.
func TestBMCOverUplinkQueueing(t *testing.T) {
	var offset atomic.Int64

	now := func() time.Time { return time.Now().Add(time.Duration(offset.Load())) }

	log, _ := newLogger(t)
	s := startSite(t, log, func(c *bmc.Config) {
		c.CallTimeout = 3 * time.Second // a dead BMC's call takes all of it; others must not wait for it
		c.ProbeTimeout = 500 * time.Millisecond
		c.IPMIExchangeTimeout = 300 * time.Millisecond
		c.ProbeTTL = time.Minute
	}, now)

	ch := vbmc.NewChassis(vbmc.WithLatency(15 * time.Millisecond))
	port := startIPMI(t, ch, bmcUser, bmcPassword)
	rf := startRedfish(t, ch, bmcUser, bmcPassword)

	good := s.access.BMC(siteA, machineID, &bmcpb.Target{
		Host: "127.0.0.1", IpmiPort: uint32(port), RedfishEndpoint: rf, Username: bmcUser, Password: bmcPassword,
	})

	t.Run("serialized", func(t *testing.T) {
		var wg sync.WaitGroup

		errs := make(chan error, 6)

		for range 6 {
			wg.Go(func() {
				_, err := good.PowerStatus(t.Context())
				errs <- err
			})
		}

		wg.Wait()
		close(errs)

		for err := range errs {
			require.NoError(t, err)
		}

		require.Equal(t, 1, ch.MaxConcurrent(), "no two operations reached the BMC at once")
	})

	t.Run("unreachable", func(t *testing.T) {
		silent, err := net.ListenUDP("udp", &net.UDPAddr{IP: net.IPv4(127, 0, 0, 1)})
		require.NoError(t, err)
		t.Cleanup(func() { silent.Close() }) //nolint:errcheck

		dead := s.access.BMC(siteA, machineID, &bmcpb.Target{
			Host: "127.0.0.1", IpmiPort: uint32(silent.LocalAddr().(*net.UDPAddr).Port),
			Protocol: bmcpb.Protocol_PROTOCOL_IPMI, Username: bmcUser, Password: bmcPassword,
		})

		deadErr := make(chan error, 1)
		start := time.Now()

		go func() {
			_, err := dead.PowerStatus(t.Context())
			deadErr <- err
		}()

		t0 := time.Now()
		_, err = good.PowerStatus(t.Context())
		require.NoError(t, err)
		require.Less(t, time.Since(t0), 2*time.Second, "another BMC is not held up")

		err = <-deadErr
		require.Equal(t, codes.DeadlineExceeded, status.Code(err), "%v", err)
		require.ErrorContains(t, err, "did not answer in time")
		require.NotContains(t, err.Error(), bmcPassword)
		require.Less(t, time.Since(start), 8*time.Second)
	})

	t.Run("probe expires", func(t *testing.T) {
		_, err := good.PowerStatus(t.Context()) // probed: Redfish
		require.NoError(t, err)

		// While the choice is remembered, a Redfish outage fails calls...
		stopRedfish(t, rf)

		_, err = good.PowerStatus(t.Context())
		require.Error(t, err)

		// ...until it expires and the edge probes again, falling back to IPMI.
		offset.Add(int64(2 * time.Minute))

		_, err = good.PowerStatus(t.Context())
		require.NoError(t, err)
	})
}
