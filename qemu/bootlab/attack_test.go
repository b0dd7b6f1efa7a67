package bootlab_test

import (
	"bufio"
	"context"
	"crypto/rand"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/outpost-metal/outpost/qemu/bootlab"
)

// The attacker's addresses on the site L2 (outside the site DHCP range, 10.77.0.100-150).
const (
	attackFirst = 160
	attackLast  = 254
)

// attackerEnv names the variable that turns a run of this test binary into the lab's hostile host.
const attackerEnv = "OUTPOST_LAB_ATTACKER"

// TestLabAttackerProcess is not a test: TestNetbootOVMFUnderAttack starts it inside the attacker's network
// namespace with attackerEnv set to "<edge ip> <tftp requests per second> <slow clients>". It floods the edge's
// TFTP port with read requests for ipxe.efi from random addresses of 10.77.0.160-254 and random ports (a raw
// socket) and holds that many slow HTTP clients from those addresses, until its standard input closes. It prints
// "ATTACK tftp=<sent> slow_open=<n> slow_dials=<n>" twice a second and, before it starts and before it ends,
// "METRIC <phase> <line>" for the edge's limit, process and Go metrics.
func TestLabAttackerProcess(t *testing.T) {
	spec := os.Getenv(attackerEnv)
	if spec == "" {
		t.Skip("helper process for TestNetbootOVMFUnderAttack")
	}

	var (
		edge          string
		rate, clients int
	)

	_, err := fmt.Sscan(spec, &edge, &rate, &clients)
	require.NoError(t, err)

	scrape(edge, "before")

	ctx, cancel := context.WithCancel(context.Background())

	// Standard input closing ends the attack; the edge's metrics are read first, while it still goes on.
	go func() {
		_, _ = io.Copy(io.Discard, os.Stdin)
		scrape(edge, "under")
		cancel()
	}()

	var (
		sent      atomic.Int64
		open, dia atomic.Int64
		wg        sync.WaitGroup
	)

	wg.Go(func() {
		if err := forgedTFTPFlood(ctx, net.ParseIP(edge).To4(), rate, &sent); err != nil {
			fmt.Println("ATTACK error", err)
		}
	})
	wg.Go(func() { holdSlowClients(ctx, edge+":80", clients, &open, &dia) })
	wg.Go(func() {
		tick := time.NewTicker(500 * time.Millisecond)
		defer tick.Stop()

		for {
			select {
			case <-ctx.Done():
				return
			case <-tick.C:
				fmt.Printf("ATTACK tftp=%d slow_open=%d slow_dials=%d\n", sent.Load(), open.Load(), dia.Load())
			}
		}
	})

	<-ctx.Done()
	wg.Wait()
}

func attackAddr(n int) net.IP {
	return net.IPv4(10, 77, 0, byte(attackFirst+n%(attackLast-attackFirst+1)))
}

// forgedTFTPFlood sends rate read requests a second, each from a random attacker address and port.
func forgedTFTPFlood(ctx context.Context, dst net.IP, rate int, sent *atomic.Int64) error {
	fd, err := syscall.Socket(syscall.AF_INET, syscall.SOCK_RAW, syscall.IPPROTO_RAW)
	if err != nil {
		return fmt.Errorf("raw socket: %w", err)
	}
	defer syscall.Close(fd) //nolint:errcheck

	to := &syscall.SockaddrInet4{}
	copy(to.Addr[:], dst)

	payloads := [][]byte{
		append([]byte{0, 1}, "ipxe.efi\x00octet\x00"...),
		append([]byte{0, 1}, "ipxe.efi\x00octet\x00blksize\x001468\x00tsize\x000\x00"...),
	}
	rnd := make([]byte, 4)
	pkt := make([]byte, 0, 128)
	tick := time.NewTicker(time.Millisecond)

	defer tick.Stop()

	begin, i := time.Now(), 0

	for {
		select {
		case <-ctx.Done():
			return nil
		case now := <-tick.C:
			for due := int(now.Sub(begin).Seconds() * float64(rate)); i < due; i++ {
				_, _ = rand.Read(rnd)
				payload := payloads[i%2]

				pkt = pkt[:28]
				clear(pkt)
				pkt[0], pkt[8], pkt[9] = 0x45, 64, syscall.IPPROTO_UDP
				copy(pkt[12:16], attackAddr(int(rnd[0])).To4())
				copy(pkt[16:20], to.Addr[:])
				binary.BigEndian.PutUint16(pkt[20:], 1024+binary.BigEndian.Uint16(rnd[1:])%60000)
				binary.BigEndian.PutUint16(pkt[22:], 69)
				binary.BigEndian.PutUint16(pkt[24:], uint16(8+len(payload))) // small
				pkt = append(pkt, payload...)

				if syscall.Sendto(fd, pkt, 0, to) == nil {
					sent.Add(1)
				}
			}
		}
	}
}

// holdSlowClients keeps clients connections open with headers that never end, one line a second each.
func holdSlowClients(ctx context.Context, target string, clients int, open, dials *atomic.Int64) {
	const shards = 4

	var wg sync.WaitGroup

	for shard := range shards {
		wg.Go(func() {
			var conns []net.Conn

			defer func() {
				for _, c := range conns {
					if c != nil {
						c.Close()
					}
				}
			}()

			var locals []net.IP
			for i := shard; i < clients; i += shards {
				locals = append(locals, attackAddr(i))
			}

			conns = make([]net.Conn, len(locals))
			tick := time.NewTicker(time.Second)

			defer tick.Stop()

			for {
				for i, c := range conns {
					if ctx.Err() != nil {
						return
					}

					if c != nil {
						if _, err := io.WriteString(c, "X-Slow: 1\r\n"); err == nil {
							continue
						}

						c.Close()
						conns[i] = nil
						open.Add(-1)
					}

					dials.Add(1)

					c, err := (&net.Dialer{LocalAddr: &net.TCPAddr{IP: locals[i]}, Timeout: 2 * time.Second}).Dial("tcp", target)
					if err != nil {
						continue
					}

					if _, err := io.WriteString(c, "GET /ipxe/boot.ipxe HTTP/1.1\r\nHost: edge\r\n"); err != nil {
						c.Close()

						continue
					}

					conns[i] = c
					open.Add(1)
				}

				select {
				case <-ctx.Done():
					return
				case <-tick.C:
				}
			}
		})
	}

	wg.Wait()
}

// scrape prints the edge's limit, process and Go metrics.
func scrape(edge, phase string) {
	client := &http.Client{Timeout: 10 * time.Second}

	// A few tries: under attack the edge may close this connection to make room like any other.
	var (
		resp *http.Response
		err  error
	)

	for range 3 {
		if resp, err = client.Get("http://" + edge + "/metrics"); err == nil {
			break
		}
	}

	if err != nil {
		fmt.Printf("METRIC %s error %v\n", phase, strings.ReplaceAll(err.Error(), " ", "_"))

		return
	}
	defer resp.Body.Close()

	sc := bufio.NewScanner(resp.Body)
	for sc.Scan() {
		l := sc.Text()
		for _, p := range []string{"outpost_tftp_transfers_", "outpost_tftp_requests_total", "outpost_http_connections_", "process_open_fds", "process_resident_memory_bytes", "go_goroutines"} {
			if strings.HasPrefix(l, p) {
				fmt.Printf("METRIC %s %s\n", phase, l)
			}
		}
	}
}

// attacker is the hostile host's process and what it printed.
type attacker struct {
	mu      sync.Mutex
	status  string
	metrics map[string]map[string]float64 // phase -> metric -> value
	// scrapeErrs says why the metrics of a phase could not be read.
	scrapeErrs map[string]string
	stdin      io.Closer
	done       chan struct{}
}

func startAttacker(t *testing.T, ns, edge string, rate, clients int) *attacker {
	t.Helper()

	cmd := exec.Command("ip", "netns", "exec", ns, os.Args[0], "-test.run=^TestLabAttackerProcess$", "-test.timeout=30m")
	cmd.Env = append(os.Environ(), fmt.Sprintf("%s=%s %d %d", attackerEnv, edge, rate, clients))
	cmd.Stderr = os.Stderr

	stdin, err := cmd.StdinPipe()
	require.NoError(t, err)

	stdout, err := cmd.StdoutPipe()
	require.NoError(t, err)
	require.NoError(t, cmd.Start())

	a := &attacker{metrics: map[string]map[string]float64{}, stdin: stdin, done: make(chan struct{})}

	go func() {
		defer close(a.done)

		sc := bufio.NewScanner(stdout)
		for sc.Scan() {
			l := sc.Text()

			a.mu.Lock()

			switch {
			case strings.HasPrefix(l, "ATTACK "):
				a.status = l
			case strings.HasPrefix(l, "METRIC ") && len(strings.Fields(l)) == 4 && strings.Fields(l)[2] == "error":
				if a.scrapeErrs == nil {
					a.scrapeErrs = map[string]string{}
				}

				a.scrapeErrs[strings.Fields(l)[1]] = strings.Fields(l)[3]
			case strings.HasPrefix(l, "METRIC "):
				if f := strings.Fields(l); len(f) == 4 {
					if v, err := strconv.ParseFloat(f[3], 64); err == nil {
						if a.metrics[f[1]] == nil {
							a.metrics[f[1]] = map[string]float64{}
						}

						a.metrics[f[1]][f[2]] = v
					}
				}
			}

			a.mu.Unlock()
		}

		_ = cmd.Wait()
	}()

	t.Cleanup(a.stop)

	return a
}

func (a *attacker) field(name string) int64 {
	a.mu.Lock()
	defer a.mu.Unlock()

	for _, f := range strings.Fields(a.status) {
		if v, ok := strings.CutPrefix(f, name+"="); ok {
			n, _ := strconv.ParseInt(v, 10, 64)

			return n
		}
	}

	return 0
}

func (a *attacker) stop() {
	a.mu.Lock()
	if a.stdin != nil {
		a.stdin.Close()
		a.stdin = nil
	}
	a.mu.Unlock()

	<-a.done
}

func (a *attacker) metric(phase, name string) float64 {
	a.mu.Lock()
	defer a.mu.Unlock()

	return a.metrics[phase][name]
}

// addAttacker joins a namespace holding the attacker's addresses to the site bridge and returns its name.
func addAttacker(t *testing.T, site *bootlab.Site) string {
	t.Helper()

	ns := strings.Replace(site.NS, "ob-site-", "ob-atk-", 1)

	bootlab.Run(t, "ip", "netns", "add", ns)
	t.Cleanup(func() { exec.Command("ip", "netns", "del", ns).Run() }) //nolint:errcheck

	for _, args := range [][]string{
		{"-n", site.NS, "link", "add", "at0", "type", "veth", "peer", "name", "at1", "netns", ns},
		{"-n", site.NS, "link", "set", "at0", "master", "br0", "up"},
		{"-n", ns, "link", "set", "lo", "up"},
		{"-n", ns, "link", "set", "at1", "up"},
	} {
		bootlab.Run(t, "ip", args...)
	}

	var batch strings.Builder
	for n := attackFirst; n <= attackLast; n++ {
		fmt.Fprintf(&batch, "addr add 10.77.0.%d/24 dev at1\n", n)
	}

	batchFile := filepath.Join(site.Dir, "attacker-addrs")
	require.NoError(t, os.WriteFile(batchFile, []byte(batch.String()), 0o644))
	bootlab.Run(t, "ip", "-n", ns, "-batch", batchFile)

	return ns
}

func processRSSMiB(pid int) float64 {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return -1
	}

	for _, line := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(line, "VmRSS:"); ok {
			kb, _ := strconv.Atoi(strings.TrimSuffix(strings.TrimSpace(v), " kB"))

			return float64(kb) / 1024
		}
	}

	return -1
}

// cpuSeconds is the CPU time (user and system) a process has used so far.
func cpuSeconds(pid int) float64 {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return -1
	}

	// The fields after the command name (which may hold spaces) start with the state; utime and stime are
	// the 14th and 15th fields of the line, in clock ticks (100 a second on Linux).
	_, rest, _ := strings.Cut(string(b), ") ")
	f := strings.Fields(rest)

	if len(f) < 13 {
		return -1
	}

	ut, _ := strconv.ParseFloat(f[11], 64)
	st, _ := strconv.ParseFloat(f[12], 64)

	return (ut + st) / 100
}

func processFiles(pid int) int {
	ents, err := os.ReadDir(fmt.Sprintf("/proc/%d/fd", pid))
	if err != nil {
		return -1
	}

	return len(ents)
}

// TestNetbootOVMFUnderAttack boots a UEFI machine (OVMF's own PXE client: ipxe.efi over TFTP, then iPXE over
// HTTP) through the edge twice, one VM at a time: once on a quiet site, once while a hostile host on the site
// L2 floods the TFTP port with read requests for ipxe.efi (2,000/s, random addresses and ports) and holds
// 20,000 slow HTTP clients from 95 addresses (two attacker processes) against an HTTP bound of 1,000 connections.
func TestNetbootOVMFUnderAttack(t *testing.T) {
	bootlab.SkipUnlessLab(t, "qemu-system-x86_64", "dpkg-deb")

	for _, f := range []string{"/usr/share/OVMF/OVMF_CODE_4M.fd", "/usr/share/OVMF/OVMF_VARS_4M.fd"} {
		if _, err := os.Stat(f); err != nil {
			t.Skipf("lab test: %s missing (Debian ovmf)", f)
		}
	}

	root := bootlab.RepoRoot(t)
	ipxeDir := bootlab.IPXEFor(t)

	kernel, err := bootlab.EnsureKernel(filepath.Join(root, "_out", "bootlab"))
	if errors.Is(err, bootlab.ErrNoKernel) {
		t.Skipf("lab test: %v", err)
	}

	require.NoError(t, err)

	dir := t.TempDir()
	initBin := bootlab.GoBuild(t, root, "./qemu/bootlab/testinit", filepath.Join(dir, "init"))
	edgeBin := bootlab.GoBuild(t, root, "./qemu/bootlab/labedge", filepath.Join(dir, "labedge"))

	agentDir := filepath.Join(dir, "assets", "agent", "x86_64")
	require.NoError(t, os.MkdirAll(agentDir, 0o755))

	vmlinuz, err := os.ReadFile(kernel.Vmlinuz)
	require.NoError(t, err)
	require.NoError(t, os.WriteFile(filepath.Join(agentDir, "vmlinuz"), vmlinuz, 0o644))

	initData, err := os.ReadFile(initBin)
	require.NoError(t, err)

	initrd, err := os.Create(filepath.Join(agentDir, "initramfs.xz"))
	require.NoError(t, err)
	require.NoError(t, bootlab.BuildInitramfs(initrd, initData, kernel.ModulesDir, []string{"virtio_pci", "virtio_net", "virtio_rng"}))
	require.NoError(t, initrd.Close())

	site := bootlab.NewSite(t, bootlab.SiteOptions{})
	atk := addAttacker(t, site)

	lines := make(chan string, 64)
	edge := site.Start(t, "edge", lines, "ip", "netns", "exec", site.NS, edgeBin,
		"-iface", "br0", "-ip", bootlab.EdgeIP, "-state", filepath.Join(dir, "state"), "-assets", filepath.Join(dir, "assets"),
		"-ipxe-dir", ipxeDir, "-http-max-conns", "1000")

	waitLine(t, lines, "READY", 30*time.Second)

	// boot boots one VM to its agent callback and returns the time it took and the CPU seconds the VM and the
	// edge used meanwhile.
	boot := func(name, mac string) (took time.Duration, vmCPU, edgeCPU float64) {
		t.Helper()

		vars := filepath.Join(dir, "OVMF_VARS-"+name+".fd")
		b, err := os.ReadFile("/usr/share/OVMF/OVMF_VARS_4M.fd")
		require.NoError(t, err)
		require.NoError(t, os.WriteFile(vars, b, 0o644))

		uuid := randomUUID(t)
		serial := filepath.Join(site.Dir, "serial-"+name+".log")
		start, edgeCPU0 := time.Now(), cpuSeconds(edge.Process.Pid)

		vm := site.Start(t, "qemu-"+name, nil, "ip", "netns", "exec", site.NS, "qemu-system-x86_64",
			"-m", "512", "-smp", "1", "-nodefaults", "-display", "none", "-no-reboot",
			"-serial", "file:"+serial, "-smbios", "type=1,uuid="+uuid,
			"-netdev", "tap,id=n0,ifname="+site.AddTap(t)+",script=no,downscript=no",
			"-device", "virtio-rng-pci",
			"-machine", "q35,accel=tcg",
			"-drive", "if=pflash,format=raw,readonly=on,file=/usr/share/OVMF/OVMF_CODE_4M.fd",
			"-drive", "if=pflash,format=raw,file="+vars,
			"-device", "virtio-net-pci,netdev=n0,mac="+mac+",romfile=,bootindex=1")

		t.Cleanup(func() {
			if t.Failed() {
				b, _ := os.ReadFile(serial) //nolint:errcheck
				t.Logf("--- %s serial console (last 4 KiB)\n%s", name, tailBytes(b, 4096))
			}
		})

		seen := waitLine(t, lines, "CALLBACK u="+uuid, 5*time.Minute)
		took, vmCPU, edgeCPU = time.Since(start), cpuSeconds(vm.Process.Pid), cpuSeconds(edge.Process.Pid)-edgeCPU0

		require.Subset(t, seen, []string{"DHCP " + mac + " uefi-x86 ipxe=false", "TFTP ipxe.efi", "DHCP " + mac + " uefi-x86 ipxe=true", "BOOT " + uuid + " agent platform=efi"},
			"edge saw %q", seen)

		// One VM at a time.
		_ = vm.Process.Kill()
		_ = vm.Wait()

		return took, vmCPU, edgeCPU
	}

	quiet, quietVMCPU, quietEdgeCPU := boot("quiet", "52:54:00:77:00:21")
	rssQuiet, filesQuiet := processRSSMiB(edge.Process.Pid), processFiles(edge.Process.Pid)

	const (
		tftpRate    = 2000
		slowClients = 20000
	)

	// Two attacker processes on the hostile host, each flooding at half the rate and holding half the slow
	// clients: one process may not open 20,000 sockets here (the machine's open-file limit is 20,000).
	const attackers = 2

	var as []*attacker
	for range attackers {
		as = append(as, startAttacker(t, atk, bootlab.EdgeIP, tftpRate/attackers, slowClients/attackers))
	}

	a := as[0] // the one whose metrics are read
	sum := func(field string) int64 {
		var n int64
		for _, x := range as {
			n += x.field(field)
		}

		return n
	}

	require.Eventually(t, func() bool { return sum("slow_dials") >= slowClients && sum("tftp") >= tftpRate },
		time.Minute, 100*time.Millisecond, "the attack did not get going")

	attacked, attackedVMCPU, attackedEdgeCPU := boot("attacked", "52:54:00:77:00:22")
	rssAttacked, filesAttacked := processRSSMiB(edge.Process.Pid), processFiles(edge.Process.Pid)
	sent, slowOpen, slowDials := sum("tftp"), sum("slow_open"), sum("slow_dials")

	for _, x := range as {
		x.stop()
	}

	m := func(name string) float64 { return a.metric("under", name) }

	t.Logf("OVMF power-on to agent callback: %s on a quiet site, %s under attack", quiet.Round(100*time.Millisecond), attacked.Round(100*time.Millisecond))
	t.Logf("CPU meanwhile: the VM %.1f s quiet, %.1f s attacked (its share of the wall clock %.0f%%, %.0f%%); the edge %.1f s, %.1f s",
		quietVMCPU, attackedVMCPU, 100*quietVMCPU/quiet.Seconds(), 100*attackedVMCPU/attacked.Seconds(), quietEdgeCPU, attackedEdgeCPU)
	t.Logf("attack: %d TFTP read requests (%d/s, random sources and ports); %d slow HTTP clients, %d dials, %d connected as they saw it",
		sent, tftpRate, slowClients, slowDials, slowOpen)
	t.Logf("edge TFTP: transfers held now %.0f (bound 1024), evicted %.0f (total) %.0f (per source), shed at the bound %.0f",
		m("outpost_tftp_transfers_held"), m(`outpost_tftp_transfers_evicted_total{reason="total"}`), m(`outpost_tftp_transfers_evicted_total{reason="per_source"}`),
		m(`outpost_tftp_requests_total{result="refused_total"}`)+m(`outpost_tftp_requests_total{result="refused_per_source"}`))
	t.Logf("edge HTTP: connections held now %.0f (bound 1000), closed to make room %.0f (total) %.0f (per source), reset at once %.0f",
		m("outpost_http_connections_held"), m(`outpost_http_connections_evicted_total{reason="total"}`), m(`outpost_http_connections_evicted_total{reason="per_source"}`),
		m(`outpost_http_connections_refused_total{reason="total"}`)+m(`outpost_http_connections_refused_total{reason="per_source"}`))
	t.Logf("edge process: goroutines %.0f before the attack, %.0f under it; open files %d after the quiet boot, %d after the attacked one; RSS %.0f MiB, %.0f MiB",
		a.metric("before", "go_goroutines"), m("go_goroutines"), filesQuiet, filesAttacked, rssQuiet, rssAttacked)

	require.Empty(t, a.scrapeError("under"), "the edge's metrics could not be read under attack")
	require.Positive(t, m("go_goroutines"), "no metrics read under attack")
	require.LessOrEqual(t, m("outpost_http_connections_held"), 1000.0)
	require.LessOrEqual(t, m("outpost_tftp_transfers_held"), 1024.0)
	require.Less(t, m("process_open_fds"), 1000.0+1024+200)
}

// scrapeError is why the attacker could not read the edge's metrics in phase ("" when it could).
func (a *attacker) scrapeError(phase string) string {
	a.mu.Lock()
	defer a.mu.Unlock()

	return a.scrapeErrs[phase]
}
