package lab_test

import (
	"context"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/outpost-metal/outpost/qemu/bootlab"
	"github.com/outpost-metal/outpost/qemu/lab"
)

// TestNeverBootsAndCleanup checks the harness's guarantees: a machine that never boots (a site without any
// boot server) is reported within its run timeout instead of hanging the wait, and Close leaves no
// namespace, tap or QEMU process behind.
func TestNeverBootsAndCleanup(t *testing.T) {
	skipUnlessLab(t)

	root := bootlab.RepoRoot(t)

	l, err := lab.New(root+"/_out/lab-cleanup", zapLogger(t))
	require.NoError(t, err)

	t.Cleanup(l.Close)

	ctx := t.Context()

	core, err := l.AddCore()
	require.NoError(t, err)

	site, err := l.AddSite(core, 1)
	require.NoError(t, err)

	m, err := site.AddMachine(ctx, lab.MachineSpec{
		Name: "never", UUID: "0e5a1ab0-0000-4000-8000-00000000dead", MAC: "52:54:00:0e:de:ad",
		Firmware: lab.BIOS, BMC: lab.IPMI, RunTimeout: 10 * time.Second,
	})
	require.NoError(t, err)
	require.NoError(t, m.PowerOn(ctx))
	require.True(t, m.Running())

	start := time.Now()
	err = m.WaitSerial(ctx, 0, "OUTPOST-PROVISIONED", 2*time.Minute)
	require.ErrorContains(t, err, "QEMU run exceeded")
	require.Less(t, time.Since(start), time.Minute, "the wait did not fail fast")
	require.False(t, m.Running())
	require.False(t, m.Chassis.PowerState(), "the chassis still reports the timed-out machine on")

	// Power it on again and leave it running: Close must stop it.
	require.NoError(t, m.PowerOn(ctx))
	require.True(t, m.Running())

	l.Close()

	out, err := exec.CommandContext(context.Background(), "ip", "netns", "list").Output()
	require.NoError(t, err)
	require.NotContains(t, string(out), strings.TrimPrefix(site.NS, lab.Prefix), "a namespace survived Close")
	require.NotContains(t, string(out), core.NS)
	require.False(t, m.Running())

	pids, _ := exec.CommandContext(context.Background(), "pgrep", "-f", "uuid="+m.Spec.UUID).Output() //nolint:errcheck // no match is exit 1
	require.Empty(t, strings.TrimSpace(string(pids)), "a QEMU process survived Close")
}
