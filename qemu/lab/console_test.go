package lab_test

import (
	"bytes"
	"context"
	"io"
	"os/exec"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/outpost-metal/outpost/qemu/lab"
)

// consoleOutput collects a console process's output while the test reads it.
type consoleOutput struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (o *consoleOutput) Write(p []byte) (int, error) {
	o.mu.Lock()
	defer o.mu.Unlock()

	return o.b.Write(p)
}

func (o *consoleOutput) String() string {
	o.mu.Lock()
	defer o.mu.Unlock()

	return o.b.String()
}

// console is a running `controller machine console`.
type console struct {
	cmd        *exec.Cmd
	stdin      io.WriteCloser
	out, notes *consoleOutput
	started    time.Time
	exited     chan error
	cancel     context.CancelFunc
}

func startConsole(ctx context.Context, t *testing.T, c *lab.Controller, machine string, write bool) *console {
	t.Helper()

	args := []string{"machine", "console", machine, "--state-dir", c.StateDir}
	if write {
		args = append(args, "--write")
	}

	ctx, cancel := context.WithCancel(ctx)
	con := &console{out: &consoleOutput{}, notes: &consoleOutput{}, exited: make(chan error, 1), cancel: cancel}
	con.cmd = exec.CommandContext(ctx, c.Bin, args...)
	con.cmd.Stdout, con.cmd.Stderr = con.out, con.notes
	con.cmd.WaitDelay = 5 * time.Second

	var err error
	if con.stdin, err = con.cmd.StdinPipe(); err != nil {
		t.Fatal(err)
	}

	con.started = time.Now()
	if err := con.cmd.Start(); err != nil {
		t.Fatal(err)
	}

	go func() { con.exited <- con.cmd.Wait() }()

	t.Cleanup(con.stop)

	return con
}

func (c *console) stop() {
	c.stdin.Close() //nolint:errcheck
	c.cancel()
	<-c.exited
	c.exited <- nil // for a second stop
}

// TestSerialConsole: a lab machine's serial console through its BMC's IPMI SOL, the edge and the uplink, as
// `controller machine console` shows it. A reader attached before the machine reboots sees its boot messages
// (the lab init's OUTPOST-INIT); a writer's typed line reaches the guest, whose init answers it
// (OUTPOST-ECHO); a second writer is refused with the first one named.
func TestSerialConsole(t *testing.T) {
	ctx, _, e := setupRealAgentLab(t, "console-lab", lab.RealAgentOptions{})

	site := e.Sites[0]

	m, err := e.AddMachine(ctx, site, lab.MachineSpec{
		Name: "console", UUID: "0e5a1ab0-0000-4000-8000-00000000c001", MAC: "52:54:00:c0:00:01",
		Firmware: lab.BIOS, BMC: lab.IPMI, Agent: lab.TestAgent, Console: true, RunTimeout: 30 * time.Minute,
	})
	if err != nil {
		t.Fatal(err)
	}

	// Managed, with a BMC the controller knows: powered on by hand, accepted, ready.
	if err := m.PowerOnToAgent(ctx, 5*time.Minute); err != nil {
		t.Fatal(err)
	}

	if err := e.WaitPending(ctx, m, 5*time.Minute); err != nil {
		t.Fatal(err)
	}

	if err := e.Omni.Admin.Accept(ctx, m.Spec.UUID); err != nil {
		t.Fatal(err)
	}

	if err := e.WaitReadyToUse(ctx, m, 10*time.Minute); err != nil {
		t.Fatal(err)
	}

	// A reader, attached before a reboot, sees the machine boot.
	reader := startConsole(ctx, t, e.Controller, m.Spec.UUID, false)

	if err := poll(ctx, 2*time.Minute, func() (bool, error) {
		return strings.Contains(reader.notes.String(), "[console of "), nil
	}); err != nil {
		t.Fatalf("reader never attached: %v; its output:\n%s", err, reader.notes)
	}

	t.Logf("reader attached in %s", time.Since(reader.started).Round(time.Millisecond))

	rebootAt := time.Now()
	if _, err := e.Omni.Admin.Reboot(ctx, m.Spec.UUID); err != nil {
		t.Fatal(err)
	}

	if err := poll(ctx, 10*time.Minute, func() (bool, error) {
		return strings.Contains(reader.out.String(), "OUTPOST-INIT uuid="+m.Spec.UUID), nil
	}); err != nil {
		t.Fatalf("no boot messages through the console: %v; reader saw:\n%s\n%s", err, reader.out, reader.notes)
	}

	t.Logf("first boot line (OUTPOST-INIT) through the console %s after the reboot was asked", time.Since(rebootAt).Round(time.Millisecond))

	reader.stop() // the BMC serves one SOL session at a time

	// A writer: a typed line reaches the guest, and its answer comes back. The BMC may hold the reader's SOL
	// session for a moment after it left: a refused writer tries again.
	var writer *console

	if err := poll(ctx, 2*time.Minute, func() (bool, error) {
		if writer != nil {
			select {
			case err := <-writer.exited:
				writer.exited <- err // for its cleanup
				writer = nil
			default:
				return strings.Contains(writer.notes.String(), "read-write"), nil
			}
		}

		writer = startConsole(ctx, t, e.Controller, m.Spec.UUID, true)

		return false, nil
	}); err != nil {
		t.Fatalf("writer never attached: %v", err)
	}

	typedAt := time.Now()
	if _, err := io.WriteString(writer.stdin, "typed-through-the-uplink\r"); err != nil {
		t.Fatal(err)
	}

	if err := poll(ctx, 2*time.Minute, func() (bool, error) {
		return strings.Contains(writer.out.String(), "OUTPOST-ECHO typed-through-the-uplink"), nil
	}); err != nil {
		t.Fatalf("typing did not reach the guest: %v; writer saw:\n%s\n%s", err, writer.out, writer.notes)
	}

	t.Logf("typed line answered by the guest in %s", time.Since(typedAt).Round(time.Millisecond))

	// A second writer is refused, naming the first.
	out, err := e.Controller.Command(ctx, time.Minute, "machine", "console", m.Spec.UUID, "--write")
	if err == nil || !strings.Contains(err.Error(), "held for writing by") {
		t.Fatalf("a second writer was not refused with the holder named: %v\n%s", err, out)
	}

	t.Logf("second writer refused: %v", err)
}
