package version_test

import (
	"bufio"
	"bytes"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/outpost-metal/outpost/shared/version"
)

// headingRE is a release heading of CHANGELOG.md: "## vMAJOR.MINOR.PATCH — YYYY-MM-DD".
var headingRE = regexp.MustCompile(`^## (v\S+) — \d{4}-\d{2}-\d{2}$`)

// releases reads CHANGELOG.md's release headings, in order.
func releases(t *testing.T) []string {
	t.Helper()

	b, err := os.ReadFile("CHANGELOG.md")
	require.NoError(t, err)

	var out []string

	for sc := bufio.NewScanner(bytes.NewReader(b)); sc.Scan(); {
		line := sc.Text()
		if !strings.HasPrefix(line, "## ") {
			continue
		}

		m := headingRE.FindStringSubmatch(line)
		require.NotNil(t, m, "CHANGELOG.md heading %q is not \"## vMAJOR.MINOR.PATCH — YYYY-MM-DD\"", line)
		out = append(out, m[1])
	}

	return out
}

// TestChangelog: every heading is a release, newest first, each a minor or patch step down from the one above.
func TestChangelog(t *testing.T) {
	t.Parallel()

	rs := releases(t)
	require.NotEmpty(t, rs)

	var prev version.Release

	for i, s := range rs {
		r, err := version.Parse(s)
		require.NoError(t, err)
		require.False(t, r.Dev, "%s", s)
		require.Equal(t, fmt.Sprintf("v%d.%d.%d", r.Major, r.Minor, r.Patch), s, "a release heading is a bare vMAJOR.MINOR.PATCH")

		if i > 0 {
			older := r.Major < prev.Major || (r.Major == prev.Major && (r.Minor < prev.Minor || (r.Minor == prev.Minor && r.Patch < prev.Patch)))
			require.True(t, older, "%s is listed below %s but is not older", s, rs[i-1])
		}

		prev = r
	}
}

// TestReleaseBuildVersion: the version a release build reports by default (the Makefile's VERSION, which
// `make build` and `make image` stamp into the binaries and images) is the newest CHANGELOG heading: exactly
// that without the repository's tags (a CI clone, a source archive), that or past it (v0.3.0-4-gabc1234) with
// them. Tags are never needed.
func TestReleaseBuildVersion(t *testing.T) {
	t.Parallel()

	mk, err := exec.LookPath("make")
	if err != nil {
		t.Skip("make not installed: the Makefile's version cannot be read")
	}

	newest := releases(t)[0]
	root, err := filepath.Abs(filepath.Join("..", ".."))
	require.NoError(t, err)

	run := func(env ...string) string {
		cmd := exec.CommandContext(t.Context(), mk, "-s", "--no-print-directory", "-C", root, "version")
		cmd.Env = append(withoutVersion(os.Environ()), env...) // the caller's VERSION would override the default
		out, err := cmd.Output()
		require.NoError(t, err, "make version: %s", out)

		return strings.TrimSpace(string(out))
	}

	// No repository: what a build from a source archive or a clone without tags reports.
	require.Equal(t, newest, run("GIT_DIR="+t.TempDir()))

	// This checkout, tags or not.
	got := run()
	if got != newest {
		require.Regexp(t, `^`+regexp.QuoteMeta(newest)+`(-[0-9]+-g[0-9a-f]+)?(-dirty)?$`, got)
	}

	r, err := version.Parse(got)
	require.NoError(t, err)

	want, err := version.Parse(newest)
	require.NoError(t, err)
	require.Equal(t, want.Line(), r.Line())
}

// withoutVersion drops VERSION from env.
func withoutVersion(env []string) []string {
	var out []string

	for _, kv := range env {
		if !strings.HasPrefix(kv, "VERSION=") {
			out = append(out, kv)
		}
	}

	return out
}
