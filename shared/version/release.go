package version

import (
	"errors"
	"fmt"
	"strconv"
	"strings"
)

// MaxLen bounds a version string this package reads; longer ones are garbage.
const MaxLen = 128

// Release is a version string read as a release line: vMAJOR.MINOR.PATCH, with the pre-release and build
// suffixes of Semantic Versioning 2.0.0 (https://semver.org), which covers what `git describe --tags --dirty`
// prints for a build past its tag (v0.2.0-5-gabc1234-dirty is on the v0.2 line). A development build (no
// tag known: "dev", "dev-<commit>", or the bare commit `git describe --always` prints) has Dev set and no
// numbers: it is on no release line.
type Release struct {
	Major, Minor, Patch int
	// Dev marks a development build.
	Dev bool
}

// ErrNotVersion means a string is neither a release version nor a development build's.
var ErrNotVersion = errors.New("not a release version (vMAJOR.MINOR.PATCH) nor a development build (dev, dev-<commit>, <commit>)")

// Parse reads a version string as Release.
func Parse(s string) (Release, error) {
	if s == "" || len(s) > MaxLen {
		return Release{}, fmt.Errorf("version of %d bytes: %w", len(s), ErrNotVersion)
	}

	if isDev(s) {
		return Release{Dev: true}, nil
	}

	rest, ok := strings.CutPrefix(s, "v")
	if !ok {
		return Release{}, fmt.Errorf("version %q: %w", s, ErrNotVersion)
	}

	core, build, hasBuild := strings.Cut(rest, "+")
	if hasBuild && !identifiers(build) {
		return Release{}, fmt.Errorf("version %q: bad build metadata: %w", s, ErrNotVersion)
	}

	core, pre, hasPre := strings.Cut(core, "-")
	if hasPre && !identifiers(pre) {
		return Release{}, fmt.Errorf("version %q: bad pre-release: %w", s, ErrNotVersion)
	}

	parts := strings.Split(core, ".")
	if len(parts) != 3 {
		return Release{}, fmt.Errorf("version %q: want three numbers: %w", s, ErrNotVersion)
	}

	var nums [3]int

	for i, p := range parts {
		n, err := number(p)
		if err != nil {
			return Release{}, fmt.Errorf("version %q: %w: %w", s, err, ErrNotVersion)
		}

		nums[i] = n
	}

	return Release{Major: nums[0], Minor: nums[1], Patch: nums[2]}, nil
}

// Line returns the release line "vMAJOR.MINOR", or "dev".
func (r Release) Line() string {
	if r.Dev {
		return "dev"
	}

	return fmt.Sprintf("v%d.%d", r.Major, r.Minor)
}

// number reads one numeric part: digits, no leading zero, at most nine digits.
func number(p string) (int, error) {
	if p == "" || len(p) > 9 || (len(p) > 1 && p[0] == '0') {
		return 0, fmt.Errorf("bad number %q", p)
	}

	if !allIn(p, "0123456789") {
		return 0, fmt.Errorf("bad number %q", p)
	}

	return strconv.Atoi(p)
}

// identifiers reports whether s is dot-separated non-empty identifiers of [0-9A-Za-z-] (semver 2.0.0 §9, §10).
func identifiers(s string) bool {
	if s == "" {
		return false
	}

	for id := range strings.SplitSeq(s, ".") {
		if id == "" {
			return false
		}

		for _, c := range id {
			if !isAlnum(c) && c != '-' {
				return false
			}
		}
	}

	return true
}

func isAlnum(c rune) bool {
	return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z')
}

// isDev reports whether s names a development build: "dev", "dev-<commit>", "<commit>", each optionally
// "-dirty", where a commit is 7 to 40 lower-case hex digits (what String and `git describe --always` print),
// or the pseudo-version the go command stamps on a build of an untagged module
// (v0.0.0-yyyymmddhhmmss-<12 hex digits>, optionally "+dirty"; https://go.dev/ref/mod#pseudo-versions).
func isDev(s string) bool {
	if p, ok := strings.CutPrefix(strings.TrimSuffix(s, "+dirty"), "v0.0.0-"); ok {
		stamp, commit, _ := strings.Cut(p, "-")

		return len(stamp) == 14 && allIn(stamp, "0123456789") && len(commit) == 12 && allIn(commit, hexDigits)
	}

	s = strings.TrimSuffix(s, "-dirty")
	if s == "dev" {
		return true
	}

	s = strings.TrimPrefix(s, "dev-")

	return len(s) >= 7 && len(s) <= 40 && allIn(s, hexDigits)
}

const hexDigits = "0123456789abcdef"

// allIn reports whether every byte of s is one of set.
func allIn(s, set string) bool {
	for i := range len(s) {
		if !strings.ContainsRune(set, rune(s[i])) {
			return false
		}
	}

	return true
}

// Skew is how an edge's release stands to its controller's, when the controller accepts it.
type Skew int

// Skews.
const (
	// SkewSame: the edge is on the controller's release line (patch releases do not count).
	SkewSame Skew = iota
	// SkewOneBehind: the edge is one minor release behind, as during a rollout.
	SkewOneBehind
	// SkewUnchecked: one side is a development build, which is on no release line; only the uplink
	// protocol version (checked before) guards the pair.
	SkewUnchecked
)

// ErrEdgeRefused means a controller does not accept an edge of the version it reported.
var ErrEdgeRefused = errors.New("edge release refused")

// CheckEdge decides whether a controller of version controller accepts an edge that reports version edge.
// A controller accepts edges of its own minor release and of the one before it (same major version); it
// refuses older ones, newer ones (upgrade the controller first) and garbage, with an error naming both
// versions. A development build on either side is accepted unchecked; so is any edge when the controller's
// own version is not a version (a hand-stamped build), since then no line is known to hold it to.
func CheckEdge(controller, edge string) (Skew, error) {
	e, err := Parse(edge)
	if err != nil {
		// Both versions first: a view that shortens the reason keeps them.
		return 0, fmt.Errorf("%w: this controller is %s; the edge reports version %s, which is %w",
			ErrEdgeRefused, quote(controller), quote(edge), ErrNotVersion)
	}

	c, err := Parse(controller)
	if err != nil || c.Dev || e.Dev {
		return SkewUnchecked, nil
	}

	accepted := c.Line() + ".x"
	if c.Minor > 0 {
		accepted += " and " + Release{Major: c.Major, Minor: c.Minor - 1}.Line() + ".x"
	}

	switch {
	case e.Major == c.Major && e.Minor == c.Minor:
		return SkewSame, nil
	case e.Major == c.Major && e.Minor == c.Minor-1:
		return SkewOneBehind, nil
	case e.Major > c.Major || (e.Major == c.Major && e.Minor > c.Minor):
		return 0, fmt.Errorf("%w: edge %s is newer than controller %s: upgrade the controller first "+
			"(controller %s accepts edges of %s)", ErrEdgeRefused, edge, controller, controller, accepted)
	default:
		return 0, fmt.Errorf("%w: edge %s is too old for controller %s, which accepts edges of %s: "+
			"upgrade the edge's appliance to %s", ErrEdgeRefused, edge, controller, accepted, c.Line()+".x")
	}
}

// quote prints a version string from the network safely: quoted, escapes shown, at most 64 bytes of it.
func quote(s string) string {
	if len(s) > 64 {
		return strconv.Quote(s[:64]) + "..."
	}

	return strconv.Quote(s)
}
