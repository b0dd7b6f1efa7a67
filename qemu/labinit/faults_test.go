package main

import (
	"context"
	"testing"

	"github.com/stretchr/testify/require"
)

func TestParseFaults(t *testing.T) {
	t.Parallel()

	for name, tc := range map[string]struct {
		in      string
		want    map[string]int
		wantErr string
	}{
		"none":           {in: "", want: map[string]int{}},
		"counts":         {in: "wipe-error:2, kill-agent-in-wipe:1", want: map[string]int{faultWipeError: 2, faultKillAgentInWipe: 1}},
		"count defaults": {in: "wipe-hang", want: map[string]int{faultWipeHang: 1}},
		"unknown":        {in: "wipe-error:1,melt:1", wantErr: `unknown fault "melt"`},
		"bad count":      {in: "wipe-error:x", wantErr: "not 0..100"},
		"negative count": {in: "wipe-error:-1", wantErr: "not 0..100"},
		"listed twice":   {in: "wipe-error:1,wipe-error:2", wantErr: "listed twice"},
		"huge count":     {in: "wipe-error:101", wantErr: "not 0..100"},
		"trailing comma": {in: "wipe-error:1,", want: map[string]int{faultWipeError: 1}},
	} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()

			f, err := parseFaults(tc.in)
			if tc.wantErr != "" {
				require.ErrorContains(t, err, tc.wantErr)

				return
			}

			require.NoError(t, err)
			require.Equal(t, tc.want, f.counts)
		})
	}
}

// TestFaultsTakeTurns: each fault takes its count of wipe calls in the order listed, then calls pass.
func TestFaultsTakeTurns(t *testing.T) {
	t.Parallel()

	f, err := parseFaults("wipe-error:2,wipe-hang:1")
	require.NoError(t, err)

	before := f.beforeWipe(&agentProcess{})

	require.ErrorContains(t, before(t.Context(), 1), "busy")
	require.ErrorContains(t, before(t.Context(), 2), "busy")

	ctx, cancel := context.WithCancel(t.Context())
	cancel()
	require.ErrorContains(t, before(ctx, 3), "hung until context canceled")

	require.NoError(t, before(t.Context(), 4))
	require.Nil(t, f.agentArgs("10.77.1.1:50042"))
	require.NoError(t, before(t.Context(), 5))

	kill, err := parseFaults("kill-agent-in-wipe:1")
	require.NoError(t, err)
	require.ErrorContains(t, kill.beforeWipe(&agentProcess{})(t.Context(), 1), "no agent running")
}

func TestWrongProviderAddress(t *testing.T) {
	t.Parallel()

	f, err := parseFaults("wrong-provider-address,wipe-error:1")
	require.NoError(t, err)
	require.Equal(t, []string{"--provider-address", "10.77.1.1:1"}, f.agentArgs("10.77.1.1:50042"))
	require.ErrorContains(t, f.beforeWipe(&agentProcess{})(t.Context(), 1), "busy", "not a wipe fault: the wipe error takes call 1")
	require.NoError(t, f.beforeWipe(&agentProcess{})(t.Context(), 2))
}
