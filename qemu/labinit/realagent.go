package main

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"time"

	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"

	"github.com/outpost-metal/outpost/qemu/guestinit"
	"github.com/outpost-metal/outpost/qemu/machined"
)

// The real agent's pieces in the initramfs (qemu/lab's agent images add them) and the SMBIOS OEM string that
// chooses it for a machine.
const (
	// agentKindKey=real (-smbios type=11,value=outpost.agent=real) runs the real metal agent, not qemu/testagent.
	agentKindKey = "outpost.agent"
	agentReal    = "real"
	// realAgentBinary is the real talos-metal-agent.
	realAgentBinary = "/usr/bin/talos-metal-agent"
	// agentModules lists the in-band IPMI modules (ipmi_si, ipmi_devintf) in load order.
	agentModules = "/agent/modules.order"
	// ipmiDevice is what the agent opens (go-ipmi's open interface).
	ipmiDevice = "/dev/ipmi0"
)

// Time the real agent's machine allows itself.
const (
	// ipmiWait bounds waiting for /dev/ipmi0 after the modules load (the KCS probe under TCG takes a second or so).
	ipmiWait = 30 * time.Second
	// agentRestart is the pause before an exited agent is started again (Talos restarts its services).
	agentRestart = 2 * time.Second
	// rebootGrace lets the agent's answer to a Reboot reach its provider before the machine goes, as Talos's
	// own shutdown takes seconds.
	rebootGrace = time.Second
)

// realAgent runs agent mode as Talos does: the machined stand-in on machined's socket, the real metal agent
// (restarted whenever it exits) dialing metal.provider.address from the kernel command line by itself, and the
// in-band IPMI device it sets BMC users through. It returns errReboot once the stand-in answered a Reboot.
func realAgent(uuid string, args map[string]string, oem []string) error {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()

	spec, _ := guestinit.OEMValue(oem, faultsKey)

	injected, err := parseFaults(spec)
	if err != nil {
		return fmt.Errorf("%s: %w", faultsKey, err)
	}

	if spec != "" {
		fmt.Println("OUTPOST-FAULTS", spec)
	}

	var agentProc agentProcess

	go join(ctx, uuid, args["talos.config"])

	if err := guestinit.LoadModules(agentModules); err != nil {
		return fmt.Errorf("load in-band ipmi modules: %w", err)
	}

	if err := waitFile(ipmiDevice, ipmiWait); err != nil {
		return err
	}

	fmt.Println("OUTPOST-IPMI", ipmiDevice)

	log := zap.New(zapcore.NewCore(zapcore.NewConsoleEncoder(zap.NewDevelopmentEncoderConfig()), zapcore.Lock(os.Stdout), zap.InfoLevel))

	srv, err := machined.New(machined.Config{Tag: talosVersion, Logger: log, BeforeWipe: injected.beforeWipe(&agentProc)})
	if err != nil {
		return err
	}

	if err := os.MkdirAll(filepath.Dir(machined.SocketPath), 0o755); err != nil {
		return err
	}

	ln, err := net.Listen("unix", machined.SocketPath)
	if err != nil {
		return fmt.Errorf("listen on %s: %w", machined.SocketPath, err)
	}

	served := make(chan error, 1)

	go func() { served <- srv.Serve(ctx, ln) }()

	fmt.Println("OUTPOST-AGENT-START", args["metal.provider.address"], "real talos-metal-agent")

	agentArgs := injected.agentArgs(args["metal.provider.address"])
	if len(agentArgs) > 0 {
		fmt.Println("OUTPOST-FAULT", faultWrongProviderAddress, agentArgs[len(agentArgs)-1])
	}

	go superviseAgent(ctx, &agentProc, agentArgs)

	err = <-served

	var reboot *machined.RebootError
	if errors.As(err, &reboot) {
		fmt.Println("OUTPOST-MACHINED-REBOOT mode=" + reboot.Mode.String())
		cancel()
		time.Sleep(rebootGrace) // see rebootGrace: nothing to poll for, the answer is in flight to another machine

		return errReboot
	}

	if err == nil {
		err = errors.New("machined stand-in stopped")
	}

	return err
}

// superviseAgent runs the real agent until ctx ends, starting it again after it exits (it exits whenever its
// tunnel ends; Talos restarts it).
func superviseAgent(ctx context.Context, proc *agentProcess, agentArgs []string) {
	for run := 1; ; run++ {
		cmd := exec.CommandContext(ctx, realAgentBinary, agentArgs...)
		cmd.Stdout, cmd.Stderr = os.Stdout, os.Stdout

		err := cmd.Start()
		if err == nil {
			proc.set(cmd.Process.Pid)
			err = cmd.Wait()
			proc.set(0)
		}

		if ctx.Err() != nil {
			return
		}

		fmt.Printf("OUTPOST-REAL-AGENT-EXIT run=%d: %v\n", run, err)

		select {
		case <-ctx.Done():
			return
		case <-time.After(agentRestart):
		}
	}
}

// waitFile polls for path (a device node devtmpfs creates once its driver binds) until timeout.
func waitFile(path string, timeout time.Duration) error {
	deadline := time.Now().Add(timeout)

	for {
		if _, err := os.Stat(path); err == nil {
			return nil
		}

		if time.Now().After(deadline) {
			return fmt.Errorf("%s did not appear within %s", path, timeout)
		}

		time.Sleep(100 * time.Millisecond) // the driver's probe: nothing to wait on but the node
	}
}
