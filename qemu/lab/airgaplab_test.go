package lab_test

import (
	"context"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/outpost-metal/outpost/qemu/bootlab"
	"github.com/outpost-metal/outpost/qemu/lab"
	"github.com/outpost-metal/outpost/qemu/realomni"
)

// airGapLab sets up an air-gap lab for a test under _out/<name>/<real|standin> (OMNI chooses the Omni as for
// TestE2E, real by default, built or taken from its cache first): the lab's binaries, Omni and the controller,
// and one site per asset policy. timeout bounds the test from then on; the timeline is written and logged at
// cleanup. It skips, with the reason, where the lab cannot run. It returns the lab's images too.
func airGapLab(t *testing.T, name string, timeout time.Duration, policies ...string) (context.Context, *lab.AirGap, lab.Binaries, lab.Images) {
	t.Helper()
	skipUnlessLab(t)

	mode, err := lab.ParseOmniMode(os.Getenv(lab.OmniEnv))
	if err != nil {
		t.Fatal(err)
	}

	var omniBins realomni.Binaries

	if mode == lab.RealOmni {
		// Cached under _out/omni; a cold build takes about 13 minutes on two cores, before any lab is up.
		bctx, cancel := context.WithTimeout(t.Context(), 40*time.Minute)
		omniBins, err = lab.BuildRealOmni(bctx, bootlab.RepoRoot(t), zapLogger(t))

		cancel()

		if err != nil {
			t.Fatal(err)
		}
	}

	l, images, root := newLab(t, filepath.Join(name, string(mode)))

	ctx, cancel := context.WithTimeout(t.Context(), timeout)
	t.Cleanup(cancel)

	bins, err := lab.BuildBinaries(ctx, root, filepath.Join(l.Dir, "bin"))
	if err != nil {
		t.Fatal(err)
	}

	bins.RealOmni = omniBins

	if ok, reason := lab.ControllerSupportsOmni(ctx, bins.Controller); !ok {
		t.Skipf("lab test: %s", reason)
	}

	a, err := lab.SetupAirGap(ctx, l, bins, images, lab.AirGapOptions{Omni: mode, Policies: policies, RepoRoot: root})
	if err != nil {
		t.Fatalf("lab set-up: %v (logs under %s)", err, l.Dir)
	}

	t.Cleanup(func() {
		if err := a.Timeline.Write(); err == nil {
			if b, err := os.ReadFile(a.Timeline.Path); err == nil {
				t.Logf("timeline (%s):\n%s", a.Timeline.Path, b)
			}
		}
	})

	return ctx, a, bins, images
}

// steps runs a lab test's steps on its timeline.
type steps struct {
	t *testing.T
	a *lab.AirGap
}

// step runs one step, records it on the timeline and stops the test at its failure, with the controller's
// last errors.
func (s steps) step(name string, fn func() error) {
	s.t.Helper()

	start := time.Now()
	err := fn()
	s.a.Timeline.Step(name, "", start, err)

	if err != nil {
		s.t.Fatalf("step FAILED: %s: %v\nlast controller errors:\n%s\nlogs: %s (Omni's: %s)", name, err,
			controllerErrors(s.a.Controller), s.a.Lab.Dir, s.a.Omni.Log())
	}

	s.t.Logf("step ok: %s (%s)", name, time.Since(start).Round(time.Second))
}
