package lab_test

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/outpost-metal/outpost/qemu/lab"
)

// TestWhyDidItNotBoot runs four SeaBIOS machines at one site, each stopped at a different step of its network
// boot, and asks `controller machine why` for each: the answer must name the step that did not happen.
//   - no-dhcp: accepted and ready, its NIC then taken off the site network, rebooted on Omni's request: the
//     controller powered it on and no DHCP request came (named 5 minutes after the power-on);
//   - no-boot-file: the edge refuses its HTTP, so iPXE cannot fetch the script its DHCP answer names (its
//     DHCP requests, which name its UUID, keep coming);
//   - kernel-fails: every download from the edge breaks after 1 MiB, so the kernel never arrives (iPXE
//     retries it): the failed downloads are named;
//   - agent-silent: its agent was given a wrong provider address.
//
// The last three were powered on by hand (by the test), as a person at the rack does.
func TestWhyDidItNotBoot(t *testing.T) {
	ctx, l, e := setupRealAgentLab(t, "why-lab", lab.RealAgentOptions{})

	site := e.Sites[0]

	add := func(i int, name string, agent lab.AgentKind, faults string) *lab.Machine {
		m, err := e.AddMachine(ctx, site, lab.MachineSpec{
			Name: name, UUID: fmt.Sprintf("0e5a1ab0-0000-4000-8000-00000000da%02d", i), MAC: fmt.Sprintf("52:54:00:da:00:%02d", i),
			Firmware: lab.BIOS, BMC: lab.IPMI, Agent: agent, GuestFaults: faults, RunTimeout: 30 * time.Minute,
		})
		if err != nil {
			t.Fatal(err)
		}

		return m
	}

	cases := []struct {
		m *lab.Machine
		// stop brings the machine to its stop; want is what machine why must begin its answer with, after the
		// machine's UUID (byMAC: asked by its MAC).
		stop  func(m *lab.Machine) error
		want  string
		byMAC bool
	}{
		{
			m: add(1, "no-dhcp", lab.TestAgent, ""),
			stop: func(m *lab.Machine) error {
				if err := m.PowerOnToAgent(ctx, 5*time.Minute); err != nil {
					return err
				}

				if err := e.WaitPending(ctx, m, 5*time.Minute); err != nil {
					return err
				}

				if err := e.Omni.Admin.Accept(ctx, m.Spec.UUID); err != nil {
					return err
				}

				if err := e.WaitReadyToUse(ctx, m, 5*time.Minute); err != nil {
					return err
				}

				if err := m.CutNetwork(true); err != nil {
					return err
				}

				boots := len(m.Boots())

				if _, err := e.Omni.Admin.Reboot(ctx, m.Spec.UUID); err != nil {
					return err
				}

				return poll(ctx, 5*time.Minute, func() (bool, error) { return len(m.Boots()) > boots, nil })
			},
			want: "powered on at ",
		},
		{
			m:    add(2, "no-boot-file", lab.TestAgent, ""),
			stop: func(m *lab.Machine) error { return refusedThenOn(ctx, m, 0) },
			// No boot script tied its MAC to its UUID: asked by the MAC the edge saw, machine why finds it by the
			// UUID its DHCP request named (option 97).
			want: "its DHCP request", byMAC: true,
		},
		{
			m:    add(3, "kernel-fails", lab.TestAgent, ""),
			stop: func(m *lab.Machine) error { return refusedThenOn(ctx, m, 1<<20) },
			want: "iPXE fetched its agent-mode boot script at ",
		},
		{
			m:    add(4, "agent-silent", lab.RealAgent, "wrong-provider-address"),
			stop: func(m *lab.Machine) error { return m.PowerOnToAgent(ctx, 5*time.Minute) },
			want: "its agent-mode boot script was served at ",
		},
	}

	runs := map[*lab.Machine]func() (string, error){}
	for _, c := range cases {
		runs[c.m] = func() (string, error) {
			ask, want := c.m.Spec.UUID, c.m.Spec.UUID+": "+c.want
			if c.byMAC {
				ask = c.m.Spec.MAC
			}

			return stopAndAsk(ctx, e, c.m, ask, want, c.stop)
		}
	}

	atOnce(t, l, e, "stopped, then named by machine why", runs)
}

// stopAndAsk brings m to its stop, then asks machine why (naming the machine by ask) until its answer begins
// with want (8 minutes at most: the diagnosis waits out each step's grace, 5 minutes for a first DHCP request).
func stopAndAsk(ctx context.Context, e *lab.Env, m *lab.Machine, ask, want string, stop func(*lab.Machine) error) (string, error) {
	if err := stop(m); err != nil {
		return "", err
	}

	var why string

	err := poll(ctx, 8*time.Minute, func() (bool, error) {
		var err error

		why, err = e.Controller.Command(ctx, time.Minute, "machine", "why", ask)

		return err == nil && strings.HasPrefix(why, want) && strings.Contains(why, "this boot:"), err
	})
	if err != nil {
		return why, fmt.Errorf("machine why does not name the step (%w)", err)
	}

	return why, nil
}

// refusedThenOn makes the edge refuse m's HTTP (after that many bytes a connection, 0: at once) and powers it
// on.
func refusedThenOn(ctx context.Context, m *lab.Machine, after int64) error {
	if err := m.RefuseHTTP(after); err != nil {
		return err
	}

	return m.PowerOn(ctx)
}
