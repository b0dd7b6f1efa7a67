package bench_test

import (
	"bufio"
	"bytes"
	"context"
	"crypto/rand"
	"encoding/binary"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/insomniacslk/dhcp/dhcpv4"
	pintftp "github.com/pin/tftp/v3"
	"github.com/vishvananda/netns"

	"github.com/outpost-metal/outpost/qemu/bootlab"
)

const (
	// pace is the DISCOVERs sent per millisecond.
	pace     = 8
	serverIP = "10.78.0.2"
	clientIP = "10.78.0.50"
	blksize  = 1468
)

// storm is the outcome of one PXE storm against one server.
type storm struct {
	clients    int
	answered   int
	elapsed    time.Duration
	latencies  []time.Duration // DISCOVER -> OFFER and REQUEST -> ACK, each
	tftp1MiB   time.Duration
	unanswered int
}

func (s storm) perSecond() float64 { return float64(s.answered) / s.elapsed.Seconds() }

func (s storm) pct(p float64) time.Duration {
	if len(s.latencies) == 0 {
		return 0
	}

	l := slices.Clone(s.latencies)
	slices.Sort(l)

	return l[min(len(l)-1, int(float64(len(l))*p))]
}

// topology is a server namespace and a client namespace joined by a veth pair.
type topology struct {
	serverNS, clientNS string
	dir                string
}

func newTopology(b *testing.B) *topology {
	b.Helper()

	sfx := make([]byte, 3)
	_, _ = rand.Read(sfx) //nolint:errcheck

	tp := &topology{serverNS: fmt.Sprintf("ob-bsrv-%x", sfx), clientNS: fmt.Sprintf("ob-bcli-%x", sfx), dir: b.TempDir()}

	for _, ns := range []string{tp.serverNS, tp.clientNS} {
		bootlab.Run(b, "ip", "netns", "add", ns)
		b.Cleanup(func() { exec.Command("ip", "netns", "del", ns).Run() }) //nolint:errcheck
	}

	for _, args := range [][]string{
		{"-n", tp.serverNS, "link", "set", "lo", "up"},
		{"-n", tp.clientNS, "link", "set", "lo", "up"},
		{"-n", tp.serverNS, "link", "add", "srv0", "type", "veth", "peer", "name", "cli0", "netns", tp.clientNS},
		{"-n", tp.serverNS, "addr", "add", serverIP + "/24", "dev", "srv0"},
		{"-n", tp.clientNS, "addr", "add", clientIP + "/24", "dev", "cli0"},
		{"-n", tp.serverNS, "link", "set", "srv0", "up"},
		{"-n", tp.clientNS, "link", "set", "cli0", "up"},
	} {
		bootlab.Run(b, "ip", args...)
	}

	return tp
}

// inClientNS runs fn on a thread switched into the client namespace; sockets fn creates live there.
// The thread is discarded afterwards (the goroutine exits still locked).
func (tp *topology) inClientNS(fn func() error) error {
	errc := make(chan error, 1)

	go func() {
		runtime.LockOSThread()

		ns, err := netns.GetFromName(tp.clientNS)
		if err != nil {
			errc <- err

			return
		}
		defer ns.Close() //nolint:errcheck

		if err := netns.Set(ns); err != nil {
			errc <- err

			return
		}

		errc <- fn()
	}()

	return <-errc
}

// startServer starts a server process in the server namespace and stops it when stop is called.
func (tp *topology) startServer(b *testing.B, name string, args ...string) (stop func()) {
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

	return func() {
		_ = cmd.Process.Signal(syscall.SIGTERM) //nolint:errcheck

		done := make(chan struct{})
		go func() { _ = cmd.Wait(); close(done) }() //nolint:errcheck

		select {
		case <-done:
		case <-time.After(5 * time.Second):
			_ = cmd.Process.Kill() //nolint:errcheck
			<-done
		}

		logf.Close() //nolint:errcheck
	}
}

// BenchmarkPXEStorm sends N distinct PXE clients (DISCOVER on 67, then REQUEST on 4011) at the edge's
// ProxyDHCP and, in the same topology, at dnsmasq in proxy mode, and fetches a 1 MiB file over TFTP from
// each at the same blksize. N is OUTPOST_BENCH_CLIENTS (default 1000).
func BenchmarkPXEStorm(b *testing.B) {
	if os.Geteuid() != 0 {
		b.Skip("needs root for network namespaces")
	}

	for _, tool := range []string{"ip", "dnsmasq"} {
		if _, err := exec.LookPath(tool); err != nil {
			b.Skipf("%s not installed", tool)
		}
	}

	clients := 1000
	if v, err := strconv.Atoi(os.Getenv("OUTPOST_BENCH_CLIENTS")); err == nil && v > 0 {
		clients = v
	}

	tp := newTopology(b)
	root := bootlab.RepoRoot(b)
	edgeBin := bootlab.GoBuild(b, root, "./qemu/bootlab/labedge", filepath.Join(tp.dir, "labedge"))

	// The served files: a 1 MiB "ipxe.efi" for the TFTP comparison.
	files := filepath.Join(tp.dir, "tftp")
	if err := os.MkdirAll(files, 0o755); err != nil {
		b.Fatal(err)
	}

	payload := make([]byte, 1<<20)
	_, _ = rand.Read(payload) //nolint:errcheck

	for _, n := range []string{"ipxe.efi", "undionly.kpxe"} {
		if err := os.WriteFile(filepath.Join(files, n), payload, 0o644); err != nil {
			b.Fatal(err)
		}
	}

	servers := []struct {
		name string
		args []string
	}{
		{"edge", []string{edgeBin, "-iface", "srv0", "-ip", serverIP, "-state", filepath.Join(tp.dir, "state"),
			"-assets", filepath.Join(tp.dir, "assets"), "-ipxe-dir", files, "-log-level", "warn"}},
		{"dnsmasq", []string{"dnsmasq", "--keep-in-foreground", "--conf-file=/dev/null", "--no-resolv", "--no-hosts", "--port=0",
			"--interface=srv0", "--bind-interfaces", "--user=root", "--pid-file=", "--dhcp-range=10.78.0.0,proxy",
			"--pxe-service=X86-64_EFI,Outpost,ipxe.efi", "--pxe-service=x86PC,Outpost,undionly",
			"--enable-tftp", "--tftp-root=" + files, "--quiet-dhcp", "--log-facility=-"}},
	}

	results := map[string]*storm{}

	for _, srv := range servers {
		stop := tp.startServer(b, srv.name, srv.args...)

		total := &storm{}

		for i := range b.N {
			s, err := tp.runStorm(clients, byte(i))
			if err != nil {
				stop()
				b.Fatalf("%s: %v", srv.name, err)
			}

			total.clients += s.clients
			total.answered += s.answered
			total.unanswered += s.unanswered
			total.elapsed += s.elapsed
			total.latencies = append(total.latencies, s.latencies...)
		}

		if err := tp.inClientNS(func() error {
			d, err := tftpFetch(payload)
			total.tftp1MiB = d

			if srv.name == "edge" {
				printDrops()
			}

			return err
		}); err != nil {
			stop()
			b.Fatalf("%s tftp: %v", srv.name, err)
		}

		stop()

		results[srv.name] = total
	}

	e, d := results["edge"], results["dnsmasq"]

	fmt.Printf("\nPXE storm, %d clients (DISCOVER on 67 + REQUEST on 4011 each), %d run(s):\n", clients, b.N)
	fmt.Printf("  %-8s %12s %10s %10s %11s %14s\n", "server", "answered/s", "p50", "p99", "unanswered", "tftp 1 MiB")

	for _, name := range []string{"edge", "dnsmasq"} {
		r := results[name]
		fmt.Printf("  %-8s %12.0f %10s %10s %11d %14s\n", name, r.perSecond(), r.pct(0.5).Round(time.Microsecond),
			r.pct(0.99).Round(time.Microsecond), r.unanswered, r.tftp1MiB.Round(time.Millisecond))
	}

	if d.perSecond() > 0 && d.tftp1MiB > 0 {
		fmt.Printf("  edge/dnsmasq: answered/s x%.2f, tftp time x%.2f (blksize %d)\n\n",
			e.perSecond()/d.perSecond(), float64(e.tftp1MiB)/float64(d.tftp1MiB), blksize)
	}

	b.ReportMetric(e.perSecond(), "edge-answered/s")
	b.ReportMetric(d.perSecond(), "dnsmasq-answered/s")
	b.ReportMetric(float64(e.pct(0.99).Microseconds()), "edge-p99-us")
	b.ReportMetric(float64(d.pct(0.99).Microseconds()), "dnsmasq-p99-us")
	b.ReportMetric(float64(e.unanswered), "edge-unanswered")
	b.ReportMetric(float64(d.unanswered), "dnsmasq-unanswered")
}

// client is one PXE client of the storm.
type client struct {
	mac            net.HardwareAddr
	xid            dhcpv4.TransactionID
	discoverSent   time.Time
	offerAt, ackAt time.Time
	requestSent    time.Time
	bootItem       []byte
}

// runStorm runs one storm: every client DISCOVERs, and REQUESTs on 4011 as soon as its OFFER arrives.
func (tp *topology) runStorm(n int, run byte) (storm, error) {
	var (
		conn net.PacketConn
		err  error
	)

	if err := tp.inClientNS(func() error {
		conn, err = listenBroadcast("cli0", dhcpv4.ClientPort)

		return err
	}); err != nil {
		return storm{}, err
	}
	defer conn.Close() //nolint:errcheck

	clients := make([]*client, n)
	byXID := map[dhcpv4.TransactionID]*client{}

	for i := range clients {
		c := &client{mac: net.HardwareAddr{0x02, 0x78, run, byte(i >> 16), byte(i >> 8), byte(i)}}
		binary.BigEndian.PutUint32(c.xid[:], uint32(run)<<24|uint32(i))
		clients[i] = c
		byXID[c.xid] = c
	}

	var mu sync.Mutex

	pxeAddr := &net.UDPAddr{IP: net.ParseIP(serverIP), Port: 4011}
	done := make(chan struct{})

	go func() {
		defer close(done)

		buf := make([]byte, 1500)

		for {
			if err := conn.SetReadDeadline(time.Now().Add(2 * time.Second)); err != nil {
				return
			}

			nr, _, err := conn.ReadFrom(buf)
			if err != nil {
				return // quiet for 2 s: the storm is over
			}

			p, err := dhcpv4.FromBytes(buf[:nr])
			if err != nil || p.OpCode != dhcpv4.OpcodeBootReply {
				continue
			}

			mu.Lock()
			c := byXID[p.TransactionID]

			switch {
			case c == nil:
			case p.MessageType() == dhcpv4.MessageTypeOffer && c.offerAt.IsZero():
				c.offerAt = time.Now()
				c.bootItem = firstBootItem(p.Options.Get(dhcpv4.OptionVendorSpecificInformation))
				c.requestSent = time.Now()
				req := packet(c, dhcpv4.MessageTypeRequest)
				mu.Unlock()

				_, _ = conn.WriteTo(req, pxeAddr) //nolint:errcheck

				continue
			case p.MessageType() == dhcpv4.MessageTypeAck && c.ackAt.IsZero():
				c.ackAt = time.Now()
			}
			mu.Unlock()
		}
	}()

	bcast := &net.UDPAddr{IP: net.IPv4bcast, Port: dhcpv4.ServerPort}
	start := time.Now()

	for i, c := range clients {
		mu.Lock()
		c.discoverSent = time.Now()
		disc := packet(c, dhcpv4.MessageTypeDiscover)
		mu.Unlock()

		if _, err := conn.WriteTo(disc, bcast); err != nil {
			return storm{}, fmt.Errorf("send discover: %w", err)
		}

		if i%pace == pace-1 {
			time.Sleep(time.Millisecond) // a storm of machines powering on, spread a little: about pace*1000 packets/s
		}
	}

	<-done

	s := storm{clients: n}

	mu.Lock()
	defer mu.Unlock()

	last := start

	for _, c := range clients {
		if c.ackAt.IsZero() {
			s.unanswered++

			continue
		}

		s.answered++
		s.latencies = append(s.latencies, c.offerAt.Sub(c.discoverSent), c.ackAt.Sub(c.requestSent))

		if c.ackAt.After(last) {
			last = c.ackAt
		}
	}

	s.elapsed = last.Sub(start)
	if s.elapsed <= 0 {
		s.elapsed = time.Millisecond
	}

	return s, nil
}

func packet(c *client, mt dhcpv4.MessageType) []byte {
	arch := []byte{0, 7}
	guid := append([]byte{0}, c.mac...)
	guid = append(guid, make([]byte, 10)...)

	mods := []dhcpv4.Modifier{
		dhcpv4.WithHwAddr(c.mac), dhcpv4.WithTransactionID(c.xid), dhcpv4.WithMessageType(mt),
		dhcpv4.WithGeneric(dhcpv4.OptionClientSystemArchitectureType, arch),
		dhcpv4.WithGeneric(dhcpv4.OptionClassIdentifier, []byte("PXEClient:Arch:00007:UNDI:003000")),
		dhcpv4.WithGeneric(dhcpv4.OptionClientMachineIdentifier, guid),
		dhcpv4.WithGeneric(dhcpv4.OptionClientNetworkInterfaceIdentifier, []byte{1, 3, 0}),
	}

	if mt == dhcpv4.MessageTypeRequest {
		mods = append(mods, dhcpv4.WithClientIP(net.ParseIP(clientIP)))
		if c.bootItem != nil {
			mods = append(mods, dhcpv4.WithGeneric(dhcpv4.OptionVendorSpecificInformation, append(append([]byte{71, 4}, c.bootItem...), 0, 0, 255)))
		}
	}

	p, err := dhcpv4.New(mods...)
	if err != nil {
		panic(err) // static modifiers: a failure is a bug in this benchmark
	}

	return p.ToBytes()
}

// firstBootItem returns the type of the first PXE boot menu item (PXE 2.1 option 43 sub-option 9), or nil.
func firstBootItem(opt43 []byte) []byte {
	for len(opt43) >= 2 {
		code, n := opt43[0], int(opt43[1])
		if code == 255 || len(opt43) < 2+n {
			return nil
		}

		if code == 9 && n >= 2 {
			return bytes.Clone(opt43[2:4])
		}

		opt43 = opt43[2+n:]
	}

	return nil
}

// listenBroadcast opens a UDP socket on port bound to iface that can send and receive broadcasts.
func listenBroadcast(iface string, port int) (net.PacketConn, error) {
	lc := net.ListenConfig{Control: func(_, _ string, c syscall.RawConn) error {
		var serr error

		err := c.Control(func(fd uintptr) {
			serr = syscall.SetsockoptInt(int(fd), syscall.SOL_SOCKET, syscall.SO_BROADCAST, 1)
			if serr == nil {
				serr = syscall.SetsockoptInt(int(fd), syscall.SOL_SOCKET, syscall.SO_REUSEADDR, 1)
			}

			if serr == nil {
				serr = syscall.SetsockoptString(int(fd), syscall.SOL_SOCKET, syscall.SO_BINDTODEVICE, iface)
			}

			if serr == nil {
				serr = syscall.SetsockoptInt(int(fd), syscall.SOL_SOCKET, syscall.SO_RCVBUFFORCE, 8<<20)
			}
		})
		if err != nil {
			return err
		}

		return serr
	}}

	return lc.ListenPacket(context.Background(), "udp4", "0.0.0.0:"+strconv.Itoa(port))
}

// tftpFetch fetches ipxe.efi at blksize 1468 three times and returns the median time.
func tftpFetch(want []byte) (time.Duration, error) {
	var times []time.Duration

	for range 3 {
		c, err := pintftp.NewClient(serverIP + ":69")
		if err != nil {
			return 0, err
		}

		c.SetBlockSize(blksize)
		c.SetTimeout(2 * time.Second)

		start := time.Now()

		wt, err := c.Receive("ipxe.efi", "octet")
		if err != nil {
			return 0, fmt.Errorf("tftp request: %w", err)
		}

		var buf bytes.Buffer
		if _, err := wt.WriteTo(&buf); err != nil {
			return 0, fmt.Errorf("tftp transfer: %w", err)
		}

		times = append(times, time.Since(start))

		if !bytes.Equal(buf.Bytes(), want) {
			return 0, fmt.Errorf("tftp fetched %d bytes that differ from the file", buf.Len())
		}
	}

	slices.Sort(times)

	return times[1], nil
}

// printDrops prints the edge's ProxyDHCP counters (from its /metrics), to explain unanswered clients.
// It must run on a thread in the client namespace: the socket is made by Dial in this goroutine.
func printDrops() {
	conn, err := net.DialTimeout("tcp", serverIP+":80", 2*time.Second)
	if err != nil {
		fmt.Println("  edge metrics:", err)

		return
	}
	defer conn.Close() //nolint:errcheck

	if _, err := fmt.Fprintf(conn, "GET /metrics HTTP/1.0\r\nHost: %s\r\n\r\n", serverIP); err != nil {
		fmt.Println("  edge metrics:", err)

		return
	}

	resp, err := http.ReadResponse(bufio.NewReader(conn), nil)
	if err != nil {
		fmt.Println("  edge metrics:", err)

		return
	}
	defer resp.Body.Close() //nolint:errcheck

	sc := bufio.NewScanner(resp.Body)
	for sc.Scan() {
		if strings.HasPrefix(sc.Text(), "outpost_dhcp_dropped_total") || strings.HasPrefix(sc.Text(), "outpost_dhcp_replies_total") {
			fmt.Println("  edge:", sc.Text())
		}
	}
}
