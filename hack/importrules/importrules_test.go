// Package importrules_test enforces the package boundaries the README describes:
// edge and controller never import each other, shared imports neither,
// and nothing in the product imports the lab (qemu/).
package importrules_test

import (
	"bytes"
	"encoding/json"
	"errors"
	"io"
	"os/exec"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

const module = "github.com/outpost-metal/outpost"

type pkg struct {
	ImportPath string
	Imports    []string
	Deps       []string
}

func list(t *testing.T, args ...string) []pkg {
	t.Helper()

	cmd := exec.Command("go", append([]string{"list", "-json=ImportPath,Imports,Deps"}, args...)...)
	cmd.Dir = "../.."

	var stderr bytes.Buffer

	cmd.Stderr = &stderr

	out, err := cmd.Output()
	require.NoError(t, err, "go list: %s", stderr.String())

	var pkgs []pkg

	dec := json.NewDecoder(bytes.NewReader(out))

	for {
		var p pkg

		err := dec.Decode(&p)
		if errors.Is(err, io.EOF) {
			break
		}

		require.NoError(t, err)

		pkgs = append(pkgs, p)
	}

	return pkgs
}

// area returns the top-level directory of a package of this module, "" for other modules.
func area(path string) string {
	rest, ok := strings.CutPrefix(path, module+"/")
	if !ok {
		return ""
	}

	top, _, _ := strings.Cut(rest, "/")

	return top
}

func TestImportRules(t *testing.T) {
	t.Parallel()

	forbidden := map[string][]string{
		"edge":       {"controller", "qemu"},
		"controller": {"edge", "qemu"},
		"shared":     {"edge", "controller", "qemu"},
		"image":      {"controller", "qemu"},
	}

	pkgs := list(t, "./...")
	require.NotEmpty(t, pkgs)

	for _, p := range pkgs {
		from := area(p.ImportPath)

		for _, imp := range p.Imports {
			to := area(imp)
			for _, bad := range forbidden[from] {
				if to == bad {
					t.Errorf("%s imports %s: %s/** must not import %s/**", p.ImportPath, imp, from, bad)
				}
			}
		}
	}
}

func TestBinariesDoNotLinkTheLab(t *testing.T) {
	t.Parallel()

	for _, p := range list(t, "./controller", "./edge") {
		for _, dep := range p.Deps {
			require.NotEqual(t, "qemu", area(dep), "%s links lab package %s", p.ImportPath, dep)
		}
	}
}
