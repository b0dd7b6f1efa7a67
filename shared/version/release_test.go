package version_test

import (
	"errors"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/outpost-metal/outpost/shared/version"
)

func TestParse(t *testing.T) {
	t.Parallel()

	for _, tc := range []struct {
		name, in string
		want     version.Release
	}{
		{name: "release", in: "v0.2.0", want: version.Release{Minor: 2}},
		{name: "patch", in: "v1.12.3", want: version.Release{Major: 1, Minor: 12, Patch: 3}},
		{name: "past its tag", in: "v0.2.0-5-gabc1234", want: version.Release{Minor: 2}},
		{name: "past its tag, dirty", in: "v0.2.0-5-gabc1234-dirty", want: version.Release{Minor: 2}},
		{name: "release candidate", in: "v0.3.0-rc.1", want: version.Release{Minor: 3}},
		{name: "build metadata", in: "v0.3.0+20261203.linux", want: version.Release{Minor: 3}},
		{name: "go pseudo-version past a tag", in: "v0.2.1-0.20261203203640-58fa1dc12345", want: version.Release{Minor: 2, Patch: 1}},
		{name: "dev", in: "dev", want: version.Release{Dev: true}},
		{name: "dev with commit", in: "dev-58fa1dc12345-dirty", want: version.Release{Dev: true}},
		{name: "bare commit", in: "58fa1dc", want: version.Release{Dev: true}},
		{name: "bare commit, dirty", in: "58fa1dc-dirty", want: version.Release{Dev: true}},
		{name: "go pseudo-version, no tag", in: "v0.0.0-20261203203640-58fa1dc12345+dirty", want: version.Release{Dev: true}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()

			got, err := version.Parse(tc.in)
			require.NoError(t, err)
			require.Equal(t, tc.want, got)
		})
	}
}

func TestParseRefusesGarbage(t *testing.T) {
	t.Parallel()

	for _, in := range []string{
		"", "banana", "0.2.0", "v0.2", "v0.2.0.1", "v01.2.0", "v0.2.x", "v-1.2.0", "v0.2.0-", "v0.2.0+", "v0.2.0-a..b",
		"v0.2.0-\x1b[31m", "v1234567890.0.0", "58FA1DC", "58fa1d", "dev-", "dev-xyz1234",
		"v" + strings.Repeat("1", version.MaxLen),
	} {
		_, err := version.Parse(in)
		require.ErrorIs(t, err, version.ErrNotVersion, "%q", in)
	}
}

func TestCheckEdge(t *testing.T) {
	t.Parallel()

	for _, tc := range []struct {
		name, controller, edge string
		want                   version.Skew
		refused                []string
	}{
		{name: "same release", controller: "v0.2.0", edge: "v0.2.0", want: version.SkewSame},
		{name: "patches do not count", controller: "v0.2.3", edge: "v0.2.0-4-gabc1234", want: version.SkewSame},
		{name: "one minor behind", controller: "v0.2.0", edge: "v0.1.7", want: version.SkewOneBehind},
		{name: "one minor behind a major's first", controller: "v1.1.0", edge: "v1.0.2", want: version.SkewOneBehind},
		{name: "dev controller", controller: "58fa1dc-dirty", edge: "v0.1.0", want: version.SkewUnchecked},
		{name: "dev edge", controller: "v0.2.0", edge: "dev", want: version.SkewUnchecked},
		{name: "hand-stamped controller", controller: "my-build", edge: "v0.1.0", want: version.SkewUnchecked},
		{
			name: "two minors behind", controller: "v0.3.0", edge: "v0.1.9",
			refused: []string{"edge v0.1.9 is too old for controller v0.3.0", "accepts edges of v0.3.x and v0.2.x", "upgrade the edge's appliance to v0.3.x"},
		},
		{
			name: "older major", controller: "v1.0.0", edge: "v0.9.0",
			refused: []string{"edge v0.9.0 is too old for controller v1.0.0", "accepts edges of v1.0.x:"},
		},
		{
			name: "newer minor", controller: "v0.2.0", edge: "v0.3.0",
			refused: []string{"edge v0.3.0 is newer than controller v0.2.0: upgrade the controller first"},
		},
		{
			name: "garbage", controller: "v0.2.0", edge: "v0.2.0;rm -rf /\x00",
			refused: []string{`the edge reports version "v0.2.0;rm -rf /\x00"`, `this controller is "v0.2.0"`},
		},
		{
			name: "long garbage is cut", controller: "v0.2.0", edge: strings.Repeat("x", 200),
			refused: []string{`"` + strings.Repeat("x", 64) + `"...`},
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()

			got, err := version.CheckEdge(tc.controller, tc.edge)
			if tc.refused == nil {
				require.NoError(t, err)
				require.Equal(t, tc.want, got)

				return
			}

			require.ErrorIs(t, err, version.ErrEdgeRefused)

			for _, want := range tc.refused {
				require.Contains(t, err.Error(), want)
			}

			require.Less(t, len(err.Error()), 400)
		})
	}
}

// FuzzParse: any string, however hostile, parses or is refused with ErrNotVersion, and a refusal of an edge
// never prints more than a bounded part of it.
func FuzzParse(f *testing.F) {
	for _, s := range []string{"v0.2.0", "v0.2.0-5-gabc1234-dirty", "dev-58fa1dc12345", "58fa1dc", "v0.0.0-20261203203640-58fa1dc12345+dirty", "v1.2.3+x.y"} {
		f.Add(s)
	}

	f.Fuzz(func(t *testing.T, s string) {
		r, err := version.Parse(s)
		if err != nil {
			if !errors.Is(err, version.ErrNotVersion) {
				t.Fatalf("Parse(%q): %v is not ErrNotVersion", s, err)
			}

			return
		}

		if r.Dev && (r.Major|r.Minor|r.Patch) != 0 {
			t.Fatalf("Parse(%q) = %+v: a dev build has no numbers", s, r)
		}

		if _, err := version.CheckEdge("v0.2.0", s); err != nil && len(err.Error()) > 400 {
			t.Fatalf("CheckEdge(%q): %d-byte error", s, len(err.Error()))
		}
	})
}
