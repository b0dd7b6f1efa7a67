package lab_test

import (
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/outpost-metal/outpost/qemu/lab"
)

// TestRealEdgeAgentMode runs the real controller and edge binaries (enrolled over the uplink, across the
// site's WAN link) and PXE-boots a BIOS and a UEFI machine into agent mode through the edge, with the agent
// kernel and initramfs pre-seeded into the edge's asset cache; each agent's tunnel opens at the edge. It needs no Omni: unknown machines boot agent mode.
func TestRealEdgeAgentMode(t *testing.T) {
	skipUnlessLab(t)

	l, images, root := newLab(t, "lab-real-edge")
	ctx := t.Context()

	bins, err := lab.BuildBinaries(ctx, root, filepath.Join(l.Dir, "bin"))
	require.NoError(t, err)

	core, err := l.AddCore()
	require.NoError(t, err)

	o, err := l.StartStandIn(ctx, core, bins.StandIn)
	require.NoError(t, err)

	local := filepath.Join(l.Dir, "local-assets")
	require.NoError(t, lab.LocalAssets(images, local))

	ctrl, err := l.StartController(ctx, core, bins.Controller, o, lab.ControllerOptions{LocalAssetsDir: local, PowerCooldown: 5 * time.Second})
	require.NoError(t, err)

	site, err := l.AddSite(core, 1)
	require.NoError(t, err)

	token, err := ctrl.CreateSite(ctx, site.Name)
	require.NoError(t, err)

	preseed := filepath.Join(l.Dir, "edge-preseed")
	require.NoError(t, lab.PreseedBundle(images, local, preseed))

	edge, err := site.StartEdge(ctx, bins.Edge, lab.EdgeOptions{Token: token, PreseedDir: preseed})
	require.NoError(t, err)

	tl := lab.NewTimeline(filepath.Join(l.Dir, "timeline.md"))

	for i, fw := range []lab.Firmware{lab.BIOS, lab.UEFI} {
		m, err := site.AddMachine(ctx, lab.MachineSpec{
			Name: "real-" + string(fw), UUID: []string{"0e5a1ab0-0000-4000-8000-0000000e0001", "0e5a1ab0-0000-4000-8000-0000000e0002"}[i],
			MAC: []string{"52:54:00:0e:0e:01", "52:54:00:0e:0e:02"}[i], Firmware: fw, BMC: lab.IPMI,
		})
		require.NoError(t, err)

		start := time.Now()

		require.NoError(t, m.PowerOn(ctx))
		err = m.WaitSerial(ctx, 0, "OUTPOST-AGENT-START", 5*time.Minute)
		tl.Step("power-on to agent start (real edge)", m.Spec.Name, start, err)
		require.NoError(t, err)

		require.NoError(t, edge.WaitFor(ctx, `"agent tunnel opened","component":"tunnel","machine_id":"`+m.Spec.UUID, time.Minute))
		m.PowerOffNow()
	}

	// An edge killed mid-run comes back with its enrolled identity (the used token is not needed again).
	from := edge.Log.Size()
	edge.Kill()

	edge, err = site.StartEdge(ctx, bins.Edge, lab.EdgeOptions{Token: token, PreseedDir: preseed, Restart: true})
	require.NoError(t, err)
	require.NoError(t, edge.Log.WaitFor(ctx, from, `"uplink connected"`, time.Minute))

	require.NoError(t, tl.Write())
}
