package metalagent_test

import (
	"context"
	"debug/elf"
	"os"
	"path/filepath"
	"testing"
	"time"

	"go.uber.org/zap/zaptest"

	"github.com/outpost-metal/outpost/qemu/metalagent"
)

// TestBuildIsStaticAndCached builds the real agent (skipped with -short: it fetches modules and compiles for
// about a minute when cold) and checks that it is a static binary, cached under its version, and that a
// second build returns the cached one without building.
func TestBuildIsStaticAndCached(t *testing.T) {
	if testing.Short() {
		t.Skip("builds the real metal agent from the module proxy (minutes when cold)")
	}

	ctx, cancel := context.WithTimeout(t.Context(), 20*time.Minute)
	defer cancel()

	bin, err := metalagent.Build(ctx, metalagent.BuildOptions{Logger: zaptest.NewLogger(t)})
	if err != nil {
		t.Fatal(err)
	}

	if got := filepath.Base(filepath.Dir(bin)); len(got) < len(metalagent.Version) || got[:len(metalagent.Version)] != metalagent.Version {
		t.Fatalf("cache directory %s is not keyed by version %s", got, metalagent.Version)
	}

	f, err := elf.Open(bin)
	if err != nil {
		t.Fatal(err)
	}

	defer f.Close() //nolint:errcheck

	for _, p := range f.Progs {
		if p.Type == elf.PT_INTERP {
			t.Fatalf("%s has an ELF interpreter: not static", bin)
		}
	}

	before, err := os.Stat(bin)
	if err != nil {
		t.Fatal(err)
	}

	start := time.Now()

	again, err := metalagent.Build(ctx, metalagent.BuildOptions{})
	if err != nil {
		t.Fatal(err)
	}

	after, err := os.Stat(again)
	if err != nil {
		t.Fatal(err)
	}

	if again != bin || !after.ModTime().Equal(before.ModTime()) {
		t.Fatalf("second build gave %s (modified %s), want the cached %s (modified %s)", again, after.ModTime(), bin, before.ModTime())
	}

	t.Logf("cached agent %s (%d bytes), second call %s", bin, after.Size(), time.Since(start).Round(time.Millisecond))
}
