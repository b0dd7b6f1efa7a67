package lab

import (
	"bufio"
	"bytes"
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"math/big"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"go.uber.org/zap"

	"github.com/outpost-metal/outpost/qemu/vbmc"
)

// Firmware is a machine's firmware.
type Firmware string

// Firmware kinds.
const (
	// BIOS is SeaBIOS; the virtio NIC's option ROM is iPXE (Debian's ipxe-qemu).
	BIOS Firmware = "bios"
	// UEFI is OVMF with the NIC's option ROM disabled, so OVMF's own PXE client fetches iPXE over TFTP.
	UEFI Firmware = "uefi"
	// UEFISecureBoot is OVMF's Secure Boot build enforcing, with the snakeoil key enrolled (Debian's vars),
	// booting its NIC by UEFI HTTP boot only: it runs only images signed with that key.
	UEFISecureBoot Firmware = "uefi-secureboot"
)

// BMCKind is the protocol a machine's virtual BMC speaks on the site network.
type BMCKind string

// BMC kinds.
const (
	IPMI    BMCKind = "ipmi"
	Redfish BMCKind = "redfish"
)

// MachineSpec describes a machine.
type MachineSpec struct {
	Name     string
	UUID     string
	MAC      string
	Firmware Firmware
	BMC      BMCKind
	// DiskBytes is the virtual disk's size (default 64 MiB).
	DiskBytes int64
	// MemoryMiB defaults to 512.
	MemoryMiB int
	// RunTimeout bounds every QEMU run (power-on to power-off; default 10 minutes).
	RunTimeout time.Duration
	// Agent is the agent it runs in agent mode (default TestAgent; RealAgent: realagent.go).
	Agent AgentKind
	// GuestFaults (RealAgent only) are the faults its guest injects under the agent, "name:count,..."
	// (qemu/labinit: wipe-error, wipe-hang, kill-agent-in-wipe); each line of the console's OUTPOST-FAULT is
	// one injected.
	GuestFaults string
	// Console serves the serial console through the BMC's IPMI SOL (console.go): QEMU's serial line goes to a
	// socket the lab holds, and QEMU still writes the serial log.
	Console bool
	// VirtualMedia gives the machine a CD-ROM drive its Redfish BMC mounts images in (VirtualMedia, QMP
	// underneath): a one-time CD boot starts from it; otherwise the disk comes first and the CD after it, as a
	// server keeps its persistent boot order.
	VirtualMedia bool
}

// IPMIPort is the virtual BMCs' RMCP port.
const IPMIPort = 623

// BootRecord is one power-on, reset or reboot of a machine.
type BootRecord struct {
	At     time.Time
	Reason string
	// PXE says the firmware was told to network boot first (the one-time PXE flag); CD that it was told to boot
	// the virtual CD first (Image the image it held); otherwise disk first.
	PXE   bool
	CD    bool
	Image string
	// SerialOffset is where this boot's serial output starts.
	SerialOffset int64
}

// Machine is a QEMU machine on a site with its virtual BMC.
type Machine struct {
	Spec MachineSpec
	Site *Site
	// Disk is the raw disk image on the host.
	Disk string
	// Serial is the serial console, kept across boots.
	Serial *LogFile
	// BMCAddress is the virtual BMC's address on the site network.
	BMCAddress string
	// Chassis is the virtual BMC's chassis (power, one-time boot override).
	Chassis *vbmc.Chassis

	// OnInstalled is called when the machine reports an installed OS over its BMC channel.
	OnInstalled func(m *Machine)

	lab     *Lab
	log     *zap.Logger
	tap     string
	sock    string
	ipmi    *vbmc.IPMI
	redfish *vbmc.Redfish
	media   *vbmc.Media
	qmp     string
	admin   string
	// console is the serial line as SOL serves it (Spec.Console), consock its socket.
	console *vbmc.Console
	consock string

	mu       sync.Mutex
	qemu     *Proc
	stopping map[*Proc]bool
	boots    []BootRecord
	failures []error
	runs     int
	users    []string
	// bmcSilent is set while the BMC's address is off the network (SetBMCAnswering).
	bmcSilent bool
}

// AddMachine creates a machine on the site (powered off): its disk (filled with a junk pattern, so a wipe
// shows), its tap, its BMC address and virtual BMC (IPMI on UDP 623, plus Redfish on HTTPS 443), and the
// in-band BMC channel its /init uses.
func (s *Site) AddMachine(ctx context.Context, spec MachineSpec) (*Machine, error) {
	if spec.DiskBytes == 0 {
		spec.DiskBytes = 64 << 20
	}

	if spec.MemoryMiB == 0 {
		spec.MemoryMiB = 512
	}

	if spec.RunTimeout == 0 {
		spec.RunTimeout = 10 * time.Minute
	}

	l := s.lab
	m := &Machine{
		Spec: spec, Site: s, lab: l, stopping: map[*Proc]bool{},
		Disk:   filepath.Join(s.Dir, spec.Name+".disk"),
		Serial: &LogFile{Path: filepath.Join(s.Dir, spec.Name+".serial.log")},
		sock:   filepath.Join(s.Dir, spec.Name+".bmc.sock"),
		log:    l.log.With(zap.String("machine", spec.Name), zap.String("site", s.Name)),
	}

	if err := writeJunkDisk(m.Disk, spec.DiskBytes); err != nil {
		return nil, err
	}

	var err error
	if m.tap, err = s.AddTap(); err != nil {
		return nil, err
	}

	if m.BMCAddress, err = s.AddBMCAddress(); err != nil {
		return nil, err
	}

	m.Chassis = vbmc.NewChassis(vbmc.WithHook(m.hook))

	adminPassword := randomHex(8)

	if m.ipmi, err = vbmc.NewIPMI(m.Chassis, "admin", adminPassword); err != nil {
		return nil, err
	}

	// Every BMC answers IPMI (the agent provisions an IPMI user, and Redfish BMCs speak IPMI too); a Redfish
	// machine's BMC also serves Redfish over HTTPS with the same accounts (one user table, as on a server).
	if err := m.serveIPMI(ctx); err != nil {
		return nil, err
	}

	m.admin = adminPassword

	if spec.BMC == Redfish {
		opts := vbmc.RedfishOptions{User: "admin", Password: adminPassword, Accounts: m.ipmi.CheckUser, UUID: spec.UUID}
		if spec.VirtualMedia {
			m.qmp = filepath.Join(s.Dir, spec.Name+".qmp")
			m.media = vbmc.NewMedia(vbmc.QMP{Socket: m.qmp, Device: cdDevice})
			opts.Media = m.media
		}

		m.redfish = vbmc.NewRedfish(m.Chassis, opts)
		if err := m.serveRedfish(ctx); err != nil {
			return nil, err
		}
	}

	if err := m.serveChannel(ctx); err != nil {
		return nil, err
	}

	if spec.Console {
		if err := m.serveConsole(ctx); err != nil {
			return nil, err
		}
	}

	if err := m.serveInBand(ctx); err != nil {
		return nil, err
	}

	l.Defer(m.PowerOffNow)

	return m, nil
}

func randomHex(n int) string {
	b := make([]byte, n)
	if _, err := rand.Read(b); err != nil {
		panic(err) // crypto/rand does not fail on Linux
	}

	return hex.EncodeToString(b)
}

// junk is the pattern a fresh disk holds: not bootable (no boot signature), but visibly not zero.
var junk = bytes.Repeat([]byte("outpost lab junk"), 4096)

func writeJunkDisk(path string, size int64) error {
	f, err := os.Create(path)
	if err != nil {
		return fmt.Errorf("create disk: %w", err)
	}

	if err := f.Truncate(size); err != nil {
		f.Close() //nolint:errcheck

		return fmt.Errorf("size disk: %w", err)
	}

	for off := int64(4096); off+int64(len(junk)) <= size; off += 8 << 20 {
		if _, err := f.WriteAt(junk, off); err != nil {
			f.Close() //nolint:errcheck

			return fmt.Errorf("fill disk: %w", err)
		}
	}

	return f.Close()
}

// BMCActions returns the power and boot-override calls each of the machine's BMC front ends carried out:
// IPMI's, and Redfish's (0 for a machine whose BMC serves no Redfish).
func (m *Machine) BMCActions() (ipmi, redfish int64) {
	if m.redfish != nil {
		redfish = int64(m.redfish.Actions())
	}

	return m.ipmi.Actions(), redfish
}

// DiskZeroed reports whether every byte of the disk is zero (checked on the host).
func (m *Machine) DiskZeroed() (bool, error) {
	f, err := os.Open(m.Disk)
	if err != nil {
		return false, err
	}
	defer f.Close() //nolint:errcheck

	buf := make([]byte, 1<<20)
	r := bufio.NewReaderSize(f, len(buf))

	for {
		n, err := r.Read(buf)
		for _, b := range buf[:n] {
			if b != 0 {
				return false, nil
			}
		}

		if err != nil {
			return true, nil // io.EOF ends the scan
		}
	}
}

// DiskWiped reports whether the disk's first and last MiB are zero (checked on the host): what a fast wipe
// (WipeDisks without zeroes, as Talos's fast wipe) clears, and where the installed OS and partition tables
// live.
func (m *Machine) DiskWiped() (bool, error) {
	f, err := os.Open(m.Disk)
	if err != nil {
		return false, err
	}
	defer f.Close() //nolint:errcheck

	size, err := f.Seek(0, io.SeekEnd)
	if err != nil {
		return false, err
	}

	buf := make([]byte, 1<<20)

	for _, off := range []int64{0, max(size-int64(len(buf)), 0)} {
		n, err := f.ReadAt(buf, off)
		if err != nil && !errors.Is(err, io.EOF) {
			return false, err
		}

		if !bytes.Equal(buf[:n], make([]byte, n)) {
			return false, nil
		}
	}

	return true, nil
}

// DiskHasOS reports whether the disk starts with the installed OS's boot record.
func (m *Machine) DiskHasOS() (bool, error) {
	f, err := os.Open(m.Disk)
	if err != nil {
		return false, err
	}
	defer f.Close() //nolint:errcheck

	b := make([]byte, 512)
	if _, err := f.ReadAt(b, 0); err != nil {
		return false, err
	}

	return b[510] == 0x55 && b[511] == 0xAA && bytes.Contains(b, []byte("OUTPOST-INSTALLED-OS")), nil
}

func (m *Machine) serveIPMI(ctx context.Context) error {
	var conn *net.UDPConn

	if err := InNetns(m.Site.NS, func() error {
		var err error
		conn, err = net.ListenUDP("udp", &net.UDPAddr{IP: net.ParseIP(m.BMCAddress), Port: IPMIPort})

		return err
	}); err != nil {
		return fmt.Errorf("listen ipmi of %s: %w", m.Spec.Name, err)
	}

	ctx, cancel := context.WithCancel(ctx)
	done := make(chan struct{})

	go func() {
		defer close(done)

		if err := m.ipmi.Serve(ctx, conn); err != nil {
			m.log.Warn("ipmi server ended", zap.Error(err))
		}
	}()

	m.lab.Defer(func() { cancel(); conn.Close(); <-done }) //nolint:errcheck

	return nil
}

func (m *Machine) serveRedfish(ctx context.Context) error {
	cert, err := selfSigned(m.BMCAddress)
	if err != nil {
		return err
	}

	var ln net.Listener

	if err := InNetns(m.Site.NS, func() error {
		var err error
		ln, err = net.Listen("tcp", net.JoinHostPort(m.BMCAddress, "443"))

		return err
	}); err != nil {
		return fmt.Errorf("listen redfish of %s: %w", m.Spec.Name, err)
	}

	srv := &http.Server{
		Handler: m.redfish, ReadHeaderTimeout: 10 * time.Second, IdleTimeout: time.Minute,
		TLSConfig:   &tls.Config{Certificates: []tls.Certificate{cert}, MinVersion: tls.VersionTLS12},
		BaseContext: func(net.Listener) context.Context { return ctx },
	}

	go srv.ServeTLS(ln, "", "") //nolint:errcheck

	m.lab.Defer(func() { srv.Close() }) //nolint:errcheck

	return nil
}

func selfSigned(host string) (tls.Certificate, error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return tls.Certificate{}, err
	}

	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "vbmc " + host},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(24 * time.Hour),
		IPAddresses: []net.IP{net.ParseIP(host)}, KeyUsage: x509.KeyUsageDigitalSignature,
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
	}

	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		return tls.Certificate{}, fmt.Errorf("self-signed bmc certificate: %w", err)
	}

	return tls.Certificate{Certificate: [][]byte{der}, PrivateKey: key}, nil
}

// serveChannel serves the machine's in-band BMC channel (its second serial port) on a unix socket.
func (m *Machine) serveChannel(ctx context.Context) error {
	os.Remove(m.sock) //nolint:errcheck

	ln, err := net.Listen("unix", m.sock)
	if err != nil {
		return fmt.Errorf("listen bmc channel of %s: %w", m.Spec.Name, err)
	}

	m.lab.Defer(func() { ln.Close() }) //nolint:errcheck

	go func() {
		for {
			conn, err := ln.Accept()
			if err != nil {
				return
			}

			go m.channel(ctx, conn)
		}
	}()

	return nil
}

func (m *Machine) channel(ctx context.Context, conn net.Conn) {
	defer conn.Close() //nolint:errcheck

	go func() { <-ctx.Done(); conn.Close() }() //nolint:errcheck

	sc := bufio.NewScanner(conn)
	for sc.Scan() {
		fields := strings.Fields(sc.Text())
		if len(fields) == 0 {
			continue
		}

		answer := "OK"

		switch {
		case fields[0] == "GET-LAN":
			answer = fmt.Sprintf("OK %s %d", m.BMCAddress, IPMIPort)
		case fields[0] == "USER-EXISTS" && len(fields) == 2:
			answer = "OK no"
			if m.ipmi.HasUser(fields[1]) {
				answer = "OK yes"
			}
		case fields[0] == "SET-USER" && len(fields) == 3:
			if err := m.ipmi.SetUser(fields[1], fields[2]); err != nil {
				answer = "ERR " + err.Error()

				break
			}

			if m.redfish != nil {
				m.redfish.SetAccount(fields[1], fields[2])
			}

			m.mu.Lock()
			m.users = append(m.users, fields[1])
			m.mu.Unlock()

			m.log.Info("bmc user set in-band", zap.String("username", fields[1]))
		case fields[0] == "INSTALLED":
			m.log.Info("machine reports an installed os")

			if m.OnInstalled != nil {
				go m.OnInstalled(m)
			}
		default:
			// Serial noise (a line the guest printed before the channel was raw): ignore it.
			continue
		}

		if _, err := fmt.Fprintln(conn, answer); err != nil {
			return
		}
	}
}

// hook is the chassis's action on the machine: start, stop or restart the QEMU process.
func (m *Machine) hook(_ context.Context, action vbmc.Action, boot vbmc.Override) error {
	m.mu.Lock()
	defer m.mu.Unlock()

	m.stopLocked()

	if action == vbmc.ActionPowerOff {
		return nil
	}

	return m.startLocked(string(action), boot.Device)
}

// cdDevice is the qdev id of a machine's CD-ROM drive.
const cdDevice = "cdrom0"

// BMCAdmin is the BMC's own administrator account (what an operator types into a first boot).
func (m *Machine) BMCAdmin() (user, password string) { return "admin", m.admin }

// RedfishEndpoint is the machine's Redfish BMC ("" for an IPMI-only one).
func (m *Machine) RedfishEndpoint() string {
	if m.redfish == nil {
		return ""
	}

	return "https://" + m.BMCAddress
}

// Media is the BMC's virtual CD (nil without VirtualMedia).
func (m *Machine) Media() *vbmc.Media { return m.media }

func (m *Machine) stopLocked() {
	if m.qemu == nil {
		return
	}

	p := m.qemu
	m.stopping[p] = true
	m.qemu = nil
	m.mu.Unlock()
	p.Kill()
	m.mu.Lock()
}

// startLocked starts QEMU: network first for a one-time PXE boot, the virtual CD first for a one-time CD boot,
// else disk first (an empty disk then falls through to the CD and the network, as real firmware does).
func (m *Machine) startLocked(reason string, once vbmc.BootDevice) error {
	m.runs++

	pxe, cd := once == vbmc.BootPXE, once == vbmc.BootCD && m.media != nil

	diskIndex, nicIndex, cdIndex := "1", "3", "2"

	switch {
	case pxe:
		diskIndex, nicIndex, cdIndex = "2", "1", "3"
	case cd:
		diskIndex, nicIndex, cdIndex = "2", "3", "1"
	case m.media == nil:
		nicIndex = "2"
	}

	args := []string{
		"-name", m.Spec.Name, "-m", fmt.Sprint(m.Spec.MemoryMiB), "-smp", "1", "-nodefaults", "-display", "none", "-no-reboot",
		"-chardev", m.serialChardev(), "-serial", "chardev:con",
		"-chardev", "socket,id=bmc,path=" + m.sock, "-serial", "chardev:bmc",
		"-smbios", "type=1,uuid=" + m.Spec.UUID,
		"-drive", "file=" + m.Disk + ",format=raw,if=none,id=disk0,cache=writethrough",
		"-device", "virtio-blk-pci,drive=disk0,bootindex=" + diskIndex,
		"-netdev", "tap,id=n0,ifname=" + m.tap + ",script=no,downscript=no",
		"-device", "virtio-rng-pci",
	}

	args = append(args, m.agentArgs()...)

	var image string

	if m.media != nil {
		// The medium the BMC holds goes in at start (QMP changes it while the machine runs); QEMU reads an
		// http image by ranges with its curl block driver.
		image = m.media.Image()

		drive := "if=none,id=cd0,media=cdrom,readonly=on"
		if image != "" {
			drive += ",format=raw,file=" + image
		}

		args = append(args, "-qmp", "unix:"+m.qmp+",server=on,wait=off",
			"-drive", drive, "-device", "ide-cd,drive=cd0,id="+cdDevice+",bootindex="+cdIndex)
	}

	switch m.Spec.Firmware {
	case UEFI, UEFISecureBoot:
		code, varsFile, machine := OVMFCode, OVMFVars, "q35,accel=tcg"
		if m.Spec.Firmware == UEFISecureBoot {
			// The Secure Boot build needs SMM, and its variable store only writable from it.
			code, varsFile, machine = OVMFSecureBootCode, OVMFSnakeoilVars, "q35,smm=on,accel=tcg"
			args = append(args, "-global", "driver=cfi.pflash01,property=secure,value=on",
				// OVMF's boot options for the NIC are PXE then HTTP boot: its fw_cfg knobs turn PXE off.
				"-fw_cfg", "name=opt/org.tianocore/IPv4PXESupport,string=n", "-fw_cfg", "name=opt/org.tianocore/IPv6PXESupport,string=n")
		}

		vars := filepath.Join(m.Site.Dir, m.Spec.Name+".vars.fd")
		if _, err := os.Stat(vars); err != nil {
			b, err := os.ReadFile(varsFile)
			if err != nil {
				return fmt.Errorf("read ovmf vars: %w", err)
			}

			if err := os.WriteFile(vars, b, 0o644); err != nil {
				return fmt.Errorf("write ovmf vars: %w", err)
			}
		}

		args = append(args, "-machine", machine,
			"-drive", "if=pflash,format=raw,readonly=on,file="+code,
			"-drive", "if=pflash,format=raw,file="+vars,
			"-device", "virtio-net-pci,netdev=n0,mac="+m.Spec.MAC+",romfile=,bootindex="+nicIndex)
	default:
		args = append(args, "-machine", "pc,accel=tcg",
			"-device", "virtio-net-pci,netdev=n0,mac="+m.Spec.MAC+",bootindex="+nicIndex)
	}

	rec := BootRecord{At: time.Now(), Reason: reason, PXE: pxe, CD: cd, Image: image, SerialOffset: m.Serial.Size()}

	p, err := m.lab.Start(ProcSpec{
		Name: m.Site.Name + "/" + m.Spec.Name + ".qemu", NS: m.Site.NS, Cmd: "qemu-system-x86_64", Args: args, Append: true,
	})
	if err != nil {
		return err
	}

	m.qemu = p
	m.boots = append(m.boots, rec)
	m.log.Info("machine started", zap.String("reason", reason), zap.Bool("pxe", pxe), zap.Bool("cd", cd), zap.String("image", image))

	go m.watch(p)

	return nil
}

// watch follows one QEMU run: a hard timeout, and what to do when the guest ends it (a reboot starts the
// machine again from its disk-first order, a power-off turns the chassis off).
func (m *Machine) watch(p *Proc) {
	timer := time.NewTimer(m.Spec.RunTimeout)
	defer timer.Stop()

	timedOut := false

	select {
	case <-p.Done():
	case <-timer.C:
		timedOut = true

		p.Kill()
	}

	m.mu.Lock()

	if m.stopping[p] || m.qemu != p {
		delete(m.stopping, p)
		m.mu.Unlock()

		return
	}

	m.qemu = nil
	rec := m.boots[len(m.boots)-1]
	out := m.Serial.Since(rec.SerialOffset)

	if timedOut {
		err := fmt.Errorf("machine %s: QEMU run exceeded %s; serial tail:\n%s", m.Spec.Name, m.Spec.RunTimeout, m.Serial.Tail(2000))
		m.failures = append(m.failures, err)
		m.log.Error("machine timed out", zap.Duration("timeout", m.Spec.RunTimeout))
	} else if p.Err() == nil && !bytes.Contains(out, []byte("reboot: Power down")) {
		// The guest reset itself (the kernel rebooting, iPXE giving up and rebooting, firmware): with
		// -no-reboot QEMU exits, and the machine starts again as real hardware does, in its own boot order
		// (a one-time PXE flag was consumed by the boot that just ended).
		err := m.startLocked("guest-reboot", vbmc.BootNone)
		m.mu.Unlock()

		if err != nil {
			m.log.Error("restart after guest reboot", zap.Error(err))
		} else {
			return
		}

		m.mu.Lock()
	} else if p.Err() != nil {
		m.failures = append(m.failures, fmt.Errorf("machine %s: QEMU exited: %w; log:\n%s", m.Spec.Name, p.Err(), p.Log.Tail(1000)))
	}

	m.mu.Unlock()

	m.Chassis.MachineStopped()
	m.log.Info("machine stopped by itself")
}

// Running reports whether QEMU runs.
func (m *Machine) Running() bool {
	m.mu.Lock()
	defer m.mu.Unlock()

	return m.qemu != nil
}

// Boots returns the machine's boots, oldest first.
func (m *Machine) Boots() []BootRecord {
	m.mu.Lock()
	defer m.mu.Unlock()

	return append([]BootRecord(nil), m.boots...)
}

// LastBoot returns the latest boot (zero when never booted).
func (m *Machine) LastBoot() BootRecord {
	m.mu.Lock()
	defer m.mu.Unlock()

	if len(m.boots) == 0 {
		return BootRecord{}
	}

	return m.boots[len(m.boots)-1]
}

// Failures returns what went wrong with the machine's QEMU runs (timeouts, crashes).
func (m *Machine) Failures() error {
	m.mu.Lock()
	defer m.mu.Unlock()

	return errors.Join(m.failures...)
}

// PowerOn presses the power button: the chassis starts the machine with its current boot override.
func (m *Machine) PowerOn(ctx context.Context) error { return m.Chassis.SetPower(ctx, true) }

// AgentStartMarker is what the lab's /init prints on the serial console when it starts the agent.
const AgentStartMarker = "OUTPOST-AGENT-START"

// PowerOnToAgent presses the power button and waits until the machine's /init starts the agent: the
// "power-on to agent start" every boot comparison measures.
func (m *Machine) PowerOnToAgent(ctx context.Context, timeout time.Duration) error {
	from := m.Serial.Size()
	if err := m.PowerOn(ctx); err != nil {
		return err
	}

	return m.WaitSerial(ctx, from, AgentStartMarker, timeout)
}

// PowerOffNow pulls the plug (lab teardown).
func (m *Machine) PowerOffNow() {
	m.mu.Lock()
	m.stopLocked()
	m.mu.Unlock()
}

// Marker failures on the serial console that end a wait at once.
var serialFailures = []string{"OUTPOST-INIT-FAILED", "Kernel panic", "---[ end Kernel panic"}

// WaitSerial waits for needle on the serial console after from, failing fast on a failure marker, on a
// QEMU failure (timeout, crash) and at the timeout.
func (m *Machine) WaitSerial(ctx context.Context, from int64, needle string, timeout time.Duration) error {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()

	errc := make(chan error, 1)

	go func() { errc <- m.Serial.WaitFor(ctx, from, needle, timeout, serialFailures...) }()

	tick := time.NewTicker(500 * time.Millisecond)
	defer tick.Stop()

	for {
		select {
		case err := <-errc:
			if err != nil {
				return fmt.Errorf("machine %s: %w", m.Spec.Name, err)
			}

			return nil
		case <-tick.C:
			if err := m.Failures(); err != nil {
				cancel()

				return err
			}
		}
	}
}

// AgentCreatedBMCUser reports whether the machine's agent has created its BMC user in-band: through the lab's
// channel for the test agent, on the BMC's own user table (however it got there) for the real agent.
func (m *Machine) AgentCreatedBMCUser() bool {
	if m.Spec.Agent == RealAgent {
		return m.BMCHasUser(AgentBMCUser)
	}

	return len(m.BMCUsersSet()) > 0
}

// BMCUsersSet returns the BMC users the machine's agent created in-band through the lab's channel, in order
// (the test agent's way; the real agent uses /dev/ipmi0).
func (m *Machine) BMCUsersSet() []string {
	m.mu.Lock()
	defer m.mu.Unlock()

	return append([]string(nil), m.users...)
}

// SetBMCAnswering takes the BMC's address off the site network (false) or puts it back (true): a BMC that
// stops answering, as a hung or unplugged one does. Its servers keep their sockets and answer again once
// the address is back. Setting the state it is in does nothing.
func (m *Machine) SetBMCAnswering(answering bool) error {
	m.mu.Lock()
	defer m.mu.Unlock()

	if m.bmcSilent == !answering {
		return nil
	}

	op := "del"
	if answering {
		op = "add"
	}

	if err := m.lab.IP("-n", m.Site.NS, "addr", op, m.BMCAddress+"/32", "dev", "br0"); err != nil {
		return err
	}

	m.bmcSilent = !answering

	return nil
}
