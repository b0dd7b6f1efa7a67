package testagent_test

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/outpost-metal/outpost/qemu/testagent"
)

func TestReadMachineID(t *testing.T) {
	t.Parallel()

	dir := t.TempDir()

	for _, tc := range []struct {
		name, content, want string
	}{
		{name: "qemu", content: "8A1F4C2E-5B6D-4E7F-9A0B-1C2D3E4F5A6B\n", want: "8a1f4c2e-5b6d-4e7f-9a0b-1c2d3e4f5a6b"},
		{name: "garbage", content: "Not Settable\n"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()

			path := filepath.Join(dir, tc.name)
			require.NoError(t, os.WriteFile(path, []byte(tc.content), 0o600))

			got, err := testagent.ReadMachineID(path)
			if tc.want == "" {
				require.Error(t, err)

				return
			}

			require.NoError(t, err)
			require.Equal(t, tc.want, got)
		})
	}

	_, err := testagent.ReadMachineID(filepath.Join(dir, "missing"))
	require.Error(t, err)
}
