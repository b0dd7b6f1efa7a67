package main

import (
	"strings"
	"testing"

	"github.com/spf13/pflag"
	"github.com/stretchr/testify/require"

	"github.com/outpost-metal/outpost/shared/envflag"
)

// Every flag of every command has its OUTPOST_* variable, shown in --help, and the variables the README and
// earlier releases document keep their names.
func TestEveryFlagHasItsVariable(t *testing.T) {
	t.Parallel()

	root, env := rootCommand(func(string) (string, bool) { return "", false })
	vars := env.Vars()

	for _, c := range append(root.Commands(), root) {
		c.Flags().VisitAll(func(f *pflag.Flag) {
			if f.Name == "help" || f.Name == "version" {
				return
			}

			want := envflag.VarName("OUTPOST_", f.Name)
			require.Contains(t, vars[f.Name], want, "--%s", f.Name)
			require.True(t, strings.HasSuffix(f.Usage, "["+want+"]"), "--%s usage %q", f.Name, f.Usage)
		})
	}

	for _, v := range []string{
		"OUTPOST_STATE_DIR", "OUTPOST_LOG_LEVEL", "OUTPOST_CONTROLLER", "OUTPOST_JOIN_TOKEN", "OUTPOST_JOIN_TOKEN_FILE",
		"OUTPOST_RECONNECT_MIN", "OUTPOST_RECONNECT_MAX", "OUTPOST_INTERFACE", "OUTPOST_AGENT_BINDING", "OUTPOST_DISCOVERY",
		"OUTPOST_PROXYDHCP_MODE", "OUTPOST_SERVER_IP", "OUTPOST_HTTP_LISTEN", "OUTPOST_ADVERTISE_HOST", "OUTPOST_AGENT_ADDRESS",
		"OUTPOST_TFTP_LISTEN", "OUTPOST_API_LISTEN", "OUTPOST_IPXE_DIR", "OUTPOST_ASSETS_PRESEED_DIR",
		"OUTPOST_TFTP_MAX_TRANSFERS", "OUTPOST_TFTP_MAX_PER_SOURCE", "OUTPOST_HTTP_MAX_CONNS", "OUTPOST_HTTP_MAX_CONNS_PER_SOURCE",
		"OUTPOST_AGENT_MAX_TUNNELS", "OUTPOST_AGENT_MAX_TUNNELS_PER_SOURCE", "OUTPOST_AGENT_MAX_CONNS",
	} {
		found := false

		for _, names := range vars {
			found = found || names[0] == v
		}

		require.True(t, found, "%s is bound to no flag", v)
	}
}

// A variable applies to a flag the command line left alone; the command line wins; one that does not parse
// is an error naming it.
func TestVariablesApply(t *testing.T) {
	t.Parallel()

	env := map[string]string{"OUTPOST_TFTP_MAX_TRANSFERS": "7", "OUTPOST_HTTP_LISTEN": ":8080", "OUTPOST_KERNEL_ARGS": "console=ttyS0,quiet"}
	root, bind := rootCommand(func(k string) (string, bool) { v, ok := env[k]; return v, ok })

	require.NoError(t, root.ParseFlags([]string{"--http-listen", ":9090"}))
	require.NoError(t, bind.Apply(func(k string) (string, bool) { v, ok := env[k]; return v, ok }))

	f := root.Flags()
	require.Equal(t, "7", f.Lookup("tftp-max-transfers").Value.String())
	require.Equal(t, ":9090", f.Lookup("http-listen").Value.String())
	require.Equal(t, "[console=ttyS0,quiet]", f.Lookup("kernel-args").Value.String())

	root, bind = rootCommand(nil)
	require.NoError(t, root.ParseFlags(nil))
	require.ErrorContains(t, bind.Apply(func(k string) (string, bool) {
		return "many", k == "OUTPOST_HTTP_MAX_CONNS"
	}), "OUTPOST_HTTP_MAX_CONNS")
}
