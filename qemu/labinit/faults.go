package main

import (
	"context"
	"errors"
	"fmt"
	"net"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"
)

// faultsKey (-smbios type=11,value=outpost.faults=wipe-error:2,...) lists the faults a real-agent machine's
// guest injects under the agent, each "name:count" (the first count calls fail that way).
const faultsKey = "outpost.faults"

// The faults the guest knows.
const (
	// faultWipeError: machined's BlockDeviceWipe fails before touching a disk, as a Talos whose disk is busy.
	faultWipeError = "wipe-error"
	// faultWipeHang: BlockDeviceWipe hangs until the agent's call ends (its caller's deadline), wiping nothing.
	faultWipeHang = "wipe-hang"
	// faultKillAgentInWipe: once the agent's wipe call reached machined, the agent is killed (SIGKILL); the
	// wipe does not start, and the agent is started again as Talos restarts its services.
	faultKillAgentInWipe = "kill-agent-in-wipe"
	// faultWrongProviderAddress: the agent is started with --provider-address pointing at port 1 of the
	// address the kernel arguments name (refused), as an agent given a wrong address; not a wipe fault.
	faultWrongProviderAddress = "wrong-provider-address"
)

// hangBound bounds a hung wipe that nobody cancels.
const hangBound = 10 * time.Minute

// faults are the counts of parseFaults: how many wipe calls each fault takes, in the order listed.
type faults struct {
	order  []string
	counts map[string]int
}

// parseFaults reads "name:count,..." (an empty string: no faults).
func parseFaults(s string) (faults, error) {
	f := faults{counts: map[string]int{}}

	for item := range strings.SplitSeq(s, ",") {
		if item = strings.TrimSpace(item); item == "" {
			continue
		}

		name, count, ok := strings.Cut(item, ":")
		if !ok {
			count = "1"
		}

		switch name {
		case faultWipeError, faultWipeHang, faultKillAgentInWipe, faultWrongProviderAddress:
		default:
			return faults{}, fmt.Errorf("unknown fault %q", name)
		}

		n, err := strconv.Atoi(count)
		if err != nil || n < 0 || n > 100 {
			return faults{}, fmt.Errorf("fault %s: count %q is not 0..100", name, count)
		}

		if _, dup := f.counts[name]; dup {
			return faults{}, fmt.Errorf("fault %s listed twice", name)
		}

		f.order = append(f.order, name)
		f.counts[name] = n
	}

	return f, nil
}

// agentArgs are the agent's arguments under these faults: none, or a wrong --provider-address in place of the
// kernel argument's (its host, port 1).
func (f faults) agentArgs(providerAddress string) []string {
	if f.counts[faultWrongProviderAddress] == 0 {
		return nil
	}

	host, _, err := net.SplitHostPort(providerAddress)
	if err != nil {
		host = providerAddress
	}

	return []string{"--provider-address", net.JoinHostPort(host, "1")}
}

// agentProcess is the running agent, which a fault may kill.
type agentProcess struct {
	mu  sync.Mutex
	pid int
}

func (a *agentProcess) set(pid int) {
	a.mu.Lock()
	defer a.mu.Unlock()

	a.pid = pid
}

func (a *agentProcess) kill() error {
	a.mu.Lock()
	defer a.mu.Unlock()

	if a.pid == 0 {
		return errors.New("no agent running")
	}

	return syscall.Kill(a.pid, syscall.SIGKILL)
}

// beforeWipe is machined's BeforeWipe for these faults: wipe call n meets the fault whose turn it is (the
// first fault's count of calls, then the next's), printed on the console for the lab to count.
func (f faults) beforeWipe(agent *agentProcess) func(ctx context.Context, call int) error {
	return func(ctx context.Context, call int) error {
		first := 1

		for _, name := range f.order {
			if name == faultWrongProviderAddress {
				continue
			}

			if call >= first+f.counts[name] {
				first += f.counts[name]

				continue
			}

			fmt.Printf("OUTPOST-FAULT %s call=%d\n", name, call)

			switch name {
			case faultWipeError:
				return errors.New("lab fault: the disk is busy")
			case faultWipeHang:
				select {
				case <-ctx.Done():
				case <-time.After(hangBound):
				}

				return fmt.Errorf("lab fault: the wipe hung until %w", context.Cause(ctx))
			case faultKillAgentInWipe:
				if err := agent.kill(); err != nil {
					return fmt.Errorf("lab fault: kill the agent: %w", err)
				}

				select {
				case <-ctx.Done():
				case <-time.After(10 * time.Second):
				}

				return errors.New("lab fault: the agent was killed during its wipe")
			}
		}

		return nil
	}
}
