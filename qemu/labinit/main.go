// Command labinit is the /init of the lab machines' initramfs, a stand-in for Talos with the metal agent.
// It loads the virtio modules listed in /modules.order, takes a DHCP lease (or the static address of an ip=
// argument: a machine booted from virtual media), reads its SMBIOS UUID and the
// kernel command line (printed on the console), and then:
//
//   - in agent mode (metal.provider.address= on the command line): fetches talos.config (the edge's /config),
//     joins Omni with SideroLink's Provision RPC and the join token found there (the way Talos does; retried
//     while Omni is unreachable), and serves the real management.AgentService over the reverse tunnel to
//     metal.provider.address (qemu/testagent) against the real virtual disk /dev/vda, with its virtual BMC
//     reached in-band over the second serial port; or, for a machine whose SMBIOS OEM strings say
//     outpost.agent=real, runs the real talos-metal-agent on the qemu/machined stand-in with in-band IPMI
//     through /dev/ipmi0 (realagent.go);
//   - in install mode (no metal.provider.address=): writes the installed OS (qemu/lab/osimage) to /dev/vda,
//     reports the install over the BMC channel and reboots.
//
// Every step prints an OUTPOST-* line on the serial console for the lab to follow. It is test tooling.
package main

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"strings"
	"syscall"
	"time"

	"github.com/outpost-metal/outpost/qemu/guestinit"

	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"

	"github.com/outpost-metal/outpost/qemu/lab/osimage"
	"github.com/outpost-metal/outpost/qemu/testagent"
)

// Disk is the machine's virtual disk (virtio-blk).
const Disk = "/dev/vda"

func main() {
	err := run()
	if err != nil && !errors.Is(err, errReboot) {
		fmt.Println("OUTPOST-INIT-FAILED:", err)
	}

	syscall.Sync()

	if errors.Is(err, errReboot) {
		fmt.Println("OUTPOST-REBOOT")
		syscall.Reboot(syscall.LINUX_REBOOT_CMD_RESTART) //nolint:errcheck
	}

	fmt.Println("OUTPOST-POWEROFF")
	syscall.Reboot(syscall.LINUX_REBOOT_CMD_POWER_OFF) //nolint:errcheck

	select {}
}

var errReboot = errors.New("reboot requested")

func run() error {
	g, err := guestinit.Start()
	if err != nil {
		return err
	}

	uuid := g.UUID

	args := parseCmdline(g.Cmdline)
	_, agentMode := args["metal.provider.address"]

	mode := "install"
	if agentMode {
		mode = "agent"
	}

	// The kernel command line as booted (iPXE has put the machine's UUID into talos.config=...?u=): the lab
	// checks on the console what the edge served.
	fmt.Printf("OUTPOST-INIT uuid=%s mode=%s cmdline=%s\n", uuid, mode, g.Cmdline)

	go echoConsole() // a line typed at the console comes back as OUTPOST-ECHO (echo.go)

	// A machine booted from virtual media at a site without DHCP has its address on the command line.
	var lease guestinit.Lease

	if addr, gw, static := guestinit.ParseIPArg(args["ip"]); static {
		lease, err = guestinit.StaticNetwork(30*time.Second, addr, gw)
	} else {
		lease, err = guestinit.Network(30 * time.Second)
	}

	if err != nil {
		return err
	}

	fmt.Println("OUTPOST-INIT address", lease.Address, "router", lease.Routers)

	bmc, err := openBMCChannel("/dev/ttyS1")
	if err != nil {
		return err
	}

	if !agentMode {
		return install(uuid, bmc)
	}

	if kind, _ := guestinit.OEMValue(g.OEM, agentKindKey); kind == agentReal {
		fmt.Println("OUTPOST-INIT agent=real")

		return realAgent(uuid, args, g.OEM)
	}

	return agent(uuid, args, bmc)
}

func parseCmdline(s string) map[string]string {
	out := map[string]string{}

	for _, f := range strings.Fields(s) {
		k, v, _ := strings.Cut(f, "=")
		out[k] = v
	}

	return out
}

func install(uuid string, bmc *bmcChannel) error {
	img := osimage.Build("OUTPOST-INSTALLED-OS " + uuid)

	f, err := os.OpenFile(Disk, os.O_WRONLY, 0)
	if err != nil {
		return fmt.Errorf("open %s: %w", Disk, err)
	}

	if _, err := f.WriteAt(img, 0); err != nil {
		f.Close() //nolint:errcheck

		return fmt.Errorf("write installed os: %w", err)
	}

	if err := f.Sync(); err != nil {
		f.Close() //nolint:errcheck

		return fmt.Errorf("sync %s: %w", Disk, err)
	}

	if err := f.Close(); err != nil {
		return err
	}

	fmt.Println("OUTPOST-INSTALL-WRITTEN", len(img), "bytes")

	if err := bmc.reportInstalled(); err != nil {
		return err
	}

	fmt.Println("OUTPOST-INSTALL-REPORTED")

	return errReboot
}

func agent(uuid string, args map[string]string, bmc *bmcChannel) error {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()

	reboot := make(chan struct{}, 1)

	log := zap.New(zapcore.NewCore(zapcore.NewConsoleEncoder(zap.NewDevelopmentEncoderConfig()), zapcore.Lock(os.Stdout), zap.InfoLevel))

	go join(ctx, uuid, args["talos.config"])

	a, err := testagent.New(testagent.Config{
		Endpoint:  args["metal.provider.address"],
		MachineID: uuid,
		Disks:     []string{Disk},
		BMC:       bmc,
		OnReboot: func() {
			select {
			case reboot <- struct{}{}:
			default:
			}
		},
		Logger: log,
	})
	if err != nil {
		return err
	}

	fmt.Println("OUTPOST-AGENT-START", args["metal.provider.address"])

	done := make(chan error, 1)

	go func() { done <- a.Run(ctx) }()

	select {
	case <-reboot:
		// Let the Reboot RPC's answer leave first.
		time.Sleep(500 * time.Millisecond)

		return errReboot
	case err := <-done:
		return err
	}
}

// join fetches the machine config and provisions with Omni until it succeeds (Omni may be unreachable
// while the site's WAN is down; the agent serves meanwhile).
func join(ctx context.Context, uuid, configURL string) {
	u := strings.ReplaceAll(configURL, "${uuid}", uuid)

	for attempt := 0; ; attempt++ {
		err := joinOnce(ctx, uuid, u)
		if err == nil {
			fmt.Println("OUTPOST-PROVISIONED")

			return
		}

		if attempt%10 == 0 {
			fmt.Println("OUTPOST-JOIN-RETRY:", err)
		}

		select {
		case <-ctx.Done():
			return
		case <-time.After(2 * time.Second):
		}
	}
}

func joinOnce(ctx context.Context, uuid, configURL string) error {
	if configURL == "" {
		return errors.New("no talos.config= on the command line")
	}

	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()

	req, err := http.NewRequestWithContext(ctx, http.MethodGet, configURL, nil)
	if err != nil {
		return err
	}

	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return fmt.Errorf("fetch machine config: %w", err)
	}

	body, err := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
	resp.Body.Close() //nolint:errcheck

	if err != nil || resp.StatusCode != http.StatusOK {
		return fmt.Errorf("fetch machine config: status %d: %w", resp.StatusCode, err)
	}

	apiURL, err := siderolinkAPI(body)
	if err != nil {
		return err
	}

	return provision(ctx, uuid, apiURL)
}

// siderolinkAPI finds the SideroLinkConfig document's apiUrl in the machine config.
func siderolinkAPI(config []byte) (*url.URL, error) {
	sc := bufio.NewScanner(strings.NewReader(string(config)))
	for sc.Scan() {
		if v, ok := strings.CutPrefix(strings.TrimSpace(sc.Text()), "apiUrl:"); ok {
			u, err := url.Parse(strings.Trim(strings.TrimSpace(v), `"'`))
			if err != nil {
				return nil, fmt.Errorf("siderolink api url: %w", err)
			}

			return u, nil
		}
	}

	return nil, errors.New("machine config has no SideroLinkConfig apiUrl")
}
