package dhcp_test

import (
	"fmt"
	"net"
	"net/netip"
	"os"
	"sync"
	"testing"

	"github.com/insomniacslk/dhcp/dhcpv4"
	"github.com/stretchr/testify/require"
	"go.uber.org/zap/zaptest"

	"github.com/outpost-metal/outpost/edge/dhcp"
	bootpb "github.com/outpost-metal/outpost/shared/api/boot"
)

// Many clients bound at once: each one's Do returns only once its lease is on disk, and the writes are grouped
// (without grouping there is one write a client). A write that fails fails every change it should have held;
// the next succeeds.
func TestLeaseStoreGroupsWrites(t *testing.T) {
	t.Parallel()

	const clients = 64

	p, err := dhcp.NewPool(&bootpb.DHCP{
		Mode: bootpb.DHCPMode_DHCP_MODE_FULL, Subnet: "10.9.0.0/24", PoolStart: "10.9.0.100", PoolEnd: "10.9.0.199", LeaseSeconds: 600,
	}, edgeAddr)
	require.NoError(t, err)

	dir := t.TempDir()
	log := zaptest.NewLogger(t)

	store, err := dhcp.OpenLeases(dir, log)
	require.NoError(t, err)

	mac := func(i int) net.HardwareAddr { return net.HardwareAddr{0x52, 0x54, 0, 0, 0x10, byte(i)} }
	addr := func(i int) string { return fmt.Sprintf("10.9.0.%d", 100+i) }

	bind := func(from, to int) []error {
		var (
			wg    sync.WaitGroup
			start = make(chan struct{})
			errs  = make([]error, to-from)
		)

		for i := from; i < to; i++ {
			wg.Add(1)

			go func() {
				defer wg.Done()
				<-start

				errs[i-from] = store.Do(func(st *dhcp.LeaseState) bool {
					step(t, p, st, msg(t, mac(i), dhcpv4.MessageTypeRequest, requested(addr(i))), t0)

					return true
				})
			}()
		}

		close(start)
		wg.Wait()

		return errs
	}

	for i, err := range bind(0, clients) {
		require.NoError(t, err, "client %d", i)
	}

	require.Less(t, store.Writes(), uint64(clients/2), "the writes were not grouped")
	t.Logf("%d clients bound at once: %d writes", clients, store.Writes())

	reopened, err := dhcp.OpenLeases(dir, log)
	require.NoError(t, err)
	require.NoError(t, reopened.Do(func(st *dhcp.LeaseState) bool {
		for i := range clients {
			l, ok := st.Lease([6]byte(mac(i)))
			require.True(t, ok, "client %d's lease is not on disk", i)
			require.Equal(t, netip.MustParseAddr(addr(i)), l.IP)
		}

		return false
	}))

	// The state directory replaced by a file: every write fails, and so does every change that waited on one.
	require.NoError(t, os.RemoveAll(dir))
	require.NoError(t, os.WriteFile(dir, nil, 0o600))

	for i, err := range bind(clients, clients+8) {
		require.Error(t, err, "client %d's change is not on disk", clients+i)
	}

	require.NoError(t, os.Remove(dir))
	require.NoError(t, os.Mkdir(dir, 0o700))

	for i, err := range bind(clients+8, clients+9) {
		require.NoError(t, err, "client %d after the directory came back", clients+8+i)
	}
}
