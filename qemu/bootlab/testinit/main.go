// Command testinit is the /init of the boot lab's initramfs: it loads the virtio network modules listed in
// /modules.order, takes a DHCP lease, reads the machine's SMBIOS UUID and calls back to the edge that booted
// it (the host of talos.config= on the kernel command line) with GET /config?u=<uuid>, then powers off.
// It is test tooling, built statically by the lab tests.
package main

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"os"
	"strings"
	"syscall"
	"time"
	"unsafe"

	"github.com/insomniacslk/dhcp/dhcpv4/nclient4"
	"github.com/vishvananda/netlink"
)

func main() {
	if err := run(); err != nil {
		fmt.Println("OUTPOST-INIT-FAILED:", err)
	}

	syscall.Sync()

	if err := syscall.Reboot(syscall.LINUX_REBOOT_CMD_POWER_OFF); err != nil {
		fmt.Println("power off:", err)
	}

	select {}
}

func run() error {
	for _, m := range []struct{ src, dst, fs string }{{"proc", "/proc", "proc"}, {"sysfs", "/sys", "sysfs"}} {
		if err := os.MkdirAll(m.dst, 0o755); err != nil {
			return err
		}

		if err := syscall.Mount(m.src, m.dst, m.fs, 0, ""); err != nil {
			return fmt.Errorf("mount %s: %w", m.dst, err)
		}
	}

	if err := loadModules("/modules.order"); err != nil {
		return err
	}

	uuid, err := os.ReadFile("/sys/class/dmi/id/product_uuid")
	if err != nil {
		return fmt.Errorf("read smbios uuid: %w", err)
	}

	cmdline, err := os.ReadFile("/proc/cmdline")
	if err != nil {
		return err
	}

	fmt.Printf("OUTPOST-INIT uuid=%s cmdline=%s\n", strings.TrimSpace(string(uuid)), strings.TrimSpace(string(cmdline)))

	edge, err := edgeFromCmdline(string(cmdline))
	if err != nil {
		return err
	}

	ifname, err := waitLink(30 * time.Second)
	if err != nil {
		return err
	}

	if err := dhcp(ifname); err != nil {
		return err
	}

	cb := "http://" + edge + "/config?u=" + url.QueryEscape(strings.ToLower(strings.TrimSpace(string(uuid))))

	var last error

	for range 10 {
		resp, err := (&http.Client{Timeout: 5 * time.Second}).Get(cb) //nolint:noctx
		if err == nil {
			io.Copy(io.Discard, resp.Body) //nolint:errcheck
			resp.Body.Close()              //nolint:errcheck
			fmt.Println("OUTPOST-CALLBACK-DONE", resp.StatusCode)

			return nil
		}

		last = err

		time.Sleep(time.Second)
	}

	return fmt.Errorf("callback %s: %w", cb, last)
}

func edgeFromCmdline(cmdline string) (string, error) {
	for _, f := range strings.Fields(cmdline) {
		if v, ok := strings.CutPrefix(f, "talos.config="); ok {
			u, err := url.Parse(v)
			if err != nil {
				return "", fmt.Errorf("talos.config %q: %w", v, err)
			}

			return u.Host, nil
		}
	}

	return "", fmt.Errorf("no talos.config= on the command line")
}

func loadModules(list string) error {
	f, err := os.Open(list)
	if err != nil {
		return err
	}
	defer f.Close() //nolint:errcheck

	sc := bufio.NewScanner(f)
	for sc.Scan() {
		path := strings.TrimSpace(sc.Text())
		if path == "" {
			continue
		}

		if err := finitModule(path); err != nil && !errors.Is(err, syscall.EEXIST) {
			return fmt.Errorf("load %s: %w", path, err)
		}
	}

	return sc.Err()
}

// sysFinitModule is finit_module(2) on linux/amd64 (the syscall package lacks the constant).
const sysFinitModule = 313

func finitModule(path string) error {
	f, err := os.Open(path)
	if err != nil {
		return err
	}
	defer f.Close() //nolint:errcheck

	params := []byte{0}

	_, _, errno := syscall.Syscall(sysFinitModule, f.Fd(), uintptr(unsafe.Pointer(&params[0])), 0)
	if errno != 0 {
		return errno
	}

	return nil
}

func waitLink(timeout time.Duration) (string, error) {
	deadline := time.Now().Add(timeout)

	for time.Now().Before(deadline) {
		links, err := netlink.LinkList()
		if err == nil {
			for _, l := range links {
				if l.Type() == "device" && l.Attrs().Name != "lo" && len(l.Attrs().HardwareAddr) == 6 {
					lo, _ := netlink.LinkByName("lo")
					if lo != nil {
						netlink.LinkSetUp(lo) //nolint:errcheck
					}

					if err := netlink.LinkSetUp(l); err != nil {
						return "", fmt.Errorf("link up %s: %w", l.Attrs().Name, err)
					}

					return l.Attrs().Name, nil
				}
			}
		}

		time.Sleep(200 * time.Millisecond)
	}

	return "", fmt.Errorf("no network interface within %s", timeout)
}

func dhcp(ifname string) error {
	c, err := nclient4.New(ifname, nclient4.WithTimeout(3*time.Second), nclient4.WithRetry(5))
	if err != nil {
		return fmt.Errorf("dhcp client: %w", err)
	}
	defer c.Close() //nolint:errcheck

	ctx, cancel := context.WithTimeout(context.Background(), 40*time.Second)
	defer cancel()

	lease, err := c.Request(ctx)
	if err != nil {
		return fmt.Errorf("dhcp: %w", err)
	}

	ack := lease.ACK
	ones, _ := ack.SubnetMask().Size()

	link, err := netlink.LinkByName(ifname)
	if err != nil {
		return err
	}

	addr := &netlink.Addr{IPNet: &net.IPNet{IP: ack.YourIPAddr, Mask: net.CIDRMask(ones, 32)}}
	if err := netlink.AddrAdd(link, addr); err != nil {
		return fmt.Errorf("add %s: %w", addr, err)
	}

	fmt.Println("OUTPOST-INIT address", addr)

	return nil
}
