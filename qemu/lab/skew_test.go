package lab_test

import (
	"context"
	"fmt"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/outpost-metal/outpost/qemu/lab"
	"github.com/outpost-metal/outpost/shared/version"
)

// TestEdgeOneVersionBehind runs today's controller, built as a release (the version `make version` gives:
// shared/version/CHANGELOG.md's newest heading), with the edge of the previous release built from that
// release's commit in the repository's own history (lab.PreviousRelease; git archive, go build, its version
// stamped as its release build would have). The old edge enrolls, a BIOS machine (IPMI BMC) and a UEFI machine
// (Redfish BMC) PXE-boot through it into agent mode on their real firmware, and Omni (the stand-in) accepts
// them: the controller provisions their BMC users through their agents and wipes their disks (checked on the
// host) through the old edge, then powers them off. `controller site list` shows the site with the old
// edge's version. The same commit's edge stamped two minors back, and stamped with a garbage version, is
// refused: `controller site list` and `site show` say why, naming both versions.
//
// Root, QEMU (TCG). Logs and timeline.md stay under _out/skew.
func TestEdgeOneVersionBehind(t *testing.T) {
	skipUnlessLab(t)

	l, images, root := newLab(t, "skew")

	ctx, cancel := context.WithTimeout(t.Context(), 40*time.Minute)
	defer cancel()

	current := releaseVersion(ctx, t, root)
	cur, err := version.Parse(current)
	require.NoError(t, err)
	require.False(t, cur.Dev, "make version printed a development version %q", current)

	prev, err := version.Parse(lab.PreviousRelease.Version)
	require.NoError(t, err)
	require.Equal(t, version.Release{Major: cur.Major, Minor: cur.Minor - 1}.Line(), prev.Line(),
		"lab.PreviousRelease (%s) is not the release before %s: set it to the previous release's commit", lab.PreviousRelease.Version, current)
	require.GreaterOrEqual(t, cur.Minor, 2, "no release two minors back to refuse")

	tooOld := fmt.Sprintf("v%d.%d.0", cur.Major, cur.Minor-2)
	garbage := "v0.2.0 (patched)"

	bins, err := lab.BuildBinaries(ctx, root, filepath.Join(l.Dir, "bin"))
	require.NoError(t, err)
	require.NoError(t, lab.BuildStamped(ctx, root, "./controller", current, bins.Controller))
	requireVersion(ctx, t, bins.Controller, "controller version "+current)

	start := time.Now()
	oldEdge, err := lab.BuildAt(ctx, root, lab.PreviousRelease.Commit, "./edge", lab.PreviousRelease.Version)
	require.NoError(t, err)
	t.Logf("edge %s from commit %s: %s (built or cached in %s)", lab.PreviousRelease.Version, lab.PreviousRelease.Commit[:12],
		oldEdge, time.Since(start).Round(100*time.Millisecond))
	requireVersion(ctx, t, oldEdge, "edge version "+lab.PreviousRelease.Version)

	bins.Edge = oldEdge

	e, err := lab.SetupRealAgent(ctx, l, bins, images, lab.RealAgentOptions{Omni: lab.StandInOmni})
	require.NoError(t, err, "lab set-up (logs under %s)", l.Dir)

	t.Cleanup(func() {
		if err := e.Timeline.Write(); err == nil {
			t.Logf("timeline: %s", e.Timeline.Path)
		}
	})

	site := e.Sites[0]
	step := func(name string, fn func() error) {
		t.Helper()

		start := time.Now()
		err := fn()
		e.Timeline.Step(name, site.Name, start, err)
		require.NoError(t, err, "step %q (logs under %s)", name, l.Dir)
		t.Logf("step ok: %s (%s)", name, time.Since(start).Round(time.Second))
	}

	step("the "+lab.PreviousRelease.Version+" edge enrolls and connects to the "+current+" controller", func() error {
		if err := e.Edges[0].Log.WaitFor(ctx, 0, `"uplink connected"`, 2*time.Minute); err != nil {
			return err
		}

		return e.Controller.Proc.Log.WaitFor(ctx, 0, `"edge one release behind accepted"`, time.Minute)
	})

	step("controller site list shows the site connected with its edge's version", func() error {
		out, err := e.Controller.Command(ctx, 30*time.Second, "site", "list")
		if err != nil {
			return err
		}

		t.Logf("controller site list:\n%s", out)

		want := `(?m)^` + regexp.QuoteMeta(site.Name) + `\s+connected\s+` + regexp.QuoteMeta(lab.PreviousRelease.Version) + `\s`
		if !regexp.MustCompile(want).MatchString(out) {
			return fmt.Errorf("site list has no row matching %s", want)
		}

		return nil
	})

	var ms []*lab.Machine

	for i, kind := range []struct {
		fw  lab.Firmware
		bmc lab.BMCKind
	}{{lab.BIOS, lab.IPMI}, {lab.UEFI, lab.Redfish}} {
		m, err := e.AddMachine(ctx, site, lab.MachineSpec{
			Name: "skew-" + string(kind.fw), UUID: fmt.Sprintf("0e5a1ab0-0000-4000-8000-00000005e0%02d", i+1),
			MAC: fmt.Sprintf("52:54:00:5e:00:%02d", i+1), Firmware: kind.fw, BMC: kind.bmc,
		})
		require.NoError(t, err)

		ms = append(ms, m)
	}

	step("both machines PXE-boot through the old edge into agent mode and are pending in Omni", func() error {
		for _, m := range ms {
			if err := m.PowerOn(ctx); err != nil {
				return err
			}
		}

		for _, m := range ms {
			if err := m.WaitSerial(ctx, 0, lab.AgentStartMarker, 5*time.Minute); err != nil {
				return err
			}

			if err := e.WaitPending(ctx, m, 5*time.Minute); err != nil {
				return err
			}
		}

		return nil
	})

	step("accepted: BMC users provisioned through their agents, disks wiped, powered off, through the old edge", func() error {
		for _, m := range ms {
			if err := e.AcceptAndSettle(ctx, m); err != nil {
				return fmt.Errorf("%s: %w", m.Spec.Name, err)
			}
		}

		return nil
	})

	step("what the old edge cannot do is said as such: it reads no hardware inventory", func() error {
		return e.Controller.Proc.Log.WaitFor(ctx, 0, "is of an earlier release, which reads no hardware inventory: upgrade its appliance", time.Minute)
	})

	// Refused edges: the same commit's edge two minors back, and one whose version is garbage.
	for i, v := range []string{tooOld, garbage} {
		refused, err := l.AddSite(e.Core, 2+i)
		require.NoError(t, err)

		bin, err := lab.BuildAt(ctx, root, lab.PreviousRelease.Commit, "./edge", v)
		require.NoError(t, err)

		token, err := e.Controller.CreateSite(ctx, refused.Name)
		require.NoError(t, err)

		p, err := refused.StartEdge(ctx, bin, lab.EdgeOptions{Token: token})
		require.NoError(t, err)

		// Said in full, both versions and what to do: a line cut short would keep the operator guessing.
		want := fmt.Sprintf("edge %s is too old for controller %s, which accepts edges of %s.x and %s.x: "+
			"upgrade the edge's appliance to %s.x", v, current, cur.Line(), prev.Line(), cur.Line())
		if v == garbage {
			want = fmt.Sprintf("this controller is %q; the edge reports version %q, which is not a release version", current, v)
		}

		start := time.Now()

		var list, show string

		require.Eventually(t, func() bool {
			list, err = e.Controller.Command(ctx, 30*time.Second, "site", "list")

			return err == nil && strings.Contains(list, refused.Name+": edge refused ") && strings.Contains(list, want)
		}, 2*time.Minute, time.Second, "site list never showed %s refused with %q:\n%s", refused.Name, want, list)
		e.Timeline.Step("an edge reporting "+v+" is refused, site list says why", refused.Name, start, nil)

		show, err = e.Controller.SiteShow(ctx, refused.Name)
		require.NoError(t, err)
		t.Logf("edge %s refused; controller site list:\n%s\ncontroller site show %s:\n%s", v, list, refused.Name, show)
		require.Regexp(t, `(?m)^state:\s+edge-refused$`, show)
		require.Contains(t, show, want)
		require.Contains(t, show, current, "the refusal names the controller's version")
		require.Contains(t, show, v, "the refusal names the edge's version")

		// The edge says the same in its own log, and is never connected.
		require.True(t, p.Log.Contains(0, "edge release refused"), "the refused edge's log does not say why")
		require.False(t, p.Log.Contains(0, `"uplink connected"`))
	}
}

// releaseVersion is the version a release build of the tree at root reports (`make version`).
func releaseVersion(ctx context.Context, t *testing.T, root string) string {
	t.Helper()

	out, err := exec.CommandContext(ctx, "make", "-s", "--no-print-directory", "-C", root, "version").Output()
	require.NoError(t, err, "make version")

	return strings.TrimSpace(string(out))
}

// requireVersion checks what bin --version prints.
func requireVersion(ctx context.Context, t *testing.T, bin, want string) {
	t.Helper()

	out, err := exec.CommandContext(ctx, bin, "--version").CombinedOutput()
	require.NoError(t, err, "%s --version: %s", bin, out)
	require.Equal(t, want, strings.TrimSpace(string(out)))
}
