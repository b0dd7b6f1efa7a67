package lab_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/outpost-metal/outpost/qemu/bootlab"
	"github.com/outpost-metal/outpost/qemu/lab"
	"github.com/outpost-metal/outpost/qemu/realomni"
)

// diskMarker is written into the machine's disk before its first boot, where a fast wipe must zero it.
var diskMarker = []byte("OUTPOST-REAL-AGENT-DISK-MARKER")

// TestRealMetalAgent runs a SeaBIOS lab machine with the real talos-metal-agent (qemu/metalagent, on the
// qemu/machined stand-in, its BMC reached in-band through a KCS interface), driven by the real controller and
// edge: the agent dials the edge's tunnel at the metal.provider.address the edge served; accepted in Omni, the
// controller's SetPowerManagement through it creates the BMC user in-band (read back from the BMC), the wipe
// through BlockDeviceWipe zeroes markers written into the disk image (checked on the host), Omni reports it
// ready to use, and Omni's reboot request power-cycles it back to agent mode.
//
// OMNI chooses the Omni as for TestE2E (real by default). Root, QEMU (TCG). Logs and timeline.md stay under
// _out/realagent-lab/<real|standin>.
func TestRealMetalAgent(t *testing.T) {
	ctx, l, e := setupRealAgentLab(t, "realagent-lab", lab.RealAgentOptions{})

	site := e.Sites[0]

	m, err := e.AddMachine(ctx, site, lab.MachineSpec{
		Name: "real-bios", UUID: "0e5a1ab0-0000-4000-8000-0000000ea101", MAC: "52:54:00:ea:01:01",
		Firmware: lab.BIOS, BMC: lab.IPMI, Agent: lab.RealAgent, RunTimeout: 20 * time.Minute,
	})
	if err != nil {
		t.Fatal(err)
	}

	markers := writeDiskMarkers(t, m.Disk)

	step := func(name string, fn func() error) {
		t.Helper()

		start := time.Now()
		err := fn()
		e.Timeline.Step(name, m.Spec.Name, start, err)
		t.Logf("%-90s %6.1f s", name, time.Since(start).Seconds())

		if err != nil {
			t.Fatalf("step %q: %v (logs under %s)", name, err, l.Dir)
		}
	}

	if m.BMCHasUser(lab.AgentBMCUser) {
		t.Fatalf("the BMC holds %q before the agent ran", lab.AgentBMCUser)
	}

	step("power-on to the real agent started with the edge's provider address", func() error {
		from := m.Serial.Size()
		if err := m.PowerOnToAgent(ctx, 5*time.Minute); err != nil {
			return err
		}

		want := lab.AgentStartMarker + " " + site.EdgeIP() + ":"
		if !m.Serial.Contains(from, want) {
			return fmt.Errorf("agent start line without the edge's address %s: %q", site.EdgeIP(), lastLine(m.Serial.Since(from), lab.AgentStartMarker))
		}

		if !m.Serial.Contains(from, "real talos-metal-agent") {
			return fmt.Errorf("the machine did not start the real agent")
		}

		return nil
	})

	step("the agent's tunnel up at the edge: pending in Omni", func() error { return e.WaitPending(ctx, m, 5*time.Minute) })

	if m.BMCHasUser(lab.AgentBMCUser) {
		t.Fatalf("the BMC holds %q before acceptance", lab.AgentBMCUser)
	}

	var lanCallsBefore int64

	step("accept to the BMC user created in-band by the agent, read back from the BMC", func() error {
		if err := e.Omni.Admin.Accept(ctx, m.Spec.UUID); err != nil {
			return err
		}

		if err := m.WaitBMCUser(ctx, lab.AgentBMCUser, 5*time.Minute); err != nil {
			return err
		}

		lanCallsBefore, _ = m.BMCActions()

		if got := m.BMCUsersSet(); len(got) != 0 {
			return fmt.Errorf("users set through the test agent's channel %v: the real agent must use /dev/ipmi0", got)
		}

		return nil
	})

	step("disk wiped through BlockDeviceWipe: the markers zero on the host", func() error {
		return poll(ctx, 5*time.Minute, func() (bool, error) {
			for _, off := range markers {
				ok, err := diskZeroAt(m.Disk, off, len(diskMarker))
				if err != nil || !ok {
					return false, err
				}
			}

			return true, nil
		})
	})

	step("ready to use in Omni", func() error { return e.WaitReadyToUse(ctx, m, 5*time.Minute) })

	step("preferred on in Omni: running in agent mode", func() error {
		// The stand-in's Omni prefers an idle machine off, and the controller reboots only machines that are on.
		if err := e.Omni.Admin.SetPowerState(ctx, m.Spec.UUID, "on"); err != nil {
			return err
		}

		if err := poll(ctx, 5*time.Minute, func() (bool, error) { return m.Running(), nil }); err != nil {
			return fmt.Errorf("not powered on: %w", err)
		}

		return m.WaitSerial(ctx, m.LastBoot().SerialOffset, lab.AgentStartMarker, 5*time.Minute)
	})

	step("Omni's reboot request: power-cycled over the LAN with the new user, back in agent mode", func() error {
		boots := len(m.Boots())

		if _, err := e.Omni.Admin.Reboot(ctx, m.Spec.UUID); err != nil {
			return err
		}

		if err := poll(ctx, 5*time.Minute, func() (bool, error) { return len(m.Boots()) > boots, nil }); err != nil {
			return fmt.Errorf("no power cycle after the reboot request: %w", err)
		}

		if after, _ := m.BMCActions(); after <= lanCallsBefore {
			return fmt.Errorf("no LAN power call after the user was created (%d, %d before)", after, lanCallsBefore)
		}

		return m.WaitSerial(ctx, m.LastBoot().SerialOffset, lab.AgentStartMarker, 5*time.Minute)
	})

	if err := m.Failures(); err != nil {
		t.Fatal(err)
	}
}

// writeDiskMarkers writes diskMarker into the disk image in its first and last MiB (what a fast wipe zeroes)
// and returns their offsets.
func writeDiskMarkers(t *testing.T, disk string) []int64 {
	t.Helper()

	f, err := os.OpenFile(disk, os.O_RDWR, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close() //nolint:errcheck

	st, err := f.Stat()
	if err != nil {
		t.Fatal(err)
	}

	offs := []int64{4096, st.Size() - 4096}

	for _, off := range offs {
		if _, err := f.WriteAt(diskMarker, off); err != nil {
			t.Fatal(err)
		}
	}

	for _, off := range offs {
		if ok, err := diskZeroAt(disk, off, len(diskMarker)); err != nil || ok {
			t.Fatalf("marker at %d not written: %v", off, err)
		}
	}

	return offs
}

// diskZeroAt reports whether n bytes of the disk image at off are all zero.
func diskZeroAt(disk string, off int64, n int) (bool, error) {
	f, err := os.Open(disk)
	if err != nil {
		return false, err
	}
	defer f.Close() //nolint:errcheck

	b := make([]byte, n)
	if _, err := f.ReadAt(b, off); err != nil {
		return false, err
	}

	return bytes.Equal(b, make([]byte, n)), nil
}

// lastLine returns the last line of out holding needle.
func lastLine(out []byte, needle string) string {
	lines := strings.Split(string(out), "\n")
	for i := len(lines) - 1; i >= 0; i-- {
		if strings.Contains(lines[i], needle) {
			return lines[i]
		}
	}

	return ""
}

// setupRealAgentLab builds what a real-agent lab needs (the real Omni unless OMNI says otherwise, the real
// agent, its images, the binaries) and brings up SetupRealAgent's lab under _out/<dir>/<omni mode>, or skips
// with the reason. The context ends with the test or after 45 minutes.
func setupRealAgentLab(t *testing.T, dir string, opts lab.RealAgentOptions) (context.Context, *lab.Lab, *lab.Env) {
	t.Helper()
	skipUnlessLab(t)

	mode, err := lab.ParseOmniMode(os.Getenv(lab.OmniEnv))
	if err != nil {
		t.Fatal(err)
	}

	root := bootlab.RepoRoot(t)

	bctx, bcancel := context.WithTimeout(t.Context(), 40*time.Minute)
	defer bcancel()

	var omniBins realomni.Binaries

	if mode == lab.RealOmni {
		if omniBins, err = lab.BuildRealOmni(bctx, root, zapLogger(t)); err != nil {
			t.Fatal(err)
		}
	}

	agentBin, err := lab.BuildRealAgent(bctx, root)
	if err != nil {
		t.Fatal(err)
	}

	l, err := lab.New(filepath.Join(root, "_out", dir, string(mode)), zapLogger(t))
	if err != nil {
		t.Fatal(err)
	}

	t.Cleanup(l.Close)
	t.Cleanup(l.CloseOnSignal())

	ctx, cancel := context.WithTimeout(t.Context(), 45*time.Minute)
	t.Cleanup(cancel)

	images, err := lab.BuildAgentImages(ctx, root, filepath.Join(l.Dir, "images"), agentBin)
	if errors.Is(err, bootlab.ErrNoKernel) {
		t.Skipf("lab test: %v", err)
	}

	if err != nil {
		t.Fatal(err)
	}

	bins, err := lab.BuildBinaries(ctx, root, filepath.Join(l.Dir, "bin"))
	if err != nil {
		t.Fatal(err)
	}

	bins.RealOmni = omniBins

	if ok, reason := lab.ControllerSupportsOmni(ctx, bins.Controller); !ok {
		t.Skipf("lab test: %s", reason)
	}

	opts.Omni = mode

	e, err := lab.SetupRealAgent(ctx, l, bins, images, opts)
	if err != nil {
		t.Fatalf("lab set-up: %v (logs under %s)", err, l.Dir)
	}

	t.Cleanup(func() {
		if err := e.Timeline.Write(); err == nil {
			if b, err := os.ReadFile(e.Timeline.Path); err == nil {
				t.Logf("timeline (%s):\n%s", e.Timeline.Path, b)
			}
		}
	})

	return ctx, l, e
}

// atOnce runs each run at the same time, each a machine's way through a test: its time is logged and kept in
// the lab's timeline as step (with what the run returns as its detail), and the test fails naming every machine
// whose run failed (logs under the lab's directory).
func atOnce(t *testing.T, l *lab.Lab, e *lab.Env, step string, runs map[*lab.Machine]func() (detail string, err error)) {
	t.Helper()

	var (
		wg   sync.WaitGroup
		mu   sync.Mutex
		errs []error
	)

	for m, run := range runs {
		wg.Add(1)

		go func() {
			defer wg.Done()

			start := time.Now()
			detail, err := run()
			e.Timeline.Step(step, m.Spec.Name, start, err)
			t.Logf("%-14s %6.1f s  %v\n%s", m.Spec.Name, time.Since(start).Seconds(), err, detail)

			if err != nil {
				mu.Lock()
				errs = append(errs, fmt.Errorf("%s: %w", m.Spec.Name, err))
				mu.Unlock()
			}
		}()
	}

	wg.Wait()

	for _, err := range errs {
		t.Error(err)
	}

	if len(errs) > 0 {
		t.Fatalf("logs under %s", l.Dir)
	}
}
