//go:build linux

package dhcp_test

import (
	"context"
	"fmt"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/stretchr/testify/require"
	"github.com/vishvananda/netns"
	"go.uber.org/zap/zaptest"

	"github.com/outpost-metal/outpost/edge/dhcp"
	bootpb "github.com/outpost-metal/outpost/shared/api/boot"
)

// segment is the site network: the edge's namespace (10.77.0.2/24 on its veth end), the clients' namespace
// with a bridge (the clients' interface) joining the edge's veth pair and a third namespace's, where a second
// DHCP server can be started (a packet a client sends from the bridge never reaches a server on the same host
// end, so the other server gets its own).
type segment struct {
	edgeNS, clientNS, rogueNS string
	edgeIf, clientIf, rogueIf string
	handle                    netns.NsHandle
}

func run(t *testing.T, args ...string) string {
	t.Helper()

	out, err := exec.Command(args[0], args[1:]...).CombinedOutput()
	require.NoError(t, err, "%s: %s", strings.Join(args, " "), out)

	return string(out)
}

func newSegment(t *testing.T) *segment {
	t.Helper()

	id := fmt.Sprintf("%d", os.Getpid()%100000)
	s := &segment{
		edgeNS: "opdhcp-e" + id, clientNS: "opdhcp-c" + id, rogueNS: "opdhcp-r" + id,
		edgeIf: "ope" + id, clientIf: "opb" + id, rogueIf: "opr" + id,
	}

	for _, ns := range []string{s.edgeNS, s.clientNS, s.rogueNS} {
		run(t, "ip", "netns", "add", ns)
		t.Cleanup(func() { _ = exec.Command("ip", "netns", "del", ns).Run() })
	}

	run(t, "ip", "-n", s.clientNS, "link", "add", s.clientIf, "type", "bridge", "forward_delay", "0")
	run(t, "ip", "-n", s.clientNS, "link", "set", s.clientIf, "up")

	for _, end := range []struct{ ns, name, port string }{{s.edgeNS, s.edgeIf, "opx" + id}, {s.rogueNS, s.rogueIf, "opy" + id}} {
		run(t, "ip", "-n", end.ns, "link", "add", end.name, "type", "veth", "peer", "name", end.port, "netns", s.clientNS)
		run(t, "ip", "-n", s.clientNS, "link", "set", end.port, "master", s.clientIf)
		run(t, "ip", "-n", s.clientNS, "link", "set", end.port, "up")
		run(t, "ip", "-n", end.ns, "link", "set", end.name, "up")
	}

	run(t, "ip", "-n", s.edgeNS, "addr", "add", "10.77.0.2/24", "dev", s.edgeIf)

	h, err := netns.GetFromName(s.edgeNS)
	require.NoError(t, err)
	t.Cleanup(func() { h.Close() }) //nolint:errcheck

	s.handle = h

	return s
}

// enter runs fn on a thread inside the edge's namespace: sockets opened there stay there.
func (s *segment) enter(fn func() error) error {
	runtime.LockOSThread()

	orig, err := netns.Get()
	if err != nil {
		runtime.UnlockOSThread()

		return err
	}
	defer orig.Close() //nolint:errcheck

	if err := netns.Set(s.handle); err != nil {
		runtime.UnlockOSThread()

		return err
	}

	ferr := fn()

	if err := netns.Set(orig); err == nil {
		runtime.UnlockOSThread() // a thread that could not go back is left locked, so the runtime retires it
	}

	return ferr
}

var leaseLine = regexp.MustCompile(`lease of (\d+\.\d+\.\d+\.\d+) obtained from (\d+\.\d+\.\d+\.\d+)`)

// udhcpc runs busybox's DHCP client once in the clients' namespace as mac and returns the address it got and
// the server it got it from.
func (s *segment) udhcpc(t *testing.T, mac string) (ip, server string) {
	t.Helper()

	run(t, "ip", "-n", s.clientNS, "link", "set", s.clientIf, "address", mac)

	script := filepath.Join(t.TempDir(), "script")
	require.NoError(t, os.WriteFile(script, []byte("#!/bin/sh\nexit 0\n"), 0o700))

	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()

	// -q: quit once bound; -n: fail when nothing is obtained; -t/-T: 6 discovers a second apart.
	out, err := exec.CommandContext(ctx, "ip", "netns", "exec", s.clientNS, "busybox", "udhcpc",
		"-i", s.clientIf, "-f", "-q", "-n", "-t", "6", "-T", "1", "-s", script).CombinedOutput()
	require.NoError(t, err, "udhcpc: %s", out)

	m := leaseLine.FindStringSubmatch(string(out))
	require.NotNil(t, m, "udhcpc said: %s", out)

	return m[1], m[2]
}

type fixedSite struct{ d *bootpb.DHCP }

func (f fixedSite) DHCP() *bootpb.DHCP { return f.d }

// edgeServer is the real server with its sockets in the edge's namespace.
type edgeServer struct {
	srv   *dhcp.Server
	guard *dhcp.Guard
	stop  func()
}

func (s *segment) startEdge(t *testing.T, stateDir string, site *bootpb.DHCP) *edgeServer {
	t.Helper()

	log := zaptest.NewLogger(t)

	leases, err := dhcp.OpenLeases(stateDir, log)
	require.NoError(t, err)

	var (
		probe  *dhcp.ARPProber
		conns  [2]net.PacketConn
		hwaddr net.HardwareAddr
	)

	cfg := dhcp.Default()
	cfg.Interface, cfg.ServerIP = s.edgeIf, "10.77.0.2"

	require.NoError(t, s.enter(func() error {
		ifi, err := net.InterfaceByName(s.edgeIf)
		if err != nil {
			return err
		}

		hwaddr = ifi.HardwareAddr

		if probe, err = dhcp.NewARPProber(s.edgeIf); err != nil {
			return err
		}

		for i, port := range []int{cfg.Port, cfg.PXEPort} {
			if conns[i], err = dhcp.ListenPacket(t.Context(), s.edgeIf, port, 0); err != nil {
				return err
			}
		}

		return nil
	}))

	probe.Enter = s.enter

	var srv *dhcp.Server

	guard, err := dhcp.NewGuard(dhcp.GuardConfig{Interval: dhcp.Default().GuardInterval}, log, dhcp.RawDiscoverer{Interface: s.edgeIf, Window: 2 * time.Second, Enter: s.enter},
		dhcp.GuardMAC(hwaddr), func() bool { return srv.FullWanted() }, nil)
	require.NoError(t, err)

	srv, err = dhcp.New(cfg, log, dhcp.Deps{Site: fixedSite{site}, Leases: leases, Probe: probe, Guard: guard})
	require.NoError(t, err)

	// Before serving: the segment is checked (Guard.Run does this first, then every interval).
	guard.Check(t.Context())

	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan error, 1)

	go func() { done <- srv.Serve(ctx, conns[0], conns[1]) }()

	e := &edgeServer{srv: srv, guard: guard}
	e.stop = func() {
		cancel()
		require.NoError(t, <-done)

		for _, c := range conns {
			require.NoError(t, c.Close())
		}
	}

	return e
}

// The edge in full DHCP mode, judged by busybox's udhcpc: an address from the pool, the reservation for its
// MAC, the lease kept over a restart of the edge's server; then a second DHCP server (dnsmasq) on the segment
// is found and named, and the edge stops offering addresses.
func TestFullModeOverVeth(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root: creates network namespaces and a veth pair")
	}

	for _, tool := range []string{"ip", "busybox", "dnsmasq"} {
		if _, err := exec.LookPath(tool); err != nil {
			t.Skipf("needs %s (Debian iproute2, busybox-static, dnsmasq)", tool)
		}
	}

	seg := newSegment(t)
	state := t.TempDir()

	site := &bootpb.DHCP{
		Mode: bootpb.DHCPMode_DHCP_MODE_FULL, Subnet: "10.77.0.0/24", PoolStart: "10.77.0.100", PoolEnd: "10.77.0.120",
		Gateway: "10.77.0.1", Dns: []string{"10.77.0.53"}, LeaseSeconds: 600,
		Reservations: []*bootpb.DHCPReservation{{Mac: "52:54:00:77:00:42", Ip: "10.77.0.42"}},
	}

	edge := seg.startEdge(t, state, site)
	require.True(t, edge.guard.Clear(), "no other server on the segment")

	ip, server := seg.udhcpc(t, "52:54:00:77:00:01")
	require.Equal(t, "10.77.0.100", ip)
	require.Equal(t, "10.77.0.2", server)

	ip, _ = seg.udhcpc(t, "52:54:00:77:00:42")
	require.Equal(t, "10.77.0.42", ip, "the reservation")

	edge.stop()

	// A restarted server (its leases read back from the state directory) keeps the first client's lease: a new
	// client gets the next address, the first its own.
	edge = seg.startEdge(t, state, site)

	ip, _ = seg.udhcpc(t, "52:54:00:77:00:02")
	require.Equal(t, "10.77.0.101", ip)

	ip, _ = seg.udhcpc(t, "52:54:00:77:00:01")
	require.Equal(t, "10.77.0.100", ip, "kept over the restart")

	// A host that took the next pool address by hand answers the edge's ARP probe: the address is skipped.
	run(t, "ip", "-n", seg.rogueNS, "addr", "add", "10.77.0.3/24", "dev", seg.rogueIf)
	run(t, "ip", "-n", seg.rogueNS, "addr", "add", "10.77.0.102/24", "dev", seg.rogueIf)

	ip, _ = seg.udhcpc(t, "52:54:00:77:00:04")
	require.Equal(t, "10.77.0.103", ip, "10.77.0.102 answers ARP")

	// A second server on the segment (its host's address was given above).

	dnsmasq := exec.Command("ip", "netns", "exec", seg.rogueNS, "dnsmasq", "--no-daemon", "--conf-file=/dev/null", "--port=0",
		"--interface="+seg.rogueIf, "--bind-interfaces", "--dhcp-range=10.77.0.150,10.77.0.160,2m", "--no-ping",
		"--dhcp-leasefile="+filepath.Join(t.TempDir(), "leases"), "--pid-file=")
	require.NoError(t, dnsmasq.Start())
	t.Cleanup(func() { _ = dnsmasq.Process.Kill(); _ = dnsmasq.Wait() })

	// The periodic check, polled until dnsmasq is up and answers.
	require.Eventually(t, func() bool {
		edge.guard.Check(t.Context())

		return !edge.guard.Clear()
	}, 30*time.Second, 100*time.Millisecond, "the guard finds dnsmasq")

	other := edge.guard.Other()
	require.Equal(t, netip.MustParseAddr("10.77.0.3"), other.Addr)
	require.Equal(t, netip.MustParseAddr("10.77.0.3"), other.ServerID)

	offers := testutil.ToFloat64(edge.srv.LeaseRepliesCounter("OFFER"))

	// A client reaches both servers; only dnsmasq answers now.
	ip, server = seg.udhcpc(t, "52:54:00:77:00:03")
	require.Equal(t, "10.77.0.3", server, "only the other server offers: got %s", ip)
	require.Equal(t, offers, testutil.ToFloat64(edge.srv.LeaseRepliesCounter("OFFER")), "the edge offers nothing")

	edge.stop()
}
