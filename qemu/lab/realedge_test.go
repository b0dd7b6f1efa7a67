package lab_test

import (
	"path/filepath"
	"regexp"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/outpost-metal/outpost/qemu/lab"
)

// TestRealEdgeAgentMode runs the real controller and edge binaries (enrolled over the uplink, across the
// site's WAN link) and PXE-boots a BIOS and a UEFI machine into agent mode through the edge; each agent's
// tunnel opens at the edge. The site is air-gapped: policy offline, no image factory in reach (the lab's
// namespaces have no route out), nothing pre-seeded; the agent kernel and initramfs reach the edge only by
// relay from the controller over the uplink. Unknown machines boot agent mode, so no machine needs Omni.
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

	agentAssets := filepath.Join(l.Dir, "agent-assets")
	require.NoError(t, lab.AgentAssets(images, agentAssets))

	ctrl, err := l.StartController(ctx, core, bins.Controller, o, lab.ControllerOptions{
		LocalAssetsDir: local, PowerCooldown: 5 * time.Second, AgentAssetsDir: agentAssets, AssetPolicy: "offline",
	})
	require.NoError(t, err)

	site, err := l.AddSite(core, 1)
	require.NoError(t, err)

	token, err := ctrl.CreateSite(ctx, site.Name)
	require.NoError(t, err)

	tl := lab.NewTimeline(filepath.Join(l.Dir, "timeline.md"))
	start := time.Now()

	edge, err := site.StartEdge(ctx, bins.Edge, lab.EdgeOptions{Token: token})
	require.NoError(t, err)

	// The controller relays the agent images; the site reports them cached (and nothing needed missing).
	var show string

	require.Eventually(t, func() bool {
		out, err := ctrl.SiteShow(ctx, site.Name)
		if err != nil {
			t.Logf("%v", err)

			return false
		}

		show = out

		return regexp.MustCompile(`(?m)^cached\s+agent/x86_64/vmlinuz\s`).MatchString(show) &&
			regexp.MustCompile(`(?m)^cached\s+agent/x86_64/initramfs\.xz\s`).MatchString(show)
	}, 2*time.Minute, time.Second, "the agent images never reached the site by relay")
	tl.Step("edge start to agent images cached by relay", site.Name, start, nil)
	t.Logf("controller site show %s:\n%s", site.Name, show)
	require.Contains(t, show, "asset policy:  offline")
	require.Regexp(t, `relayed:\s+[1-9][0-9]* bytes`, show)
	require.NotRegexp(t, `(?m)^missing\s+agent/`, show)

	for i, fw := range []lab.Firmware{lab.BIOS, lab.UEFI} {
		m, err := site.AddMachine(ctx, lab.MachineSpec{
			Name: "real-" + string(fw), UUID: []string{"0e5a1ab0-0000-4000-8000-0000000e0001", "0e5a1ab0-0000-4000-8000-0000000e0002"}[i],
			MAC: []string{"52:54:00:0e:0e:01", "52:54:00:0e:0e:02"}[i], Firmware: fw, BMC: lab.IPMI,
		})
		require.NoError(t, err)

		start := time.Now()

		err = m.PowerOnToAgent(ctx, 5*time.Minute)
		tl.Step("power-on to agent start (real edge)", m.Spec.Name, start, err)
		require.NoError(t, err)

		require.NoError(t, edge.WaitFor(ctx, `"agent tunnel opened","component":"tunnel","machine_id":"`+m.Spec.UUID, time.Minute))
		m.PowerOffNow()
	}

	// An edge killed mid-run comes back with its enrolled identity (the used token is not needed again).
	from := edge.Log.Size()
	edge.Kill()

	edge, err = site.StartEdge(ctx, bins.Edge, lab.EdgeOptions{Token: token, Restart: true})
	require.NoError(t, err)
	require.NoError(t, edge.Log.WaitFor(ctx, from, `"uplink connected"`, time.Minute))

	require.NoError(t, tl.Write())
}
