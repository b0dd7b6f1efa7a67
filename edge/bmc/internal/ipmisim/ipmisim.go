// Package ipmisim runs OpenIPMI's ipmi_sim (Debian package openipmi) for tests: a BMC implementation nobody here
// wrote, to judge the edge's IPMI client, with Debian's ipmitool as the second opinion. ipmi_sim has no machine to
// power: its chassis control program is a shell script that records the power state and the boot device in files
// (ipmi_sim's "chassis_control" mechanism, lanserv/bmc_chassis.c), so power and boot commands really run through
// ipmi_sim's own code. It listens on 127.0.0.1 only.
package ipmisim

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

// Options configure a simulator.
type Options struct {
	User, Password string
	// NoChassisControl leaves the chassis control program out: ipmi_sim then refuses power and boot commands with
	// completion code CCh (invalid data field in request).
	NoChassisControl bool
}

// Sim is a running ipmi_sim.
type Sim struct {
	// Port is its UDP port on 127.0.0.1.
	Port int
	// Dir holds its configuration and the chassis script's files.
	Dir string

	user, password string
}

// chassisScript is ipmi_sim's chassis control program: "<script> <device> get <parm>..." prints "<parm>:<value>"
// lines, "<script> <device> set <parm> <value>..." stores them (ipmi_sim's lanserv/ipmi_sim_chassiscontrol shows the
// protocol). It appends every call to calls.log, fails while the file "fail" exists (ipmi_sim answers FFh) and,
// while "ignore-boot" exists, accepts a boot device without storing it (a BMC that acknowledges a set and drops it).
const chassisScript = `#!/bin/sh
dir=$(dirname "$0")
dev=$1; op=$2; shift 2
echo "$op $*" >> "$dir/calls.log"
[ -e "$dir/fail" ] && { echo "chassis failure"; exit 1; }
case $op in
get)
	for p in "$@"; do
		case $p in
		power) echo "power:$(cat "$dir/power" 2>/dev/null || echo 0)" ;;
		boot) echo "boot:$(cat "$dir/boot" 2>/dev/null || echo none)" ;;
		*) echo "invalid parameter: $p"; exit 1 ;;
		esac
	done ;;
set)
	while [ $# -gt 0 ]; do
		p=$1; v=$2; shift 2
		case $p in
		power) echo "$v" > "$dir/power" ;;
		reset) ;;
		boot) [ -e "$dir/ignore-boot" ] || echo "$v" > "$dir/boot" ;;
		identify) shift ;;
		*) echo "invalid parameter: $p"; exit 1 ;;
		esac
	done ;;
*) exit 1 ;;
esac
`

// emu is the emulator command file (-f): one BMC at IPMB address 20h, as in ipmi_sim's ipmisim1.emu.
const emu = `mc_setbmc 0x20
mc_add 0x20 0 no-device-sdrs 0x23 9 8 0x9f 0x1291 0xf02
mc_enable 0x20
`

// Start starts ipmi_sim on a free UDP port of 127.0.0.1 and stops it when the test ends; it skips the test, saying
// why, when ipmi_sim or ipmitool is missing. The process is bounded by the test's deadline.
func Start(t *testing.T, opts Options) *Sim {
	t.Helper()

	for _, bin := range []string{"ipmi_sim", "ipmitool"} {
		if _, err := exec.LookPath(bin); err != nil {
			t.Skipf("%s is not installed (Debian packages openipmi and ipmitool; `make deps` installs them as root): %v", bin, err)
		}
	}

	s := &Sim{Dir: t.TempDir(), user: opts.User, password: opts.Password}

	if err := s.writeConfig(opts); err != nil {
		t.Fatalf("ipmisim: %v", err)
	}

	// The port is found free and handed over; another process may take it in between, so try a few.
	var err error

	for range 3 {
		if err = s.start(t, opts); err == nil {
			return s
		}
	}

	t.Fatalf("ipmisim: %v", err)

	return nil
}

func (s *Sim) writeConfig(opts Options) error {
	if err := os.WriteFile(filepath.Join(s.Dir, "chassis.sh"), []byte(chassisScript), 0o755); err != nil { // a program
		return fmt.Errorf("write chassis script: %w", err)
	}

	if err := os.WriteFile(filepath.Join(s.Dir, "sim.emu"), []byte(emu), 0o600); err != nil {
		return fmt.Errorf("write emulator commands: %w", err)
	}

	if err := os.Mkdir(filepath.Join(s.Dir, "state"), 0o700); err != nil {
		return fmt.Errorf("make state dir: %w", err)
	}

	return nil
}

// lanConf is the LAN configuration (ipmi_lan(5)); ipmi_sim takes the users from it when its state has none.
func (s *Sim) lanConf(opts Options, port int) string {
	var b strings.Builder

	fmt.Fprintf(&b, "name \"outpost\"\nset_working_mc 0x20\n")
	fmt.Fprintf(&b, "  startlan 1\n    addr 127.0.0.1 %d\n    priv_limit admin\n", port)

	for _, priv := range []string{"callback", "user", "operator", "admin"} {
		fmt.Fprintf(&b, "    allowed_auths_%s none md2 md5 straight\n", priv)
	}

	fmt.Fprintf(&b, "    guid a123456789abcdefa123456789abcdef\n  endlan\n")

	if !opts.NoChassisControl {
		fmt.Fprintf(&b, "  chassis_control \"%s 0x20\"\n", filepath.Join(s.Dir, "chassis.sh"))
	}

	fmt.Fprintf(&b, "  user 2 true %q %q admin 10 none md2 md5 straight\n", opts.User, opts.Password)

	return b.String()
}

func (s *Sim) start(t *testing.T, opts Options) error {
	t.Helper()

	probe, err := net.ListenUDP("udp", &net.UDPAddr{IP: net.IPv4(127, 0, 0, 1)})
	if err != nil {
		return fmt.Errorf("find a free port: %w", err)
	}

	port := probe.LocalAddr().(*net.UDPAddr).Port
	probe.Close() //nolint:errcheck

	conf := filepath.Join(s.Dir, "lan.conf")
	if err := os.WriteFile(conf, []byte(s.lanConf(opts, port)), 0o600); err != nil {
		return fmt.Errorf("write lan.conf: %w", err)
	}

	deadline, ok := t.Deadline()
	if !ok {
		deadline = time.Now().Add(time.Hour) // go test -timeout 0
	}

	ctx, cancel := context.WithDeadline(context.Background(), deadline)

	out := &syncBuffer{}
	cmd := exec.CommandContext(ctx, "ipmi_sim", "-c", conf, "-f", filepath.Join(s.Dir, "sim.emu"), "-s", filepath.Join(s.Dir, "state"), "-n")
	cmd.Dir = s.Dir
	cmd.Stdout, cmd.Stderr = out, out
	// Its own process group, so that the chassis script's children go with it.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	cmd.Cancel = func() error { return syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL) }
	cmd.WaitDelay = 2 * time.Second

	if err := cmd.Start(); err != nil {
		cancel()

		return fmt.Errorf("start ipmi_sim: %w", err)
	}

	var waitErr error

	exited := make(chan struct{})

	go func() {
		defer close(exited)

		waitErr = cmd.Wait()
	}()

	stop := func() {
		cancel() // kills the group through cmd.Cancel
		<-exited
	}

	if err := waitReady(ctx, port, exited, &waitErr); err != nil {
		stop()

		return fmt.Errorf("ipmi_sim on port %d: %w; its output: %s", port, err, out.String())
	}

	t.Cleanup(func() {
		stop()

		if t.Failed() {
			t.Logf("ipmi_sim output:\n%s\nchassis calls:\n%s", out.String(), s.Calls())
		}
	})

	s.Port = port

	return nil
}

// getChannelAuthCaps is an IPMI v1.5 session-less Get Channel Authentication Capabilities request (RMCP header,
// session header with auth type none, then rsAddr 20h, netFn App, rqAddr 81h, rqSeq 1, command 38h, channel 0Eh
// with the IPMI v2.0 bit, privilege administrator, checksums; IPMI v2.0 §13.6, §22.13): the first message of a
// session, so an answer to it means ipmi_sim serves.
var getChannelAuthCaps = []byte{
	0x06, 0x00, 0xff, 0x07, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x09,
	0x20, 0x18, 0xc8, 0x81, 0x04, 0x38, 0x8e, 0x04, 0xb1,
}

// waitReady polls port until ipmi_sim answers, it exits (then *waitErr says how) or ctx ends (at most 10 s).
func waitReady(ctx context.Context, port int, exited <-chan struct{}, waitErr *error) error {
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()

	conn, err := net.DialUDP("udp", nil, &net.UDPAddr{IP: net.IPv4(127, 0, 0, 1), Port: port})
	if err != nil {
		return fmt.Errorf("dial: %w", err)
	}
	defer conn.Close() //nolint:errcheck

	buf := make([]byte, 512)

	for {
		select {
		case <-exited:
			return fmt.Errorf("exited: %v", *waitErr) //nolint:errorlint // may be nil
		case <-ctx.Done():
			return fmt.Errorf("no answer: %w", ctx.Err())
		default:
		}

		if _, err := conn.Write(getChannelAuthCaps); err == nil {
			_ = conn.SetReadDeadline(time.Now().Add(50 * time.Millisecond)) //nolint:errcheck
			if n, err := conn.Read(buf); err == nil && n > 0 {
				return nil
			}
		} else {
			// Nothing listens yet (ICMP port unreachable): the next attempt is after the read would have waited.
			select {
			case <-time.After(50 * time.Millisecond):
			case <-ctx.Done():
			}
		}
	}
}

// Ipmitool runs Debian's ipmitool over lanplus with cipher suite 3 (ipmi_sim has no 17; without -C ipmitool first
// waits 10 s for a cipher suite list ipmi_sim does not give) and returns its output.
func (s *Sim) Ipmitool(ctx context.Context, args ...string) (string, error) {
	ctx, cancel := context.WithTimeout(ctx, 20*time.Second)
	defer cancel()

	base := []string{"-I", "lanplus", "-H", "127.0.0.1", "-p", fmt.Sprint(s.Port), "-U", s.user, "-E", "-C", "3", "-N", "1", "-R", "3"}
	cmd := exec.CommandContext(ctx, "ipmitool", append(base, args...)...)
	cmd.Env = append(os.Environ(), "IPMI_PASSWORD="+s.password)

	out, err := cmd.CombinedOutput()
	if err != nil {
		return string(out), fmt.Errorf("ipmitool %s: %w: %s", strings.Join(args, " "), err, out)
	}

	return string(out), nil
}

// Power returns the power state the chassis script holds.
func (s *Sim) Power() bool {
	b, _ := os.ReadFile(filepath.Join(s.Dir, "power")) //nolint:errcheck // none yet: off

	return strings.TrimSpace(string(b)) == "1"
}

// BootDevice returns the boot device the chassis script holds ("pxe", "none", ...; "" before any).
func (s *Sim) BootDevice() string {
	b, _ := os.ReadFile(filepath.Join(s.Dir, "boot")) //nolint:errcheck // none yet

	return strings.TrimSpace(string(b))
}

// Calls returns the chassis script's calls so far, one a line ("set power 1", "get boot").
func (s *Sim) Calls() string {
	b, _ := os.ReadFile(filepath.Join(s.Dir, "calls.log")) //nolint:errcheck // none yet

	return string(b)
}

// FailChassis makes the chassis script fail (true) or work again (false).
func (s *Sim) FailChassis(fail bool) error { return s.flag("fail", fail) }

// IgnoreBootDevice makes the chassis script accept a boot device without keeping it (true) or keep it again.
func (s *Sim) IgnoreBootDevice(ignore bool) error { return s.flag("ignore-boot", ignore) }

func (s *Sim) flag(name string, on bool) error {
	path := filepath.Join(s.Dir, name)

	if on {
		return os.WriteFile(path, nil, 0o600)
	}

	if err := os.Remove(path); err != nil && !errors.Is(err, os.ErrNotExist) {
		return err
	}

	return nil
}

// syncBuffer collects a process's output for the test log.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (b *syncBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()

	return b.b.Write(p)
}

func (b *syncBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()

	return b.b.String()
}
