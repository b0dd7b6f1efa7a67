package bootlab

import (
	"bufio"
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"
)

// Addresses of a lab site (inside its own network namespaces, so every site can use the same ones).
const (
	EdgeIP = "10.77.0.2"
	DHCPIP = "10.77.0.1"
	// RelayUpIP and RelayDownIP are the DHCP relay's addresses on the edge's network and on the machines' own
	// network one relay away (SiteOptions.Relay).
	RelayUpIP   = "10.77.0.3"
	RelayDownIP = "10.78.0.1"
)

// SkipUnlessLab skips the test, saying why, unless it can run lab tests: not -short, root, and the
// Debian tools present.
func SkipUnlessLab(t *testing.T, tools ...string) {
	t.Helper()

	if testing.Short() {
		t.Skip("lab test: skipped under -short")
	}

	if os.Geteuid() != 0 {
		t.Skip("lab test: needs root for network namespaces")
	}

	for _, tool := range append([]string{"ip", "dnsmasq"}, tools...) {
		if _, err := exec.LookPath(tool); err != nil {
			t.Skipf("lab test: %s not installed (make deps)", tool)
		}
	}
}

// RepoRoot returns the module root (where go.mod is).
func RepoRoot(t testing.TB) string {
	t.Helper()

	root, err := FindRepoRoot()
	if err != nil {
		t.Fatal(err)
	}

	return root
}

// FindRepoRoot returns the module root (where go.mod is) above the working directory.
func FindRepoRoot() (string, error) {
	dir, err := os.Getwd()
	if err != nil {
		return "", err
	}

	for {
		if _, err := os.Stat(filepath.Join(dir, "go.mod")); err == nil {
			return dir, nil
		}

		parent := filepath.Dir(dir)
		if parent == dir {
			return "", errors.New("go.mod not found above the working directory")
		}

		dir = parent
	}
}

// IPXE returns the directory of the iPXE binaries every lab edge and bare peer serves, Debian's iPXE for BIOS,
// x86 UEFI and arm64 UEFI as hack/ipxe.sh lays it out under the repository root (fetched once, then cached
// under _out/ipxe). The appliance ships the same files.
func IPXE(root string) (string, error) {
	return Hack(context.Background(), root, "ipxe.sh")
}

// Hack runs the repository's hack/<script>, one that fetches or builds what the lab needs and caches it under
// _out, and returns what it printed (a path), trimmed; its error carries what the script said on stderr.
func Hack(ctx context.Context, root, script string) (string, error) {
	out, err := exec.CommandContext(ctx, filepath.Join(root, "hack", script)).Output()
	if err != nil {
		var stderr string
		if ee, ok := err.(*exec.ExitError); ok { //nolint:errorlint // the process's own error carries its stderr
			stderr = strings.TrimSpace(string(ee.Stderr))
		}

		return "", fmt.Errorf("hack/%s: %w: %s", script, err, stderr)
	}

	return strings.TrimSpace(string(out)), nil
}

// IPXEFor is IPXE for a test: it skips the test, saying why, where Debian's iPXE cannot be had.
func IPXEFor(t testing.TB) string {
	t.Helper()

	dir, err := IPXE(RepoRoot(t))
	if err != nil {
		t.Skipf("lab test: no iPXE (%v)", err)
	}

	return dir
}

// Run runs a command and fails the test with its output on error.
func Run(t testing.TB, name string, args ...string) string {
	t.Helper()

	out, err := exec.Command(name, args...).CombinedOutput()
	if err != nil {
		t.Fatalf("%s %s: %v\n%s", name, strings.Join(args, " "), err, out)
	}

	return string(out)
}

func randomSuffix() string {
	b := make([]byte, 3)
	if _, err := rand.Read(b); err != nil {
		panic(err)
	}

	return hex.EncodeToString(b)
}

// Site is a lab site: a namespace with a bridge carrying the edge's address and the machines' taps, and a
// second namespace, linked to the bridge by a veth pair, running the site's own DHCP server (dnsmasq,
// leases only, plus an IPv6 router advertisement).
type Site struct {
	NS     string
	DHCPNS string
	Dir    string
	taps   int
	// exited closes, per started process, once it has exited.
	exited map[*exec.Cmd]chan struct{}
	// relayNS holds the machines' bridge when they are one DHCP relay away ("" otherwise).
	relayNS string
}

// SiteOptions customise NewSite.
type SiteOptions struct {
	// IPXENoProxyDHCP adds dnsmasq's dhcp-option=encap:175,176,1b (iPXE "no-pxedhcp"). It tells iPXE to
	// skip ProxyDHCP, so iPXE then ignores the edge's offers: measured here, SeaBIOS+iPXE never reached the
	// callback with it. The lab leaves it off; with the edge answering, iPXE does not wait for ProxyDHCP anyway.
	IPXENoProxyDHCP bool
	// BootFile makes the site's DHCP server hand out the boot file itself, as a site whose firmware ignores
	// ProxyDHCP offers is set up: the edge's undionly.kpxe over TFTP for PXE ROMs, the edge's init.ipxe over
	// HTTP for iPXE (user class iPXE).
	BootFile bool
	// PXEService makes the site's DHCP server name the edge as its PXE boot server (dnsmasq --pxe-service for
	// BIOS and x86-64 UEFI clients, a boot server type of its own): clients take their lease and a one-item
	// boot menu from dnsmasq, then ask the edge on port 4011 for that item (PXE boot server discovery), as
	// beside a site DHCP server that offers PXE while the edge runs --proxydhcp-mode 4011-only. iPXE's UEFI
	// build has no PXE menus (measured here: "Booting from PXE menu", then "No more network devices", and no
	// request reaches 4011), so on UEFI the site's server hands iPXE the edge's script URL itself.
	PXEService bool
	// Relay puts the machines on a network of their own, one router away from the edge's: a third namespace
	// routes between the two and runs Debian's DHCP relay (isc-dhcp-relay), which forwards the machines'
	// requests to the site's DHCP server and to the edge. The site's server leases 10.78.0.0/24 to them.
	Relay bool
	// Bare makes the site's dnsmasq do the whole network boot itself, with no edge, as the classic dnsmasq +
	// static files setup does: DHCP with boot files (UEFI HTTP boot included), TFTP for iPXE from this
	// directory, and busybox's httpd serving the directory (boot.ipxe, the kernel, the initramfs, ipxe.efi, and
	// snp-arm64.efi for arm64 machines) on DHCPIP. It is the peer the edge's boot times are compared with.
	Bare string
}

// NewSite creates the namespaces, the bridge and the site DHCP server; everything is removed when the test ends.
func NewSite(t *testing.T, opts SiteOptions) *Site {
	t.Helper()

	sfx := randomSuffix()
	s := &Site{NS: "ob-site-" + sfx, DHCPNS: "ob-dhcp-" + sfx, Dir: t.TempDir(), exited: map[*exec.Cmd]chan struct{}{}}

	Run(t, "ip", "netns", "add", s.NS)
	t.Cleanup(func() { exec.Command("ip", "netns", "del", s.NS).Run() }) //nolint:errcheck
	Run(t, "ip", "netns", "add", s.DHCPNS)
	t.Cleanup(func() { exec.Command("ip", "netns", "del", s.DHCPNS).Run() }) //nolint:errcheck

	for _, args := range [][]string{
		{"-n", s.NS, "link", "set", "lo", "up"},
		{"-n", s.NS, "link", "add", "br0", "type", "bridge", "forward_delay", "0", "stp_state", "0"},
		{"-n", s.NS, "addr", "add", EdgeIP + "/24", "dev", "br0"},
		{"-n", s.NS, "-6", "addr", "add", "fd77::2/64", "dev", "br0", "nodad"},
		{"-n", s.NS, "link", "set", "br0", "up"},
		{"-n", s.NS, "link", "add", "dh0", "type", "veth", "peer", "name", "dh1", "netns", s.DHCPNS},
		{"-n", s.NS, "link", "set", "dh0", "master", "br0", "up"},
		{"-n", s.DHCPNS, "link", "set", "lo", "up"},
		{"-n", s.DHCPNS, "addr", "add", DHCPIP + "/24", "dev", "dh1"},
		{"-n", s.DHCPNS, "-6", "addr", "add", "fd77::1/64", "dev", "dh1", "nodad"},
		{"-n", s.DHCPNS, "link", "set", "dh1", "up"},
	} {
		Run(t, "ip", args...)
	}

	args := []string{
		"netns", "exec", s.DHCPNS, "dnsmasq", "--keep-in-foreground", "--conf-file=/dev/null", "--no-resolv", "--no-hosts",
		"--port=0", "--interface=dh1", "--bind-interfaces", "--user=root", "--pid-file=",
		"--dhcp-range=10.77.0.100,10.77.0.150,255.255.255.0,1h", "--dhcp-range=fd77::,ra-only", "--enable-ra",
		"--dhcp-leasefile=" + filepath.Join(s.Dir, "leases"), "--no-ping", "--log-dhcp", "--log-facility=-",
	}
	if opts.IPXENoProxyDHCP {
		args = append(args, "--dhcp-option=encap:175,176,1b")
	}

	if opts.BootFile {
		args = append(args, "--dhcp-userclass=set:ipxe,iPXE",
			"--dhcp-boot=tag:ipxe,http://"+EdgeIP+"/ipxe/init.ipxe",
			"--dhcp-boot=tag:!ipxe,undionly.kpxe,,"+EdgeIP)
	}

	if opts.PXEService {
		// Type 1000: a boot server type that is neither local boot (0) nor one dnsmasq numbers for itself.
		args = append(args, "--pxe-service=x86PC,Outpost edge,1000,"+EdgeIP, "--pxe-service=tag:!ipxe,x86-64_EFI,Outpost edge,1000,"+EdgeIP,
			"--dhcp-userclass=set:ipxe,iPXE", "--dhcp-match=set:efi64,option:client-arch,7",
			"--dhcp-boot=tag:ipxe,tag:efi64,http://"+EdgeIP+"/ipxe/init.ipxe")
	}

	if opts.Relay {
		args = append(args, "--dhcp-range=10.78.0.100,10.78.0.150,255.255.255.0,1h")
	}

	if opts.Bare != "" {
		args = append(args, "--enable-tftp", "--tftp-root="+opts.Bare, "--dhcp-match=set:ipxe,175",
			"--dhcp-vendorclass=set:efi,PXEClient:Arch:00007",
			// UEFI HTTP boot (UEFI specification, "HTTP Boot"): the client wants vendor class HTTPClient back
			// and an http:// boot file.
			"--dhcp-vendorclass=set:http,HTTPClient:Arch:00016", "--dhcp-option-force=tag:http,60,HTTPClient",
			// arm64 UEFI (option 93 = 11) and its HTTP boot (19): the arm64 iPXE the directory holds.
			"--dhcp-vendorclass=set:arm64,PXEClient:Arch:00011",
			"--dhcp-vendorclass=set:httparm64,HTTPClient:Arch:00019", "--dhcp-option-force=tag:httparm64,60,HTTPClient",
			"--dhcp-boot=tag:ipxe,http://"+DHCPIP+"/boot.ipxe",
			"--dhcp-boot=tag:!ipxe,tag:http,http://"+DHCPIP+"/ipxe.efi",
			"--dhcp-boot=tag:!ipxe,tag:httparm64,http://"+DHCPIP+"/snp-arm64.efi",
			"--dhcp-boot=tag:!ipxe,tag:efi,ipxe.efi",
			"--dhcp-boot=tag:!ipxe,tag:arm64,snp-arm64.efi",
			"--dhcp-boot=tag:!ipxe,tag:!efi,tag:!http,tag:!arm64,tag:!httparm64,undionly.kpxe")
		s.Start(t, "httpd", nil, "ip", "netns", "exec", s.DHCPNS, "busybox", "httpd", "-f", "-p", DHCPIP+":80", "-h", opts.Bare)
	}

	s.Start(t, "dnsmasq", nil, "ip", args...)

	if opts.Relay {
		s.startRelay(t)
	}

	return s
}

// startRelay creates the relay namespace: the machines' bridge br1 (RelayDownIP), a veth to the edge's bridge
// (RelayUpIP), forwarding between them, routes back from the edge and the site's DHCP server, and dhcrelay
// forwarding to both.
func (s *Site) startRelay(t *testing.T) {
	t.Helper()

	s.relayNS = "ob-relay-" + strings.TrimPrefix(s.NS, "ob-site-")
	Run(t, "ip", "netns", "add", s.relayNS)
	t.Cleanup(func() { exec.Command("ip", "netns", "del", s.relayNS).Run() }) //nolint:errcheck

	for _, args := range [][]string{
		{"-n", s.relayNS, "link", "set", "lo", "up"},
		{"-n", s.relayNS, "link", "add", "br1", "type", "bridge", "forward_delay", "0", "stp_state", "0"},
		{"-n", s.relayNS, "addr", "add", RelayDownIP + "/24", "dev", "br1"},
		{"-n", s.relayNS, "link", "set", "br1", "up"},
		{"-n", s.NS, "link", "add", "rl0", "type", "veth", "peer", "name", "rl1", "netns", s.relayNS},
		{"-n", s.NS, "link", "set", "rl0", "master", "br0", "up"},
		{"-n", s.relayNS, "addr", "add", RelayUpIP + "/24", "dev", "rl1"},
		{"-n", s.relayNS, "link", "set", "rl1", "up"},
		{"-n", s.NS, "route", "add", "10.78.0.0/24", "via", RelayUpIP},
		{"-n", s.DHCPNS, "route", "add", "10.78.0.0/24", "via", RelayUpIP},
	} {
		Run(t, "ip", args...)
	}

	Run(t, "ip", "netns", "exec", s.relayNS, "sysctl", "-q", "-w", "net.ipv4.ip_forward=1")

	s.Start(t, "dhcrelay", nil, "ip", "netns", "exec", s.relayNS, "dhcrelay", "-d", "-4", "--no-pid",
		"-id", "br1", "-iu", "rl1", DHCPIP, EdgeIP)
}

// Start starts a long-running process (killed at the end of the test); its output goes to <Dir>/<name>.log
// and, when lines is not nil, each stdout line is also sent there.
func (s *Site) Start(t *testing.T, name string, lines chan<- string, cmd string, args ...string) *exec.Cmd {
	t.Helper()

	logf, err := os.Create(filepath.Join(s.Dir, name+".log"))
	if err != nil {
		t.Fatal(err)
	}

	c := exec.Command(cmd, args...)
	c.Stderr = logf

	var (
		wg sync.WaitGroup
		pw *io.PipeWriter
	)

	if lines != nil {
		var pr *io.PipeReader

		pr, pw = io.Pipe()
		c.Stdout = pw

		wg.Go(func() {
			sc := bufio.NewScanner(pr)
			for sc.Scan() {
				_, _ = fmt.Fprintln(logf, sc.Text()) //nolint:errcheck // best-effort log copy

				select {
				case lines <- sc.Text():
				default:
				}
			}
		})
	} else {
		c.Stdout = logf
	}

	if err := c.Start(); err != nil {
		t.Fatalf("start %s: %v", name, err)
	}

	exited := make(chan struct{})
	s.exited[c] = exited

	go func() {
		_ = c.Wait() //nolint:errcheck // the exit is what Exited reports
		close(exited)
	}()

	t.Cleanup(func() {
		_ = c.Process.Kill() //nolint:errcheck
		<-exited

		if pw != nil {
			pw.Close() //nolint:errcheck // ends the line reader
		}

		wg.Wait()
		logf.Close() //nolint:errcheck

		if t.Failed() {
			b, _ := os.ReadFile(logf.Name()) //nolint:errcheck
			t.Logf("--- %s log (last 4 KiB)\n%s", name, tail(b, 4096))
		}
	})

	return c
}

// Exited returns a channel closed once c, started by Start, has exited (a machine powered off).
func (s *Site) Exited(c *exec.Cmd) <-chan struct{} { return s.exited[c] }

func tail(b []byte, n int) []byte {
	if len(b) > n {
		return b[len(b)-n:]
	}

	return b
}

// AddTap creates a tap device on the bridge for one machine and returns its name.
func (s *Site) AddTap(t *testing.T) string {
	t.Helper()

	name := fmt.Sprintf("tap%d", s.taps)
	s.taps++

	ns, bridge := s.NS, "br0"
	if s.relayNS != "" {
		ns, bridge = s.relayNS, "br1"
	}

	Run(t, "ip", "-n", ns, "tuntap", "add", "dev", name, "mode", "tap")
	Run(t, "ip", "-n", ns, "link", "set", name, "master", bridge, "up")

	return name
}

// MachineNS is the namespace the machines' taps are in (where QEMU must run).
func (s *Site) MachineNS() string {
	if s.relayNS != "" {
		return s.relayNS
	}

	return s.NS
}

// GoBuild builds a package of this module statically into dir and returns the binary's path.
func GoBuild(t testing.TB, root, pkg, out string) string {
	t.Helper()

	gobin, err := exec.LookPath("go")
	if err != nil {
		t.Skipf("lab test: no go toolchain on PATH to build %s", pkg)
	}

	cmd := exec.Command(gobin, "build", "-ldflags", "-s -w", "-o", out, pkg)
	cmd.Dir = root
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0")

	if b, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("go build %s: %v\n%s", pkg, err, b)
	}

	return out
}

// Kernel is the guest kernel: Debian's cloud kernel, unpacked (not installed) under _out/bootlab.
type Kernel struct {
	Vmlinuz    string
	ModulesDir string
}

// ErrNoKernel says the guest kernel is neither present nor obtainable (the lab test skips then).
var ErrNoKernel = errors.New("no guest kernel")

// EnsureKernel finds the guest kernel under outDir or fetches it with `apt-get download` and unpacks it with
// `dpkg-deb -x`. It returns ErrNoKernel (wrapped) when that is impossible.
func EnsureKernel(outDir string) (Kernel, error) {
	root := filepath.Join(outDir, "root")

	find := func() (Kernel, bool) {
		vmlinuz, _ := filepath.Glob(filepath.Join(root, "boot", "vmlinuz-*-cloud-amd64"))
		mods, _ := filepath.Glob(filepath.Join(root, "lib", "modules", "*-cloud-amd64"))

		if len(vmlinuz) == 0 || len(mods) == 0 {
			return Kernel{}, false
		}

		return Kernel{Vmlinuz: vmlinuz[len(vmlinuz)-1], ModulesDir: mods[len(mods)-1]}, true
	}

	if k, ok := find(); ok {
		return k, nil
	}

	if err := os.MkdirAll(outDir, 0o755); err != nil {
		return Kernel{}, err
	}

	debs, _ := filepath.Glob(filepath.Join(outDir, "linux-image-*-cloud-amd64_*.deb"))
	if len(debs) == 0 {
		out, err := exec.Command("apt-cache", "depends", "linux-image-cloud-amd64").Output()
		if err != nil {
			return Kernel{}, fmt.Errorf("apt-cache depends: %w: %w", err, ErrNoKernel)
		}

		var pkg string

		for _, line := range strings.Split(string(out), "\n") {
			if dep, ok := strings.CutPrefix(strings.TrimSpace(line), "Depends: "); ok && strings.HasPrefix(dep, "linux-image-") {
				pkg = dep

				break
			}
		}

		if pkg == "" {
			return Kernel{}, fmt.Errorf("no linux-image dependency in %q: %w", out, ErrNoKernel)
		}

		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
		defer cancel()

		cmd := exec.CommandContext(ctx, "apt-get", "download", pkg)
		cmd.Dir = outDir

		if b, err := cmd.CombinedOutput(); err != nil {
			return Kernel{}, fmt.Errorf("apt-get download %s: %w: %s: %w", pkg, err, b, ErrNoKernel)
		}

		debs, _ = filepath.Glob(filepath.Join(outDir, "linux-image-*-cloud-amd64_*.deb"))
		if len(debs) == 0 {
			return Kernel{}, fmt.Errorf("apt-get download left no .deb: %w", ErrNoKernel)
		}
	}

	if b, err := exec.Command("dpkg-deb", "-x", debs[len(debs)-1], root).CombinedOutput(); err != nil {
		return Kernel{}, fmt.Errorf("dpkg-deb -x: %w: %s: %w", err, b, ErrNoKernel)
	}

	if k, ok := find(); ok {
		return k, nil
	}

	return Kernel{}, fmt.Errorf("unpacked package holds no cloud kernel: %w", ErrNoKernel)
}
