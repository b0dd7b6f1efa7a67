// Command testinit is the /init of the boot lab's initramfs: it loads the virtio network modules listed in
// /modules.order, takes a DHCP lease, reads the machine's SMBIOS UUID and calls back to the edge that booted
// it (the host of talos.config= on the kernel command line) with GET /config?u=<uuid>, then powers off.
// It is test tooling, built statically by the lab tests.
package main

import (
	"fmt"
	"io"
	"net/http"
	"net/url"
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

	edge, err := edgeFromCmdline(g.Cmdline)
	if err != nil {
		return err
	}

	lease, err := guestinit.Network(30 * time.Second)
	if err != nil {
		return err
	}

	fmt.Println("OUTPOST-INIT address", lease.Address)

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
