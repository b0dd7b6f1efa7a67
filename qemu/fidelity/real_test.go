package fidelity_test

import (
	"crypto/rand"
	"encoding/hex"
	"os"
	"os/exec"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.uber.org/zap/zaptest"

	"github.com/outpost-metal/outpost/qemu/fidelity"
	"github.com/outpost-metal/outpost/qemu/realomni"
)

// startRealOmni builds (or takes from the cache) and starts a real Omni in a network namespace of its own, or
// says why it cannot.
func startRealOmni(t *testing.T) (fidelity.Backend, string) {
	t.Helper()

	switch {
	case testing.Short():
		return nil, "-short: a real Omni takes minutes to build on a cold cache"
	case os.Geteuid() != 0:
		return nil, "not root: a real Omni needs a network namespace and a private mount namespace"
	}

	for _, tool := range []string{"ip", "unshare"} {
		if _, err := exec.LookPath(tool); err != nil {
			return nil, tool + " is missing"
		}
	}

	ctx := t.Context()
	log := zaptest.NewLogger(t).Named("real-omni")

	bins, err := realomni.Build(ctx, realomni.BuildOptions{Logger: log})
	require.NoError(t, err)

	b := make([]byte, 3)
	_, err = rand.Read(b)
	require.NoError(t, err)

	ns := "ol-fidelity-" + hex.EncodeToString(b)
	out, err := exec.Command("ip", "netns", "add", ns).CombinedOutput()
	require.NoError(t, err, "%s", out)
	t.Cleanup(func() { exec.Command("ip", "netns", "del", ns).Run() }) //nolint:errcheck

	out, err = exec.Command("ip", "-n", ns, "link", "set", "lo", "up").CombinedOutput()
	require.NoError(t, err, "%s", out)

	o, err := realomni.Start(ctx, realomni.Config{Dir: t.TempDir(), Netns: ns, Binaries: bins, Logger: log, StartTimeout: 2 * time.Minute})
	require.NoError(t, err)
	t.Cleanup(func() {
		o.Stop()

		if t.Failed() {
			b, _ := os.ReadFile(o.Log()) //nolint:errcheck
			t.Logf("real omni log, last 16 KiB:\n%s", b[max(0, len(b)-16384):])
		}
	})

	real, err := fidelity.NewReal(ctx, o, "bare-metal")
	require.NoError(t, err)
	t.Cleanup(func() { real.Close() }) //nolint:errcheck

	return real, ""
}
