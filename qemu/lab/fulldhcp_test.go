package lab_test

import (
	"context"
	"encoding/json"
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/outpost-metal/outpost/qemu/lab"
)

// TestSiteWithoutDHCPServer runs a site whose network has no DHCP server but its edge, in full DHCP mode
// (controller site set --dhcp full): a SeaBIOS machine and an OVMF machine get their addresses from the
// edge's pool with the PXE answer in the same reply, reach agent mode, are accepted, wiped and installed;
// the edge is restarted and keeps every lease (a machine added afterwards gets a new address, not theirs);
// then a second DHCP server (dnsmasq) starts on the segment: the edge's guard finds it and names it, and the
// next machine gets its address from that server, none from the edge.
//
// OMNI chooses the Omni as for TestE2E (real by default). Root, QEMU (TCG). Logs and timeline.md stay under
// _out/fulldhcp/<real|standin>.
func TestSiteWithoutDHCPServer(t *testing.T) {
	ctx, a, bins, _ := airGapLab(t, "fulldhcp", 60*time.Minute, "cache")

	f := &fullDHCPRun{steps: steps{t, a}, t: t, ctx: ctx, a: a, site: a.Sites[0], edgeBin: bins.Edge}

	f.step("the site's own DHCP server is gone; the edge serves full DHCP mode (checking the segment every 5 s)", f.becomeTheServer)

	bios, err := a.AddMachine(ctx, f.site, "full-bios", "0e5a1ab0-0000-4000-8000-0000000f0101", "52:54:00:f1:01:01")
	f.must(err)

	uefi, err := f.site.AddMachine(ctx, lab.MachineSpec{
		Name: "full-uefi", UUID: "0e5a1ab0-0000-4000-8000-0000000f0102", MAC: "52:54:00:f1:01:02",
		Firmware: lab.UEFI, BMC: lab.Redfish, RunTimeout: 20 * time.Minute,
	})
	f.must(err)

	a.Machines = append(a.Machines, uefi)

	f.step("SeaBIOS and OVMF machines get addresses from the edge's pool, reach agent mode, are accepted and wiped",
		func() error { return f.discover(bios, uefi) })
	f.step("both install, their install boots leased the same addresses", func() error { return f.install(bios, uefi) })
	f.step("the edge restarted keeps every lease; a new machine gets a new address", func() error {
		late, err := a.AddMachine(ctx, f.site, "full-late", "0e5a1ab0-0000-4000-8000-0000000f0103", "52:54:00:f1:01:03")
		if err != nil {
			return err
		}

		return f.restartKeepsLeases(late)
	})
	f.step("a second DHCP server on the segment: the edge names it and stops offering; it serves the next machine",
		func() error {
			next, err := a.AddMachine(ctx, f.site, "full-next", "0e5a1ab0-0000-4000-8000-0000000f0104", "52:54:00:f1:01:04")
			if err != nil {
				return err
			}

			return f.secondServer(next)
		})
}

// The site's pool and the second server's range, on site 1's network (10.77.1.0/24, the edge at .2).
const (
	fullPoolStart  = "10.77.1.100"
	fullPoolEnd    = "10.77.1.150"
	otherPoolStart = "10.77.1.200"
	otherPoolEnd   = "10.77.1.220"
)

type fullDHCPRun struct {
	steps

	t       *testing.T
	ctx     context.Context
	a       *lab.AirGap
	site    *lab.Site
	edgeBin string
	// addrs are the machines' addresses from the edge, by name.
	addrs map[string]netip.Addr
}

func (f *fullDHCPRun) must(err error) {
	f.t.Helper()

	if err != nil {
		f.t.Fatal(err)
	}
}

// restartEdge kills the site's edge and starts it again (its identity and leases in its state directory).
func (f *fullDHCPRun) restartEdge() error {
	from := f.a.Edges[0].Log.Size()
	f.a.Edges[0].Kill()

	p, err := f.site.StartEdge(f.ctx, f.edgeBin, lab.EdgeOptions{Restart: true, ExtraArgs: []string{"--dhcp-guard-interval", "5s"}})
	if err != nil {
		return err
	}

	f.a.Edges[0] = p

	return p.Log.WaitFor(f.ctx, from, `"uplink connected"`, 2*time.Minute)
}

func (f *fullDHCPRun) becomeTheServer() error {
	f.site.DHCP.Kill()

	if err := f.restartEdge(); err != nil {
		return err
	}

	out, err := f.a.Controller.Command(f.ctx, 30*time.Second, "site", "set", f.site.Name, "--dhcp", "full",
		"--dhcp-subnet", f.site.Subnet(), "--dhcp-pool", fullPoolStart+"-"+fullPoolEnd, "--dhcp-gateway", f.site.EdgeIP())
	if err != nil {
		return fmt.Errorf("site set --dhcp full: %w: %s", err, out)
	}

	// The edge has the setting and its guard found the segment clear: it serves its pool.
	return poll(f.ctx, time.Minute, func() (bool, error) {
		size, err := f.site.EdgeMetric(f.ctx, "outpost_dhcp_pool_size")

		return size == 51, err
	})
}

var addressLine = regexp.MustCompile(`OUTPOST-INIT address (\d+\.\d+\.\d+\.\d+)`)

// address is the address the machine's kernel leased after serial offset from.
func address(m *lab.Machine, from int64) (netip.Addr, error) {
	found := addressLine.FindAllStringSubmatch(string(m.Serial.Since(from)), -1)
	if len(found) == 0 {
		return netip.Addr{}, fmt.Errorf("%s leased no address on its console", m.Spec.Name)
	}

	return netip.ParseAddr(found[len(found)-1][1])
}

func inRange(a netip.Addr, start, end string) bool {
	return a.Compare(netip.MustParseAddr(start)) >= 0 && a.Compare(netip.MustParseAddr(end)) <= 0
}

func (f *fullDHCPRun) discover(ms ...*lab.Machine) error {
	from := map[*lab.Machine]int64{}
	for _, m := range ms {
		from[m] = m.Serial.Size()
	}

	if err := f.a.Discover(f.ctx, ms...); err != nil {
		return err
	}

	f.addrs = map[string]netip.Addr{}

	for _, m := range ms {
		addr, err := address(m, from[m])
		if err != nil {
			return err
		}

		if !inRange(addr, fullPoolStart, fullPoolEnd) {
			return fmt.Errorf("%s leased %s, outside the edge's pool %s-%s", m.Spec.Name, addr, fullPoolStart, fullPoolEnd)
		}

		f.addrs[m.Spec.Name] = addr
		f.t.Logf("%s (%s) leased %s from the edge", m.Spec.Name, m.Spec.Firmware, addr)
	}

	replies, err := f.site.EdgeMetric(f.ctx, "outpost_dhcp_lease_replies_total", "type", "ACK")
	if err != nil {
		return err
	}

	if replies < float64(2*len(ms)) { // the firmware's exchange and the kernel's, each
		return fmt.Errorf("the edge sent %v ACKs for %d machines, want at least %d", replies, len(ms), 2*len(ms))
	}

	return nil
}

func (f *fullDHCPRun) install(ms ...*lab.Machine) error {
	for _, m := range ms {
		from := m.Serial.Size()

		if err := f.a.Allocate(f.ctx, m, "fulldhcp-"+m.Spec.Name); err != nil {
			return err
		}

		if err := f.a.WaitInstalled(f.ctx, m, from); err != nil {
			return err
		}

		// The first address the install boot's kernel leased (the disk boot after it may lease again).
		found := addressLine.FindStringSubmatch(string(m.Serial.Since(from)))
		if found == nil {
			return fmt.Errorf("%s's install boot leased no address", m.Spec.Name)
		}

		if addr := netip.MustParseAddr(found[1]); addr != f.addrs[m.Spec.Name] {
			return fmt.Errorf("%s's install boot leased %s, its agent boot %s", m.Spec.Name, addr, f.addrs[m.Spec.Name])
		}
	}

	return nil
}

// leases reads the edge's persisted leases: address by MAC.
func (f *fullDHCPRun) leases() (map[string]string, error) {
	b, err := os.ReadFile(filepath.Join(f.site.Dir, "edge-state", "dhcp-leases.json"))
	if err != nil {
		return nil, err
	}

	var file struct {
		Leases []struct {
			MAC string `json:"mac"`
			IP  string `json:"ip"`
		} `json:"leases"`
	}

	if err := json.Unmarshal(b, &file); err != nil {
		return nil, fmt.Errorf("dhcp-leases.json: %w", err)
	}

	out := map[string]string{}
	for _, l := range file.Leases {
		out[strings.ToLower(l.MAC)] = l.IP
	}

	return out, nil
}

func (f *fullDHCPRun) restartKeepsLeases(late *lab.Machine) error {
	before, err := f.leases()
	if err != nil {
		return err
	}

	if err := f.restartEdge(); err != nil {
		return err
	}

	for _, m := range f.a.Machines {
		if _, ok := f.addrs[m.Spec.Name]; !ok {
			continue
		}

		if got := before[strings.ToLower(m.Spec.MAC)]; got != f.addrs[m.Spec.Name].String() {
			return fmt.Errorf("the edge's leases gave %s %q before the restart, its console %s", m.Spec.Name, got, f.addrs[m.Spec.Name])
		}
	}

	if err := poll(f.ctx, time.Minute, func() (bool, error) {
		n, err := f.site.EdgeMetric(f.ctx, "outpost_dhcp_leases")

		return n >= float64(len(f.addrs)), err
	}); err != nil {
		return fmt.Errorf("the restarted edge does not hold its leases: %w", err)
	}

	from := late.Serial.Size()
	if err := late.PowerOnToAgent(f.ctx, 5*time.Minute); err != nil {
		return err
	}

	addr, err := address(late, from)
	if err != nil {
		return err
	}

	for name, held := range f.addrs {
		if addr == held {
			return fmt.Errorf("the restarted edge gave %s the address %s held by %s", late.Spec.Name, addr, name)
		}
	}

	if !inRange(addr, fullPoolStart, fullPoolEnd) {
		return fmt.Errorf("%s leased %s, outside the edge's pool", late.Spec.Name, addr)
	}

	f.t.Logf("after the restart %s leased %s; the others kept theirs", late.Spec.Name, addr)
	late.PowerOffNow()

	return nil
}

func (f *fullDHCPRun) secondServer(next *lab.Machine) error {
	logFrom := f.a.Edges[0].Log.Size()

	offers, err := f.site.EdgeMetric(f.ctx, "outpost_dhcp_lease_replies_total", "type", "OFFER")
	if err != nil {
		return err
	}

	other, err := f.a.Lab.Start(lab.ProcSpec{
		Name: f.site.Name + "/second-dnsmasq", NS: f.site.DHCPNS, Cmd: "dnsmasq",
		Args: []string{
			"--keep-in-foreground", "--conf-file=/dev/null", "--no-resolv", "--no-hosts", "--port=0", "--interface=dh1",
			"--bind-interfaces", "--user=root", "--pid-file=", "--no-ping", "--log-dhcp", "--log-facility=-",
			"--dhcp-range=" + otherPoolStart + "," + otherPoolEnd + ",255.255.255.0,1h", "--dhcp-option=3," + f.site.EdgeIP(),
			"--dhcp-leasefile=" + filepath.Join(f.site.Dir, "second-dnsmasq.leases"),
		},
	})
	if err != nil {
		return err
	}

	f.t.Cleanup(other.Kill)

	if err := poll(f.ctx, time.Minute, func() (bool, error) {
		v, err := f.site.EdgeMetric(f.ctx, "outpost_dhcp_other_server")

		return v == 1, err
	}); err != nil {
		return fmt.Errorf("the edge never found the second server: %w", err)
	}

	// Named in the edge's log: the other server's address (its namespace's, 10.77.1.1).
	if err := f.a.Edges[0].Log.WaitFor(f.ctx, logFrom, "10.77.1.1", 10*time.Second); err != nil {
		return fmt.Errorf("the edge's log does not name the other server: %w", err)
	}

	from := next.Serial.Size()
	if err := next.PowerOnToAgent(f.ctx, 5*time.Minute); err != nil {
		return err
	}

	addr, err := address(next, from)
	if err != nil {
		return err
	}

	if !inRange(addr, otherPoolStart, otherPoolEnd) {
		return fmt.Errorf("%s leased %s, want the second server's range %s-%s", next.Spec.Name, addr, otherPoolStart, otherPoolEnd)
	}

	after, err := f.site.EdgeMetric(f.ctx, "outpost_dhcp_lease_replies_total", "type", "OFFER")
	if err != nil {
		return err
	}

	if after != offers {
		return fmt.Errorf("the edge sent %v OFFERs while another server answered", after-offers)
	}

	f.t.Logf("with a second server on the segment, %s leased %s from it and reached agent mode", next.Spec.Name, addr)
	next.PowerOffNow()

	return nil
}

// poll calls cond every 500 ms until it holds or timeout passes.
func poll(ctx context.Context, timeout time.Duration, cond func() (bool, error)) error {
	deadline := time.Now().Add(timeout)

	var last error

	for {
		ok, err := cond()
		if ok {
			return nil
		}

		last = err

		if time.Now().After(deadline) {
			if last != nil {
				return fmt.Errorf("not within %s: %w", timeout, last)
			}

			return fmt.Errorf("not within %s", timeout)
		}

		if err := sleepCtx(ctx, 500*time.Millisecond); err != nil {
			return err
		}
	}
}
