//go:build linux

package dhcp_test

import (
	"bufio"
	"context"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/stretchr/testify/require"

	"github.com/outpost-metal/outpost/edge/dhcp"
	bootpb "github.com/outpost-metal/outpost/shared/api/boot"
)

// udhcpcScript records each event udhcpc reports (bound, renew, deconfig, ...) with the options it got, and
// configures the address as a real client does, so that its renewal and RELEASE go by unicast from it.
const udhcpcScript = `#!/bin/sh
echo "$1 ip=$ip subnet=$subnet router=$router dns=$(echo $dns | tr " " ,) serverid=$serverid lease=$lease" >> "$EVENTS"
case "$1" in
deconfig) ip addr flush dev "$interface" ;;
bound|renew) ip addr flush dev "$interface"; ip addr add "$ip/24" dev "$interface" ;;
esac
exit 0
`

// daemonClient is udhcpc running in the clients' namespace until the test ends.
type daemonClient struct {
	cmd    *exec.Cmd
	events string
}

func (s *segment) startUdhcpc(t *testing.T, mac string) *daemonClient {
	t.Helper()

	run(t, "ip", "-n", s.clientNS, "link", "set", s.clientIf, "address", mac)

	dir := t.TempDir()
	script := filepath.Join(dir, "script")
	require.NoError(t, os.WriteFile(script, []byte(udhcpcScript), 0o700))

	c := &daemonClient{events: filepath.Join(dir, "events")}

	ctx, cancel := context.WithCancel(context.Background())
	c.cmd = exec.CommandContext(ctx, "ip", "netns", "exec", s.clientNS, "busybox", "udhcpc",
		"-i", s.clientIf, "-f", "-t", "6", "-T", "1", "-s", script)
	c.cmd.Env = append(os.Environ(), "EVENTS="+c.events)

	out := &strings.Builder{}
	c.cmd.Stdout, c.cmd.Stderr = out, out
	require.NoError(t, c.cmd.Start())

	t.Cleanup(func() {
		cancel()
		_ = c.cmd.Wait() //nolint:errcheck // killed
		run(t, "ip", "-n", s.clientNS, "addr", "flush", "dev", s.clientIf)
		t.Logf("udhcpc %s said:\n%s", mac, out)
	})

	return c
}

// waitEvent polls the client's events until the n-th (from 1) of kind arrives and returns its fields.
func (c *daemonClient) waitEvent(t *testing.T, kind string, n int) map[string]string {
	t.Helper()

	deadline := time.Now().Add(30 * time.Second)

	for {
		seen := 0

		if f, err := os.Open(c.events); err == nil {
			sc := bufio.NewScanner(f)
			for sc.Scan() {
				fields := strings.Fields(sc.Text())
				if len(fields) == 0 || fields[0] != kind {
					continue
				}

				if seen++; seen == n {
					f.Close() //nolint:errcheck

					ev := map[string]string{}

					for _, kv := range fields[1:] {
						k, v, _ := strings.Cut(kv, "=")
						ev[k] = v
					}

					return ev
				}
			}

			f.Close() //nolint:errcheck
		}

		require.True(t, time.Now().Before(deadline), "udhcpc reported %d %q events of %d wanted", seen, kind, n)
		time.Sleep(20 * time.Millisecond) // polling udhcpc's script output
	}
}

func (c *daemonClient) signal(t *testing.T, sig syscall.Signal) {
	t.Helper()
	require.NoError(t, c.cmd.Process.Signal(sig)) // `ip netns exec` execs udhcpc: this is its process
}

// persistedExpiry is the expiry of mac's lease in the edge's lease file.
func persistedExpiry(t *testing.T, stateDir, mac string) time.Time {
	t.Helper()

	raw, err := os.ReadFile(filepath.Join(stateDir, dhcp.LeaseFileName))
	require.NoError(t, err)

	var f struct {
		Leases []struct {
			MAC     string    `json:"mac"`
			Expires time.Time `json:"expires"`
		} `json:"leases"`
	}

	require.NoError(t, json.Unmarshal(raw, &f))

	for _, l := range f.Leases {
		if l.MAC == mac {
			return l.Expires
		}
	}

	require.Failf(t, "no persisted lease", "for %s in %s", mac, raw)

	return time.Time{}
}

// Judged by busybox's udhcpc: a lease from the pool with the router, DNS and mask the site set, renewed (SIGUSR1)
// and released (SIGUSR2); the released address goes to the next client once the pool has no other; a
// reservation by MAC is honoured with the same options.
func TestFullModeJudgedByUdhcpc(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root: creates network namespaces and a veth pair")
	}

	for _, tool := range []string{"ip", "busybox"} {
		if _, err := exec.LookPath(tool); err != nil {
			t.Skipf("needs %s (Debian iproute2, busybox-static)", tool)
		}
	}

	seg := newSegment(t)
	state := t.TempDir()

	site := &bootpb.DHCP{
		Mode: bootpb.DHCPMode_DHCP_MODE_FULL, Subnet: "10.77.0.0/24", PoolStart: "10.77.0.100", PoolEnd: "10.77.0.101",
		Gateway: "10.77.0.1", Dns: []string{"10.77.0.53", "10.77.0.54"}, LeaseSeconds: 600,
		Reservations: []*bootpb.DHCPReservation{{Mac: "52:54:00:77:00:42", Ip: "10.77.0.42"}},
	}

	edge := seg.startEdge(t, state, site)
	defer edge.stop()

	require.True(t, edge.guard.Clear(), "no other server on the segment")

	a := seg.startUdhcpc(t, "52:54:00:77:00:0a")

	bound := a.waitEvent(t, "bound", 1)
	require.Equal(t, map[string]string{
		"ip": "10.77.0.100", "subnet": "255.255.255.0", "router": "10.77.0.1", "dns": "10.77.0.53,10.77.0.54", "serverid": "10.77.0.2", "lease": "600",
	}, bound, "udhcpc's view of the lease")

	first := persistedExpiry(t, state, "52:54:00:77:00:0a")
	acks := testutil.ToFloat64(edge.srv.LeaseRepliesCounter("ACK"))

	// Renewal: a unicast REQUEST from the bound address, ACKed with the lease extended.
	a.signal(t, syscall.SIGUSR1)

	renewed := a.waitEvent(t, "renew", 1)
	require.Equal(t, "10.77.0.100", renewed["ip"])
	require.Equal(t, "10.77.0.1", renewed["router"])
	require.Equal(t, acks+1, testutil.ToFloat64(edge.srv.LeaseRepliesCounter("ACK")), "one ACK for the renewal")
	require.True(t, persistedExpiry(t, state, "52:54:00:77:00:0a").After(first), "the renewal extends the persisted lease")

	// Release: the edge ends the lease at once (kept, expired, in the file).
	a.signal(t, syscall.SIGUSR2)
	a.waitEvent(t, "deconfig", 2) // one when udhcpc starts, one on release

	deadline := time.Now().Add(10 * time.Second)
	for persistedExpiry(t, state, "52:54:00:77:00:0a").After(time.Now()) {
		require.True(t, time.Now().Before(deadline), "the RELEASE is not honoured: the lease still runs")
		time.Sleep(20 * time.Millisecond) // polling the lease file
	}

	// Two more clients on a pool of two: the first takes the address nobody held, the second the released one
	// (without the RELEASE it would find the pool exhausted).
	ip, _ := seg.udhcpc(t, "52:54:00:77:00:0b")
	require.Equal(t, "10.77.0.101", ip)

	ip, _ = seg.udhcpc(t, "52:54:00:77:00:0c")
	require.Equal(t, "10.77.0.100", ip, "the released address")

	// The reservation, with the same options.
	r := seg.startUdhcpc(t, "52:54:00:77:00:42")
	got := r.waitEvent(t, "bound", 1)
	require.Equal(t, "10.77.0.42", got["ip"])
	require.Equal(t, "10.77.0.1", got["router"])
	require.Equal(t, "10.77.0.53,10.77.0.54", got["dns"])
}
