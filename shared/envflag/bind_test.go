package envflag_test

import (
	"strings"
	"testing"
	"time"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"
	"github.com/stretchr/testify/require"

	"github.com/outpost-metal/outpost/shared/envflag"
)

type settings struct {
	listen  string
	timeout time.Duration
	workers int
	verbose bool
	names   []string
}

func newSet(s *settings) *pflag.FlagSet {
	fs := pflag.NewFlagSet("test", pflag.ContinueOnError)
	fs.StringVar(&s.listen, "http-listen", ":80", "address")
	fs.DurationVar(&s.timeout, "wipe-timeout", time.Minute, "how long")
	fs.IntVar(&s.workers, "max-workers", 4, "how many")
	fs.BoolVar(&s.verbose, "verbose", false, "say more")
	fs.StringSliceVar(&s.names, "server-name", nil, "names")

	return fs
}

func lookupIn(vars map[string]string) func(string) (string, bool) {
	return func(k string) (string, bool) { v, ok := vars[k]; return v, ok }
}

func TestVarName(t *testing.T) {
	t.Parallel()

	require.Equal(t, "OUTPOST_WIPE_TIMEOUT", envflag.VarName("OUTPOST_", "wipe-timeout"))
	require.Equal(t, "OUTPOST_UPLINK_MAX_SOURCES", envflag.VarName("OUTPOST_", "uplink-max-sources"))
}

func TestBindApply(t *testing.T) {
	t.Parallel()

	for _, tc := range []struct {
		name string
		args []string
		env  map[string]string
		want settings
	}{
		{
			name: "defaults when nothing is set",
			want: settings{listen: ":80", timeout: time.Minute, workers: 4},
		},
		{
			name: "every type from its variable",
			env: map[string]string{
				"OUTPOST_HTTP_LISTEN": "127.0.0.1:8080", "OUTPOST_WIPE_TIMEOUT": "90s", "OUTPOST_MAX_WORKERS": "16",
				"OUTPOST_VERBOSE": "true", "OUTPOST_SERVER_NAME": "a.example,b.example",
			},
			want: settings{listen: "127.0.0.1:8080", timeout: 90 * time.Second, workers: 16, verbose: true, names: []string{"a.example", "b.example"}},
		},
		{
			name: "the command line wins",
			args: []string{"--wipe-timeout=5s", "--server-name=c.example"},
			env:  map[string]string{"OUTPOST_WIPE_TIMEOUT": "90s", "OUTPOST_SERVER_NAME": "a.example", "OUTPOST_MAX_WORKERS": "2"},
			want: settings{listen: ":80", timeout: 5 * time.Second, workers: 2, names: []string{"c.example"}},
		},
		{
			name: "an empty string is a value",
			env:  map[string]string{"OUTPOST_HTTP_LISTEN": ""},
			want: settings{listen: "", timeout: time.Minute, workers: 4},
		},
		{
			name: "an alias",
			env:  map[string]string{"LEGACY_NAMES": "d.example"},
			want: settings{listen: ":80", timeout: time.Minute, workers: 4, names: []string{"d.example"}},
		},
		{
			name: "the flag's name and an alias agreeing",
			env:  map[string]string{"LEGACY_NAMES": "d.example", "OUTPOST_SERVER_NAME": "d.example"},
			want: settings{listen: ":80", timeout: time.Minute, workers: 4, names: []string{"d.example"}},
		},
		{
			name: "prefixed names only",
			env:  map[string]string{"HTTP_LISTEN": ":1", "WIPE_TIMEOUT": "1s"},
			want: settings{listen: ":80", timeout: time.Minute, workers: 4},
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()

			var got settings

			fs := newSet(&got)
			b := envflag.Bind("OUTPOST_", map[string][]string{"server-name": {"LEGACY_NAMES"}}, fs)

			require.NoError(t, fs.Parse(tc.args))
			require.NoError(t, b.Apply(lookupIn(tc.env)))
			require.Equal(t, tc.want, got)
		})
	}
}

func TestApplyErrors(t *testing.T) {
	t.Parallel()

	var got settings

	fs := newSet(&got)
	b := envflag.Bind("OUTPOST_", map[string][]string{"server-name": {"LEGACY_NAMES"}}, fs)
	require.NoError(t, fs.Parse(nil))

	err := b.Apply(lookupIn(map[string]string{
		"OUTPOST_WIPE_TIMEOUT": "soon",
		"OUTPOST_MAX_WORKERS":  "many",
		"OUTPOST_VERBOSE":      "perhaps",
		"OUTPOST_SERVER_NAME":  "a.example",
		"LEGACY_NAMES":         "b.example",
		"OUTPOST_HTTP_LISTEN":  ":8080",
	}))
	require.ErrorContains(t, err, `environment variable OUTPOST_WIPE_TIMEOUT="soon" is not a valid duration for --wipe-timeout`)
	require.ErrorContains(t, err, `environment variable OUTPOST_MAX_WORKERS="many" is not a valid int for --max-workers`)
	require.ErrorContains(t, err, `environment variable OUTPOST_VERBOSE="perhaps" is not a valid bool for --verbose`)
	require.ErrorContains(t, err, "environment variables OUTPOST_SERVER_NAME and LEGACY_NAMES both set --server-name, to different values")

	require.Equal(t, ":8080", got.listen, "a good variable still applies beside bad ones")
}

func TestApplyQuotesLongValuesShort(t *testing.T) {
	t.Parallel()

	var got settings

	fs := newSet(&got)
	b := envflag.Bind("OUTPOST_", nil, fs)
	require.NoError(t, fs.Parse(nil))

	err := b.Apply(lookupIn(map[string]string{"OUTPOST_MAX_WORKERS": strings.Repeat("9x", 1000)}))
	require.Error(t, err)
	require.Less(t, len(err.Error()), 1000+200, "the error quotes a bounded part of the value")
}

func TestBindUsageAndVars(t *testing.T) {
	t.Parallel()

	var got settings

	fs := newSet(&got)
	b := envflag.Bind("OUTPOST_", map[string][]string{"server-name": {"LEGACY_NAMES"}}, fs, fs)

	require.Equal(t, "how long [OUTPOST_WIPE_TIMEOUT]", fs.Lookup("wipe-timeout").Usage, "bound once though passed twice")
	require.Equal(t, "names [OUTPOST_SERVER_NAME, LEGACY_NAMES]", fs.Lookup("server-name").Usage)
	require.Equal(t, []string{"OUTPOST_SERVER_NAME", "LEGACY_NAMES"}, b.Vars()["server-name"])
	require.Len(t, b.Vars(), 5)
}

func TestBindUnknownAliasPanics(t *testing.T) {
	t.Parallel()

	var got settings

	require.PanicsWithValue(t, "envflag: alias for unknown flag --no-such-flag", func() {
		envflag.Bind("OUTPOST_", map[string][]string{"no-such-flag": {"X"}}, newSet(&got))
	})
}

// TestBindCobraSubcommand shows the intended use with cobra: a persistent flag of the root reaches a
// subcommand from its variable, and a subcommand's own flag is bound too.
func TestBindCobraSubcommand(t *testing.T) {
	t.Parallel()

	var (
		stateDir string
		ttl      time.Duration
		ran      bool
		b        *envflag.Binding
	)

	env := lookupIn(map[string]string{"OUTPOST_STATE_DIR": "/var/lib/x", "OUTPOST_TOKEN_TTL": "2h"})

	root := &cobra.Command{
		Use:               "root",
		PersistentPreRunE: func(*cobra.Command, []string) error { return b.Apply(env) },
		RunE:              func(*cobra.Command, []string) error { return nil },
	}
	root.PersistentFlags().StringVar(&stateDir, "state-dir", "/tmp", "state")

	sub := &cobra.Command{Use: "sub", RunE: func(*cobra.Command, []string) error { ran = true; return nil }}
	sub.Flags().DurationVar(&ttl, "token-ttl", time.Hour, "ttl")
	root.AddCommand(sub)

	b = envflag.Bind("OUTPOST_", nil, root.PersistentFlags(), root.Flags(), sub.Flags())

	root.SetArgs([]string{"sub"})
	require.NoError(t, root.Execute())
	require.True(t, ran)
	require.Equal(t, "/var/lib/x", stateDir)
	require.Equal(t, 2*time.Hour, ttl)
}

// FuzzApply feeds any value to every flag type: Apply returns an error or a value, never panics.
func FuzzApply(f *testing.F) {
	for _, seed := range []string{"", "90s", "-1", "true", "a,b", `"a`, "9999999999999999999999"} {
		f.Add(seed)
	}

	f.Fuzz(func(t *testing.T, v string) {
		var got settings

		fs := newSet(&got)
		b := envflag.Bind("OUTPOST_", nil, fs)
		require.NoError(t, fs.Parse(nil))

		err := b.Apply(func(string) (string, bool) { return v, true })
		if err == nil {
			require.Equal(t, v, got.listen)
		}
	})
}
