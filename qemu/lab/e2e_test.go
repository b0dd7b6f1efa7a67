package lab_test

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/outpost-metal/outpost/qemu/bootlab"
	"github.com/outpost-metal/outpost/qemu/lab"
)

// e2eRun is one lab run of TestE2E.
type e2eRun struct {
	omni lab.OmniMode
	// standInOnly takes only the steps a real Omni cannot take with lab machines (lab.Options.StandInOnly).
	standInOnly bool
}

// e2eRuns are the runs OMNI asks for: one mode, all of its scenario; unset, the whole scenario against a
// real Omni, then the stand-in for what only it can show.
func e2eRuns(selector string) ([]e2eRun, error) {
	if strings.TrimSpace(selector) == "" {
		return []e2eRun{{omni: lab.RealOmni}, {omni: lab.StandInOmni, standInOnly: true}}, nil
	}

	mode, err := lab.ParseOmniMode(selector)
	if err != nil {
		return nil, err
	}

	return []e2eRun{{omni: mode}}, nil
}

// TestE2E is `make e2e`: the whole lifecycle on two emulated sites with the real controller and edge
// binaries. OMNI=real runs it against a real Omni v1.9.3 in the lab's core namespace, OMNI=standin against
// the Omni stand-in; unset, both run one after the other (subtests real and standin, never two labs at
// once): everything against the real Omni, then against the stand-in only what a real Omni cannot do with
// machines that are not Talos (power-off once information is collected, install events, the installed OS
// booting from disk). Each run stops at its first failing step and names it; logs (every process, every
// serial console, Omni's) and timeline.md stay under _out/e2e/<real|standin>.
func TestE2E(t *testing.T) {
	skipUnlessLab(t)

	runs, err := e2eRuns(os.Getenv(lab.OmniEnv))
	if err != nil {
		t.Fatal(err)
	}

	root := bootlab.RepoRoot(t)

	for _, run := range runs {
		t.Run(string(run.omni), func(t *testing.T) { runE2E(t, root, run) })
	}
}

func runE2E(t *testing.T, root string, run e2eRun) {
	ctx := t.Context()

	var bins lab.Binaries

	if run.omni == lab.RealOmni {
		// Cached under _out/omni; a cold build takes about 13 minutes on two cores, before any lab is up.
		bctx, cancel := context.WithTimeout(ctx, 40*time.Minute)
		omniBins, err := lab.BuildRealOmni(bctx, root, zapLogger(t))

		cancel()

		if err != nil {
			t.Fatal(err)
		}

		bins.RealOmni = omniBins
	}

	l, err := lab.New(filepath.Join(root, "_out", "e2e", string(run.omni)), zapLogger(t))
	if err != nil {
		t.Fatal(err)
	}

	t.Cleanup(l.Close)
	t.Cleanup(l.CloseOnSignal())

	ctx, cancel := context.WithTimeout(ctx, 30*time.Minute)
	defer cancel()

	built, err := lab.BuildBinaries(ctx, root, filepath.Join(l.Dir, "bin"))
	if err != nil {
		t.Fatal(err)
	}

	built.RealOmni = bins.RealOmni

	if ok, reason := lab.ControllerSupportsOmni(ctx, built.Controller); !ok {
		t.Skipf("lab e2e: %s", reason)
	}

	// Against the real Omni, site 2's machines run the real talos-metal-agent (cached under _out/metalagent);
	// the images then carry it and Debian's generic kernel for in-band IPMI.
	realAgent := run.omni == lab.RealOmni

	var images lab.Images

	if realAgent {
		agentBin, aerr := lab.BuildRealAgent(ctx, root)
		if aerr != nil {
			t.Fatal(aerr)
		}

		images, err = lab.BuildAgentImages(ctx, root, filepath.Join(l.Dir, "images"), agentBin)
	} else {
		images, err = lab.BuildImages(ctx, root, filepath.Join(l.Dir, "images"))
	}

	if errors.Is(err, bootlab.ErrNoKernel) {
		t.Skipf("lab e2e: %v", err)
	}

	if err != nil {
		t.Fatal(err)
	}

	start := time.Now()

	env, err := lab.Setup(ctx, l, built, images, lab.Options{Omni: run.omni, StandInOnly: run.standInOnly, RealAgent: realAgent})
	if err != nil {
		t.Fatalf("lab set-up: %v (logs under %s)", err, l.Dir)
	}

	err = env.Run(ctx, func(name string, err error) {
		if err != nil {
			t.Logf("step FAILED: %s", name)
		} else {
			t.Logf("step ok: %s", name)
		}
	})

	if b, rerr := os.ReadFile(env.Timeline.Path); rerr == nil {
		t.Logf("timeline (%s):\n%s", env.Timeline.Path, b)
	}

	t.Logf("%s run: set-up and scenario took %s", run.omni, time.Since(start).Round(time.Second))

	if err != nil {
		t.Fatalf("%v\nlogs: %s (Omni's: %s)", err, l.Dir, env.Omni.Log())
	}
}
