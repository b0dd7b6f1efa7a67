package lab_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/outpost-metal/outpost/qemu/lab"
)

// faultWipeTimeout is the controller's bound of a fast wipe in TestRealMetalAgentUnderFaults (one hour in
// production): long enough for a wipe under TCG, short enough that a hung one ends within the test.
const faultWipeTimeout = 45 * time.Second

// TestRealMetalAgentUnderFaults runs four SeaBIOS machines with the real talos-metal-agent at one site, each
// meeting one fault on its way from acceptance to ready: the Talos API under the agent fails its first two
// wipes ("disk busy"); hangs in its first wipe until the caller gives up (the controller's wipe timeout, 45 s
// here); kills the agent once its wipe call reached machined (the agent is restarted, as Talos restarts it);
// the BMC refuses the first two in-band user creations. Each must reach ready to use in Omni after the
// fault, with its disk markers zeroed on the host; Omni must never show it ready while a marker is still
// there (a wipe reported that did not happen); the fault must have fired as often as asked; and the
// controller's `machine show` must say why the machine waited.
func TestRealMetalAgentUnderFaults(t *testing.T) {
	ctx, l, e := setupRealAgentLab(t, "realagent-faults", lab.RealAgentOptions{WipeTimeout: faultWipeTimeout})

	site := e.Sites[0]

	type faulted struct {
		m       *lab.Machine
		markers []int64
		// fired checks that the fault happened as often as asked.
		fired func(m *lab.Machine, serialFrom int64) error
		// why is what the controller's account of the machine must say, at the start of a timeline line.
		why string
	}

	guestFired := func(name string, n int) func(m *lab.Machine, from int64) error {
		return func(m *lab.Machine, from int64) error {
			if got := strings.Count(string(m.Serial.Since(from)), "OUTPOST-FAULT "+name+" "); got != n {
				return fmt.Errorf("fault %s fired %d times in the guest, want %d", name, got, n)
			}

			return nil
		}
	}

	specs := []struct {
		name, faults string
		refuseUsers  int
		fired        func(m *lab.Machine, from int64) error
		why          string
	}{
		{name: "wipe-errors", faults: "wipe-error:2", fired: guestFired("wipe-error", 2), why: "ERROR Wipe: wipe not started: lab fault: the disk is busy"},
		{name: "wipe-hangs", faults: "wipe-hang:1", fired: guestFired("wipe-hang", 1), why: "ERROR Wipe: no answer within 45s"},
		{name: "agent-killed", faults: "kill-agent-in-wipe:1", fired: guestFired("kill-agent-in-wipe", 1), why: "ERROR Wipe: agent tunnel closed during the call"},
		{name: "bmc-refuses", refuseUsers: 2, why: "ERROR BMCConfiguration: failed to set up IPMI user: cc: 0xd4", fired: func(m *lab.Machine, _ int64) error {
			if got := m.InBandUsersRefused(); got != 2 {
				return fmt.Errorf("the BMC refused %d in-band users, want 2", got)
			}

			return nil
		}},
	}

	var machines []*faulted

	for i, s := range specs {
		m, err := e.AddMachine(ctx, site, lab.MachineSpec{
			Name: s.name, UUID: fmt.Sprintf("0e5a1ab0-0000-4000-8000-0000000fa0%02d", i+1), MAC: fmt.Sprintf("52:54:00:fa:00:%02d", i+1),
			Firmware: lab.BIOS, BMC: lab.IPMI, Agent: lab.RealAgent, GuestFaults: s.faults, RunTimeout: 30 * time.Minute,
		})
		if err != nil {
			t.Fatal(err)
		}

		m.RefuseInBandUsers(s.refuseUsers)
		machines = append(machines, &faulted{m: m, markers: writeDiskMarkers(t, m.Disk), fired: s.fired, why: s.why})
	}

	// Each machine runs its own way through; a failure names the machine.
	runs := map[*lab.Machine]func() (string, error){}
	for _, f := range machines {
		runs[f.m] = func() (string, error) { return "", runFaulted(ctx, e, f.m, f.markers, f.fired, f.why) }
	}

	atOnce(t, l, e, "power-on, accept, through the fault to ready with the disk wiped", runs)

	for _, f := range machines {
		if err := f.m.Failures(); err != nil {
			t.Error(err)
		}
	}
}

// runFaulted powers m on, waits for it pending and accepts it, then waits (15 minutes at most) for Omni to
// report it ready to use, checking at every look that Omni does not report it ready while a disk marker is
// still there; then that its fault fired, its BMC user exists and the controller said why it waited.
func runFaulted(ctx context.Context, e *lab.Env, m *lab.Machine, markers []int64, fired func(*lab.Machine, int64) error, why string) error {
	from := m.Serial.Size()

	if err := m.PowerOnToAgent(ctx, 5*time.Minute); err != nil {
		return err
	}

	if err := e.WaitPending(ctx, m, 5*time.Minute); err != nil {
		return err
	}

	if err := e.Omni.Admin.Accept(ctx, m.Spec.UUID); err != nil {
		return err
	}

	// poll goes on after an error, so a look that finds Omni ahead of the disk is kept apart: it fails the run.
	var reportedUnwiped error

	if err := poll(ctx, 15*time.Minute, func() (bool, error) {
		ready, err := e.ReadyToUse(ctx, m)
		if err != nil || !ready {
			return false, err
		}

		for _, off := range markers {
			zero, err := diskZeroAt(m.Disk, off, len(diskMarker))
			if err != nil {
				return false, err
			}

			if !zero && reportedUnwiped == nil {
				reportedUnwiped = fmt.Errorf("Omni reports it ready to use with the disk marker at %d still there: a wipe reported that did not happen", off)
			}

			if !zero {
				return false, nil
			}
		}

		return true, nil
	}); err != nil {
		return errors.Join(err, reportedUnwiped)
	}

	if reportedUnwiped != nil {
		return reportedUnwiped
	}

	if err := fired(m, from); err != nil {
		return err
	}

	if !m.BMCHasUser(lab.AgentBMCUser) {
		return fmt.Errorf("ready without the BMC user %q", lab.AgentBMCUser)
	}

	show, err := e.Controller.Command(ctx, time.Minute, "machine", "show", m.Spec.UUID)
	if err != nil {
		return fmt.Errorf("machine show: %w", err)
	}

	if !strings.Contains(show, why) {
		return fmt.Errorf("the controller's account of it does not say %q:\n%s", why, show)
	}

	return nil
}
