package labels_test

import (
	"testing"

	"github.com/spf13/pflag"
	"github.com/stretchr/testify/require"

	"github.com/outpost-metal/outpost/controller/labels"
)

func TestParse(t *testing.T) {
	t.Parallel()

	for _, tc := range []struct {
		name  string
		pairs []string
		want  map[string]string
		err   string
	}{
		{name: "plain", pairs: []string{"rack=r7", "example.com/tier=gold", "empty="}, want: map[string]string{"rack": "r7", "example.com/tier": "gold", "empty": ""}},
		{name: "no equals", pairs: []string{"rack"}, err: "want key=value"},
		{name: "omni's prefix", pairs: []string{"omni.sidero.dev/cluster=x"}, err: "Omni's own"},
		{name: "site is the controller's", pairs: []string{"site=a"}, err: "set by the controller"},
		{name: "bad key", pairs: []string{"-rack=x"}, err: "label key"},
		{name: "bad value", pairs: []string{"rack=has space"}, err: "label value"},
		{name: "long value", pairs: []string{"rack=" + string(make([]byte, 64))}, err: "label value"},
		{name: "bad prefix", pairs: []string{"Example.com/tier=x"}, err: "DNS subdomain"},
		{name: "one bad refuses all", pairs: []string{"rack=r7", "bad key=x"}, err: "label key"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()

			got, err := labels.Parse(tc.pairs)
			if tc.err != "" {
				require.ErrorContains(t, err, tc.err)
				require.Nil(t, got)

				return
			}

			require.NoError(t, err)
			require.Equal(t, tc.want, got)
		})
	}
}

func TestMachineAndApply(t *testing.T) {
	t.Parallel()

	want := labels.Machine(map[string]string{"vendor": "Acme", "tier": "bmc", "site": "forged"},
		map[string]string{"tier": "gold", "rack": "default"}, map[string]string{"rack": "r7"}, "branch-7", "")
	require.Equal(t, map[string]string{"vendor": "Acme", "tier": "gold", "rack": "r7", "site": "branch-7"}, want,
		"operators' labels win over the inventory's, the site label over all")

	current := map[string]string{"omni.sidero.dev/infra-provider-id": "bare-metal", "old": "x", "rack": "r1", "tier": "gold"}
	got := map[string]string{}

	for k, v := range current {
		got[k] = v
	}

	labels.Apply(current, want, func(k, v string) { got[k] = v }, func(k string) { delete(got, k) })
	require.Equal(t, map[string]string{
		"omni.sidero.dev/infra-provider-id": "bare-metal", "rack": "r7", "tier": "gold", "site": "branch-7", "vendor": "Acme",
	}, got)
}

func FuzzParse(f *testing.F) {
	f.Add("rack=r7")
	f.Add("a/b/c=d")

	f.Fuzz(func(t *testing.T, pair string) {
		got, err := labels.Parse([]string{pair})
		if err != nil {
			return
		}

		for k, v := range got {
			require.NoError(t, labels.ValidateKey(k))
			require.NoError(t, labels.ValidateValue(v))
		}
	})
}

// The labels flag holds the parsed labels: the first use replaces the default, later uses add, and a bad pair
// is refused, changing nothing.
func TestFlag(t *testing.T) {
	t.Parallel()

	m := map[string]string{"default": "yes"}
	f := pflag.NewFlagSet("test", pflag.ContinueOnError)
	f.Var(labels.Flag(&m), "labels", "")

	require.Equal(t, "default=yes", f.Lookup("labels").DefValue)
	require.NoError(t, f.Parse([]string{"--labels", "rack=r1, row=2", "--labels", "zone=a"}))
	require.Equal(t, map[string]string{"rack": "r1", "row": "2", "zone": "a"}, m)
	require.Equal(t, "rack=r1,row=2,zone=a", f.Lookup("labels").Value.String())

	require.ErrorContains(t, f.Parse([]string{"--labels", "zone=b,site=x"}), "set by the controller")
	require.Equal(t, "a", m["zone"], "a refused value changes nothing")
	require.Error(t, f.Parse([]string{"--labels", "nopair"}))
}
