package lab_test

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/outpost-metal/outpost/qemu/bootlab"
	"github.com/outpost-metal/outpost/qemu/lab"
)

// TestE2E is `make e2e`: the whole lifecycle on two emulated sites with the real controller and edge
// binaries against the Omni stand-in. It stops at the first failing step and names it; logs (every
// process, every serial console) and timeline.md stay under _out/e2e.
func TestE2E(t *testing.T) {
	skipUnlessLab(t)

	if os.Getenv("OMNI_ENDPOINT") != "" {
		t.Skip("lab e2e: OMNI_ENDPOINT is set, but the lab's namespaces have no route to an outside Omni " +
			"(machines join over SideroLink and the controller dials Omni from the core namespace); run it against the stand-in")
	}

	root := bootlab.RepoRoot(t)

	l, err := lab.New(filepath.Join(root, "_out", "e2e"), zapLogger(t))
	if err != nil {
		t.Fatal(err)
	}

	t.Cleanup(l.Close)
	t.Cleanup(l.CloseOnSignal())

	ctx, cancel := context.WithTimeout(t.Context(), 50*time.Minute)
	defer cancel()

	bins, err := lab.BuildBinaries(ctx, root, filepath.Join(l.Dir, "bin"))
	if err != nil {
		t.Fatal(err)
	}

	if ok, reason := lab.ControllerSupportsOmni(ctx, bins.Controller); !ok {
		t.Skipf("lab e2e: %s", reason)
	}

	images, err := lab.BuildImages(ctx, root, filepath.Join(l.Dir, "images"))
	if errors.Is(err, bootlab.ErrNoKernel) {
		t.Skipf("lab e2e: %v", err)
	}

	if err != nil {
		t.Fatal(err)
	}

	env, err := lab.Setup(ctx, l, bins, images)
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

	if err != nil {
		t.Fatalf("%v\nlogs: %s", err, l.Dir)
	}
}
