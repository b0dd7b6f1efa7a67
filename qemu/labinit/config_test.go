package main

import (
	"testing"

	"github.com/stretchr/testify/require"
)

func TestSiderolinkAPI(t *testing.T) {
	t.Parallel()

	for _, tc := range []struct {
		name, config, want string
		wantErr            bool
	}{
		{name: "join config", config: "apiVersion: v1alpha1\nkind: SideroLinkConfig\napiUrl: grpc://10.99.0.1:8099?jointoken=abc\n---\nkind: EventSinkConfig\n", want: "grpc://10.99.0.1:8099?jointoken=abc"},
		{name: "quoted", config: "apiUrl: \"https://omni.example:8090?jointoken=x\"\n", want: "https://omni.example:8090?jointoken=x"},
		{name: "no siderolink document", config: "kind: EventSinkConfig\n", wantErr: true},
		{name: "bad url", config: "apiUrl: ://\n", wantErr: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()

			u, err := siderolinkAPI([]byte(tc.config))
			if tc.wantErr {
				require.Error(t, err)

				return
			}

			require.NoError(t, err)
			require.Equal(t, tc.want, u.String())
		})
	}
}

// FuzzSiderolinkAPI feeds arbitrary machine configs (they come from the network) to the parser.
func FuzzSiderolinkAPI(f *testing.F) {
	f.Add([]byte("apiUrl: grpc://10.99.0.1:8099?jointoken=abc\n"))
	f.Add([]byte("kind: SideroLinkConfig\n  apiUrl: \"\"\n"))

	f.Fuzz(func(t *testing.T, b []byte) {
		u, err := siderolinkAPI(b)
		if err == nil && u == nil {
			t.Fatal("nil url without error")
		}
	})
}

func TestParseCmdline(t *testing.T) {
	t.Parallel()

	args := parseCmdline("console=ttyS0 metal.provider.address=10.77.1.2:50042 talos.config=http://10.77.1.2/config?u=${uuid} quiet\n")
	require.Equal(t, "10.77.1.2:50042", args["metal.provider.address"])
	require.Equal(t, "http://10.77.1.2/config?u=${uuid}", args["talos.config"])
	require.Contains(t, args, "quiet")
}
