package boot_test

import (
	"testing"

	"github.com/stretchr/testify/require"

	bootpb "github.com/outpost-metal/outpost/shared/api/boot"
)

func TestParseDiscovery(t *testing.T) {
	t.Parallel()

	for in, want := range map[string]bootpb.Discovery{
		"": bootpb.Discovery_DISCOVERY_UNSPECIFIED, "all": bootpb.Discovery_DISCOVERY_ALL,
		"known": bootpb.Discovery_DISCOVERY_KNOWN, "off": bootpb.Discovery_DISCOVERY_OFF,
	} {
		got, err := bootpb.ParseDiscovery(in)
		require.NoError(t, err)
		require.Equal(t, want, got)
	}

	_, err := bootpb.ParseDiscovery("Known")
	require.ErrorContains(t, err, `discovery "Known": want all, known or off`)
}
