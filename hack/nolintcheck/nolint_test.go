// Package nolintcheck_test keeps //nolint directives honest: each one names only linters that
// .golangci.yml enables, so a directive always silences something that would otherwise be reported.
package nolintcheck_test

import (
	"bufio"
	"os"
	"os/exec"
	"regexp"
	"strconv"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// standard is golangci-lint's "standard" default set, which .golangci.yml starts from.
var standard = []string{"errcheck", "govet", "ineffassign", "staticcheck", "unused"}

// enabledLinters reads the linters .golangci.yml enables: the standard set and its enable list.
func enabledLinters(t *testing.T) map[string]bool {
	t.Helper()

	f, err := os.Open("../../.golangci.yml")
	require.NoError(t, err)

	defer f.Close()

	on := map[string]bool{}
	for _, l := range standard {
		on[l] = true
	}

	sc := bufio.NewScanner(f)
	inEnable := false

	for sc.Scan() {
		line := sc.Text()
		trimmed := strings.TrimSpace(line)

		switch {
		case line == "linters:":
		case strings.HasPrefix(line, "  enable:"):
			inEnable = true
		case inEnable && strings.HasPrefix(trimmed, "- "):
			on[strings.TrimPrefix(trimmed, "- ")] = true
		case inEnable:
			inEnable = false
		}
	}

	require.NoError(t, sc.Err())

	return on
}

var directive = regexp.MustCompile(`//nolint:([a-z0-9,]+)`)

func TestNolintNamesOnlyEnabledLinters(t *testing.T) {
	on := enabledLinters(t)
	require.True(t, on["bodyclose"], "the enable list of .golangci.yml was not read")

	out, err := exec.Command("git", "-C", "../..", "ls-files", "*.go").Output()
	if err != nil {
		t.Skipf("not a git checkout: %v", err)
	}

	var bad []string

	for _, path := range strings.Fields(string(out)) {
		if strings.HasSuffix(path, ".pb.go") {
			continue
		}

		data, err := os.ReadFile("../../" + path)
		require.NoError(t, err)

		for i, line := range strings.Split(string(data), "\n") {
			for _, m := range directive.FindAllStringSubmatch(line, -1) {
				for _, name := range strings.Split(m[1], ",") {
					if !on[name] {
						bad = append(bad, path+":"+strconv.Itoa(i+1)+": "+name)
					}
				}
			}
		}
	}

	require.Empty(t, bad, "nolint directives for linters .golangci.yml does not enable (drop them, or enable the linter)")
}
