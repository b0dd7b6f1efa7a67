// Command testinit is the /init of the boot lab's initramfs: it loads the virtio modules listed in
// /modules.order, takes a DHCP lease, reads the machine's SMBIOS UUID and calls back to the edge that booted
// it (the host of talos.config= on the kernel command line) with GET /config?u=<uuid>, then powers off.
// Booted as the lab's installer (outpost.lab.image=<url> on the command line), it first writes the image at
// that URL to the machine's disk, as Talos's installer writes the disk. Booted from the lab's disk
// (outpost.lab.disk=1), it prints "OUTPOST-DISK-BOOTED" and powers off. It is test tooling, built statically by
// the lab tests.
package main

import (
	"crypto/sha256"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"os"
	"slices"
	"strings"
	"syscall"
	"time"

	"github.com/outpost-metal/outpost/qemu/guestinit"
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
	g, err := guestinit.Start()
	if err != nil {
		return err
	}

	fmt.Printf("OUTPOST-INIT uuid=%s cmdline=%s\n", g.UUID, g.Cmdline)

	args := strings.Fields(g.Cmdline)
	if slices.Contains(args, "outpost.lab.disk=1") {
		// The lab's installed system: the marker the lab test waits for on the serial console.
		fmt.Println("OUTPOST-DISK-BOOTED uuid=" + g.UUID)

		return nil
	}

	edge, err := edgeFromCmdline(g.Cmdline)
	if err != nil {
		return err
	}

	lease, err := guestinit.Network(30 * time.Second)
	if err != nil {
		return err
	}

	fmt.Println("OUTPOST-INIT address", lease.Address)

	if slices.Contains(args, "outpost.lab.plan=1") {
		// A signed UKI (Secure Boot) runs no iPXE: it reads the machine's plan from the edge's boot script, as
		// iPXE would, and follows an install plan itself.
		plan, toDisk, err := planArgs(edge, g.UUID, lease.Interface)
		if err != nil {
			return err
		}

		if toDisk {
			// The edge offers a Secure Boot machine whose plan is its disk nothing, so that its firmware boots the
			// disk: this image booting with that plan means the edge offered it anyway.
			return errors.New("the edge booted this Secure Boot machine from the network, though its plan is its disk")
		}

		args = append(args, plan...)
	}

	for _, a := range args {
		if image, ok := strings.CutPrefix(a, "outpost.lab.image="); ok {
			if err := install(image, "/dev/vda"); err != nil {
				return err
			}
		}
	}

	cb := "http://" + edge + "/config?u=" + url.QueryEscape(g.UUID)

	var last error

	for range 10 {
		resp, err := (&http.Client{Timeout: 5 * time.Second}).Get(cb)
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

// planArgs asks the edge for the machine's boot script as iPXE asks for it (an EFI x86_64 machine) and returns
// the kernel arguments of the script's kernel line, or toDisk when the edge hands the machine to its disk (no
// script, or a script that exits to the firmware).
func planArgs(edge, uuid, ifname string) (args []string, toDisk bool, err error) {
	iface, err := net.InterfaceByName(ifname)
	if err != nil {
		return nil, false, fmt.Errorf("plan: %w", err)
	}

	q := url.Values{"uuid": {uuid}, "mac": {strings.ReplaceAll(iface.HardwareAddr.String(), ":", "-")}, "arch": {"x86_64"}, "platform": {"efi"}}

	resp, err := (&http.Client{Timeout: 10 * time.Second}).Get("http://" + edge + "/ipxe/boot.ipxe?" + q.Encode())
	if err != nil {
		return nil, false, fmt.Errorf("plan: %w", err)
	}
	defer resp.Body.Close() //nolint:errcheck

	b, err := io.ReadAll(io.LimitReader(resp.Body, 1<<16))
	if err != nil {
		return nil, false, fmt.Errorf("plan: %w", err)
	}

	fmt.Printf("OUTPOST-PLAN status=%d\n", resp.StatusCode)

	if resp.StatusCode != http.StatusOK {
		return nil, resp.StatusCode == http.StatusNotFound, nil
	}

	for _, line := range strings.Split(string(b), "\n") {
		f := strings.Fields(line)

		switch {
		case len(f) > 2 && f[0] == "kernel":
			return f[2:], false, nil
		case len(f) > 0 && f[0] == "exit":
			return nil, true, nil
		}
	}

	return nil, false, nil
}

// install writes the image at src to the disk device dev, whole, and syncs it.
func install(src, dev string) error {
	// The disk's node appears once virtio_blk has probed it.
	deadline := time.Now().Add(30 * time.Second)
	for {
		if _, err := os.Stat(dev); err == nil {
			break
		} else if time.Now().After(deadline) {
			return fmt.Errorf("install: %w", err)
		}

		time.Sleep(100 * time.Millisecond)
	}

	resp, err := (&http.Client{Timeout: 2 * time.Minute}).Get(src)
	if err != nil {
		return fmt.Errorf("install: fetch image: %w", err)
	}
	defer resp.Body.Close() //nolint:errcheck

	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("install: fetch image %s: %s", src, resp.Status)
	}

	disk, err := os.OpenFile(dev, os.O_WRONLY, 0)
	if err != nil {
		return fmt.Errorf("install: %w", err)
	}
	defer disk.Close() //nolint:errcheck

	sum := sha256.New()

	n, err := io.Copy(io.MultiWriter(disk, sum), resp.Body)
	if err != nil {
		return fmt.Errorf("install: write %s: %w", dev, err)
	}

	if err := disk.Sync(); err != nil {
		return fmt.Errorf("install: sync %s: %w", dev, err)
	}

	fmt.Printf("OUTPOST-INSTALL-DONE dev=%s bytes=%d sha256=%x\n", dev, n, sum.Sum(nil))

	return nil
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
