package bench_test

import (
	"crypto/rand"
	"encoding/binary"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/insomniacslk/dhcp/dhcpv4"

	"github.com/outpost-metal/outpost/qemu/bootlab"
)

// The lease storm's site: a /16 (room for many storms), the pool 10.79.1.0-10.79.200.255.
const (
	leaseServerIP = "10.79.0.2"
	leaseClientIP = "10.79.0.50" // the storm's socket; outside the pool
	leaseSubnet   = "10.79.0.0/16"
	leasePoolLow  = "10.79.1.0"
	leasePoolHigh = "10.79.200.255"
	leaseGateway  = "10.79.0.1"
	// leaseWindow is the exchanges in flight at once (a closed loop: a new client starts as one is bound); it
	// stays under the edge's pending-offer bound (64) so that no offer is withdrawn mid-exchange.
	leaseWindow = 32
	// leaseRetry is how long an exchange waits for a reply before it sends again; leaseTries how often.
	leaseRetry = time.Second
	leaseTries = 5
	// keaAnchor is Kea's published single-threaded figure (memfile backend), leases per second.
	keaAnchor = "11.7k"
)

// leaseStorm is the outcome of one storm of DISCOVER/REQUEST exchanges against one server.
type leaseStorm struct {
	bound, failed, naks, resent int
	elapsed                     time.Duration
	cpu                         time.Duration // the server process's user+system time during the storm
}

// BenchmarkLeaseStorm binds N distinct clients (DISCOVER, OFFER, REQUEST, ACK each; leaseWindow exchanges in
// flight) through the edge's DHCP server in full mode and, on the same veth pair and pool, through dnsmasq,
// and reports leases per second and each server's CPU time per lease (from /proc/<pid>/stat, the same way for
// both). N is OUTPOST_BENCH_LEASES (default 2000). Neither server probes an address before offering it.
func BenchmarkLeaseStorm(b *testing.B) {
	if os.Geteuid() != 0 {
		b.Skip("needs root for network namespaces")
	}

	for _, tool := range []string{"ip", "dnsmasq"} {
		if _, err := exec.LookPath(tool); err != nil {
			b.Skipf("%s not installed (Debian iproute2, dnsmasq)", tool)
		}
	}

	clients := 2000
	if v, err := strconv.Atoi(os.Getenv("OUTPOST_BENCH_LEASES")); err == nil && v > 0 {
		clients = min(v, 1<<14)
	}

	tp := newLeaseTopology(b)
	root := bootlab.RepoRoot(b)
	edgeBin := bootlab.GoBuild(b, root, "./hack/bench/fulldhcp", filepath.Join(tp.dir, "fulldhcp"))

	servers := []struct {
		name string
		args []string
	}{
		{"edge", []string{edgeBin, "-iface", "srv0", "-ip", leaseServerIP, "-state", filepath.Join(tp.dir, "edge-state"),
			"-subnet", leaseSubnet, "-pool-start", leasePoolLow, "-pool-end", leasePoolHigh, "-gateway", leaseGateway}},
		{"dnsmasq", []string{"dnsmasq", "--keep-in-foreground", "--conf-file=/dev/null", "--no-resolv", "--no-hosts", "--port=0",
			"--interface=srv0", "--bind-interfaces", "--user=root", "--pid-file=",
			"--dhcp-range=" + leasePoolLow + "," + leasePoolHigh + ",255.255.0.0,1h", "--dhcp-option=3," + leaseGateway,
			"--dhcp-lease-max=100000", "--no-ping", "--dhcp-leasefile=" + filepath.Join(tp.dir, "dnsmasq.leases"),
			"--quiet-dhcp", "--log-facility=-"}},
	}

	results := map[string]*leaseStorm{}

	for si, srv := range servers {
		pid, stop := tp.startServerPID(b, srv.name, srv.args...)

		// Ready: one client bound (retried until the server answers), not counted.
		if _, err := tp.runLeaseStorm(1, byte(0xf0+si), pid); err != nil {
			stop()
			b.Fatalf("%s: %v", srv.name, err)
		}

		total := &leaseStorm{}

		for i := range b.N {
			s, err := tp.runLeaseStorm(clients, byte(si*64+i%64), pid)
			if err != nil {
				stop()
				b.Fatalf("%s: %v", srv.name, err)
			}

			total.bound += s.bound
			total.failed += s.failed
			total.naks += s.naks
			total.resent += s.resent
			total.elapsed += s.elapsed
			total.cpu += s.cpu
		}

		stop()

		results[srv.name] = total
	}

	fmt.Printf("\nLease storm, full DHCP mode: %d clients x %d run(s), DISCOVER/OFFER/REQUEST/ACK each, %d in flight, no address probe (anchor: Kea %s leases/s single-threaded, published)\n",
		clients, b.N, leaseWindow, keaAnchor)
	fmt.Printf("  %-8s %10s %14s %8s %6s %8s\n", "server", "leases/s", "cpu/lease", "failed", "naks", "resent")

	for _, name := range []string{"edge", "dnsmasq"} {
		r := results[name]
		fmt.Printf("  %-8s %10.0f %14s %8d %6d %8d\n", name, r.perSecond(), r.cpuPerLease().Round(time.Microsecond/10), r.failed, r.naks, r.resent)
	}

	e, d := results["edge"], results["dnsmasq"]
	if d.perSecond() > 0 && d.cpuPerLease() > 0 {
		fmt.Printf("  edge/dnsmasq: leases/s x%.2f, cpu/lease x%.2f (each ACK waits until its lease is on disk; writes are grouped)\n\n",
			e.perSecond()/d.perSecond(), float64(e.cpuPerLease())/float64(d.cpuPerLease()))
	}

	b.ReportMetric(e.perSecond(), "edge-leases/s")
	b.ReportMetric(d.perSecond(), "dnsmasq-leases/s")
	b.ReportMetric(float64(e.cpuPerLease().Microseconds()), "edge-cpu-us/lease")
	b.ReportMetric(float64(d.cpuPerLease().Microseconds()), "dnsmasq-cpu-us/lease")
	b.ReportMetric(float64(e.failed), "edge-failed")
	b.ReportMetric(float64(d.failed), "dnsmasq-failed")
}

func (s *leaseStorm) perSecond() float64 {
	if s.elapsed <= 0 {
		return 0
	}

	return float64(s.bound) / s.elapsed.Seconds()
}

func (s *leaseStorm) cpuPerLease() time.Duration {
	if s.bound == 0 {
		return 0
	}

	return s.cpu / time.Duration(s.bound)
}

func newLeaseTopology(b *testing.B) *topology {
	b.Helper()

	sfx := make([]byte, 3)
	_, _ = rand.Read(sfx) //nolint:errcheck

	tp := &topology{serverNS: fmt.Sprintf("ob-lsrv-%x", sfx), clientNS: fmt.Sprintf("ob-lcli-%x", sfx), dir: b.TempDir()}

	for _, ns := range []string{tp.serverNS, tp.clientNS} {
		bootlab.Run(b, "ip", "netns", "add", ns)
		b.Cleanup(func() { exec.Command("ip", "netns", "del", ns).Run() }) //nolint:errcheck
	}

	for _, args := range [][]string{
		{"-n", tp.serverNS, "link", "set", "lo", "up"},
		{"-n", tp.clientNS, "link", "set", "lo", "up"},
		{"-n", tp.serverNS, "link", "add", "srv0", "type", "veth", "peer", "name", "cli0", "netns", tp.clientNS},
		{"-n", tp.serverNS, "addr", "add", leaseServerIP + "/16", "dev", "srv0"},
		{"-n", tp.clientNS, "addr", "add", leaseClientIP + "/16", "dev", "cli0"},
		{"-n", tp.serverNS, "link", "set", "srv0", "up"},
		{"-n", tp.clientNS, "link", "set", "cli0", "up"},
	} {
		bootlab.Run(b, "ip", args...)
	}

	return tp
}

// startServerPID is startServer with the server's pid (`ip netns exec` execs the server in its own process).
func (tp *topology) startServerPID(b *testing.B, name string, args ...string) (int, func()) {
	b.Helper()

	logf, err := os.Create(filepath.Join(tp.dir, name+".log"))
	if err != nil {
		b.Fatal(err)
	}

	cmd := exec.Command("ip", append([]string{"netns", "exec", tp.serverNS}, args...)...)
	cmd.Stdout, cmd.Stderr = logf, logf

	if err := cmd.Start(); err != nil {
		b.Fatalf("start %s: %v", name, err)
	}

	return cmd.Process.Pid, func() {
		_ = cmd.Process.Kill() //nolint:errcheck
		_ = cmd.Wait()         //nolint:errcheck
		logf.Close()           //nolint:errcheck
	}
}

// cpuTime is a process's user+system time so far, from /proc/<pid>/stat (fields 14 and 15, in clock ticks of
// 1/100 s: USER_HZ on Linux).
func cpuTime(pid int) (time.Duration, error) {
	raw, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0, err
	}

	// The command name (field 2) is in parentheses and may hold spaces: fields are counted after its ')'.
	i := strings.LastIndexByte(string(raw), ')')
	if i < 0 {
		return 0, errors.New("unexpected /proc stat")
	}

	f := strings.Fields(string(raw[i+1:])) // f[0] is field 3
	if len(f) < 13 {
		return 0, errors.New("short /proc stat")
	}

	utime, err1 := strconv.ParseUint(f[11], 10, 64)
	stime, err2 := strconv.ParseUint(f[12], 10, 64)

	if err := errors.Join(err1, err2); err != nil {
		return 0, err
	}

	return time.Duration(utime+stime) * 10 * time.Millisecond, nil
}

// leaseClient is one client of a lease storm.
type leaseClient struct {
	mac     net.HardwareAddr
	xid     dhcpv4.TransactionID
	request []byte // the REQUEST once OFFERed; nil: DISCOVERing
	sentAt  time.Time
	tries   int
	done    bool
}

// runLeaseStorm binds n clients (MACs 02:79:run:..) through the server in the server namespace, leaseWindow
// exchanges at a time; a NAK sends the client back to DISCOVER, silence for leaseRetry resends (leaseTries
// times in all).
func (tp *topology) runLeaseStorm(n int, run byte, pid int) (leaseStorm, error) {
	var (
		conn net.PacketConn
		err  error
	)

	if err := tp.inClientNS(func() error {
		conn, err = listenBroadcast("cli0", dhcpv4.ClientPort)

		return err
	}); err != nil {
		return leaseStorm{}, err
	}
	defer conn.Close() //nolint:errcheck

	clients := make([]*leaseClient, n)
	byXID := make(map[dhcpv4.TransactionID]*leaseClient, n)

	for i := range clients {
		c := &leaseClient{mac: net.HardwareAddr{0x02, 0x79, run, byte(i >> 16), byte(i >> 8), byte(i)}}
		binary.BigEndian.PutUint32(c.xid[:], uint32(run)<<24|uint32(i))
		clients[i] = c
		byXID[c.xid] = c
	}

	var (
		mu     sync.Mutex
		s      leaseStorm
		slots  = make(chan struct{}, leaseWindow)
		left   = n
		allEnd = make(chan struct{})
	)

	bcast := &net.UDPAddr{IP: net.IPv4bcast, Port: dhcpv4.ServerPort}

	// finish ends an exchange (under mu).
	finish := func(c *leaseClient, bound bool) {
		c.done = true

		if bound {
			s.bound++
		} else {
			s.failed++
		}

		<-slots

		if left--; left == 0 {
			close(allEnd)
		}
	}

	send := func(c *leaseClient) {
		pkt := c.request
		if pkt == nil {
			pkt = leasePacket(c, dhcpv4.MessageTypeDiscover, nil, nil)
		}

		c.sentAt = time.Now()
		c.tries++
		_, _ = conn.WriteTo(pkt, bcast) //nolint:errcheck // a lost send is resent
	}

	cpu0, err := cpuTime(pid)
	if err != nil {
		return leaseStorm{}, err
	}

	start := time.Now()
	last := start

	go func() { // replies
		buf := make([]byte, 1500)

		for {
			nr, _, err := conn.ReadFrom(buf)
			if err != nil {
				return // closed: the storm is over
			}

			p, err := dhcpv4.FromBytes(buf[:nr])
			if err != nil || p.OpCode != dhcpv4.OpcodeBootReply {
				continue
			}

			mu.Lock()

			c := byXID[p.TransactionID]

			switch {
			case c == nil || c.done:
			case p.MessageType() == dhcpv4.MessageTypeOffer && c.request == nil:
				c.request = leasePacket(c, dhcpv4.MessageTypeRequest, p.YourIPAddr, p.ServerIdentifier())
				c.tries = 0
				send(c)
			case p.MessageType() == dhcpv4.MessageTypeAck && c.request != nil:
				last = time.Now()
				finish(c, true)
			case p.MessageType() == dhcpv4.MessageTypeNak:
				s.naks++
				c.request = nil
				send(c)
			}

			mu.Unlock()
		}
	}()

	go func() { // resends
		tick := time.NewTicker(leaseRetry / 4)
		defer tick.Stop()

		for {
			select {
			case <-allEnd:
				return
			case <-tick.C:
			}

			mu.Lock()

			for _, c := range clients {
				if c.done || c.sentAt.IsZero() || time.Since(c.sentAt) < leaseRetry {
					continue
				}

				if c.tries >= leaseTries {
					finish(c, false)

					continue
				}

				s.resent++
				send(c)
			}

			mu.Unlock()
		}
	}()

	for _, c := range clients {
		slots <- struct{}{}

		mu.Lock()
		send(c)
		mu.Unlock()
	}

	select {
	case <-allEnd:
	case <-time.After(time.Duration(n)*time.Second + time.Minute):
		return leaseStorm{}, fmt.Errorf("storm of %d clients not over in time", n)
	}

	cpu1, err := cpuTime(pid)
	if err != nil {
		return leaseStorm{}, err
	}

	mu.Lock()
	defer mu.Unlock()

	if s.bound == 0 {
		return leaseStorm{}, fmt.Errorf("none of %d clients bound (%d NAKs); the server's log is in %s", n, s.naks, tp.dir)
	}

	s.elapsed, s.cpu = max(last.Sub(start), time.Millisecond), cpu1-cpu0

	return s, nil
}

// leasePacket is a client's DISCOVER, or its REQUEST for yiaddr from server (SELECTING, RFC 2131 §4.3.2);
// the broadcast flag asks both servers to broadcast their replies.
func leasePacket(c *leaseClient, mt dhcpv4.MessageType, yiaddr, server net.IP) []byte {
	mods := []dhcpv4.Modifier{
		dhcpv4.WithHwAddr(c.mac), dhcpv4.WithTransactionID(c.xid), dhcpv4.WithMessageType(mt), dhcpv4.WithBroadcast(true),
		dhcpv4.WithRequestedOptions(dhcpv4.OptionSubnetMask, dhcpv4.OptionRouter, dhcpv4.OptionDomainNameServer),
	}

	if mt == dhcpv4.MessageTypeRequest {
		mods = append(mods, dhcpv4.WithOption(dhcpv4.OptRequestedIPAddress(yiaddr)), dhcpv4.WithOption(dhcpv4.OptServerIdentifier(server)))
	}

	p, err := dhcpv4.New(mods...)
	if err != nil {
		panic(err) // static modifiers: a failure is a bug in this benchmark
	}

	return p.ToBytes()
}
