package lab_test

import (
	"os"
	"testing"

	"github.com/outpost-metal/outpost/qemu/lab/tmpcheck"
)

// TestMain runs the lab's tests in a temporary directory of their own and fails the run when they leave
// anything in it (the binaries and logs they write belong under _out/).
func TestMain(m *testing.M) { os.Exit(tmpcheck.Wrap(m).Run()) }
