package omni_test

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/outpost-metal/outpost/controller/omni"
)

const resolverDoc = `apiVersion: v1alpha1
kind: ResolverConfig
nameservers:
  - address: 10.0.0.53
`

func TestParseExtraDocuments(t *testing.T) {
	d, err := omni.ParseExtraDocuments([]byte(resolverDoc + "---\napiVersion: v1alpha1\nkind: TrustedRootsConfig\nname: site-mirror\ncertificates: |\n  -----BEGIN CERTIFICATE-----\n  MIIB\n  -----END CERTIFICATE-----\n"))
	require.NoError(t, err)
	require.Equal(t, []string{"ResolverConfig", "TrustedRootsConfig/site-mirror"}, d.Kinds())
	require.False(t, d.Empty())

	for name, tc := range map[string]struct{ doc, err string }{
		"empty":              {"  \n", "no documents"},
		"not yaml":           {"{{{", "load"},
		"unknown kind":       {"apiVersion: v1alpha1\nkind: NoSuchConfig\n", "load"},
		"machine config":     {"version: v1alpha1\nmachine:\n  type: worker\n", "v1alpha1 machine configuration cannot be added"},
		"omni's siderolink":  {"apiVersion: v1alpha1\nkind: SideroLinkConfig\napiUrl: https://omni.invalid:8090\n", "Omni's join config has this document"},
		"omni's event sink":  {"apiVersion: v1alpha1\nkind: EventSinkConfig\nendpoint: '[fdae::1]:8090'\n", "Omni's join config has this document"},
		"two resolvers":      {resolverDoc + "---\n" + resolverDoc, "duplicate document"},
		"invalid nameserver": {"apiVersion: v1alpha1\nkind: ResolverConfig\nnameservers:\n  - address: not-an-address\n", ""},
		"too big":            {resolverDoc + "# " + strings.Repeat("x", omni.MaxExtraDocumentsSize) + "\n", "more than"},
	} {
		_, err := omni.ParseExtraDocuments([]byte(tc.doc))
		require.Error(t, err, name)
		require.ErrorContains(t, err, tc.err, name)
	}
}

func TestLoadExtraDocuments(t *testing.T) {
	path := filepath.Join(t.TempDir(), "extra.yaml")
	require.NoError(t, os.WriteFile(path, []byte(resolverDoc), 0o600))

	d, err := omni.LoadExtraDocuments(path)
	require.NoError(t, err)
	require.Equal(t, []string{"ResolverConfig"}, d.Kinds())

	_, err = omni.LoadExtraDocuments(filepath.Join(t.TempDir(), "missing.yaml"))
	require.ErrorContains(t, err, "no such file")

	require.NoError(t, os.WriteFile(path, []byte("version: v1alpha1\n"), 0o600))
	_, err = omni.LoadExtraDocuments(path)
	require.ErrorContains(t, err, path, "the error names the file")
}

func FuzzParseExtraDocuments(f *testing.F) {
	f.Add([]byte(resolverDoc))
	f.Add([]byte("version: v1alpha1\n"))
	f.Add([]byte("apiVersion: v1alpha1\nkind: SideroLinkConfig\n---\n"))

	f.Fuzz(func(t *testing.T, data []byte) {
		d, err := omni.ParseExtraDocuments(data)
		if err != nil {
			return
		}

		// What was accepted parses again to the same documents.
		again, err := omni.ParseExtraDocuments([]byte(omni.ExtraText(d)))
		require.NoError(t, err)
		require.Equal(t, d.Kinds(), again.Kinds())
	})
}

func TestExtraDocumentsJoinOmnis(t *testing.T) {
	join := "apiVersion: v1alpha1\nkind: SideroLinkConfig\napiUrl: https://omni.invalid:8090?jointoken=x\n---\n" +
		"apiVersion: v1alpha1\nkind: TrustedRootsConfig\nname: outpost-ca\ncertificates: |\n  -----BEGIN CERTIFICATE-----\n  MIIB\n  -----END CERTIFICATE-----\n"

	d, err := omni.ParseExtraDocuments([]byte(resolverDoc))
	require.NoError(t, err)

	merged, err := omni.AppendExtra(d, join)
	require.NoError(t, err)
	require.True(t, strings.HasPrefix(merged, strings.TrimSpace(join)), "Omni's documents come first, as sent")
	require.Contains(t, merged, "kind: ResolverConfig")

	// The controller's own trusted roots cannot be replaced by an extra document of the same name.
	clash, err := omni.ParseExtraDocuments([]byte("apiVersion: v1alpha1\nkind: TrustedRootsConfig\nname: outpost-ca\ncertificates: |\n  -----BEGIN CERTIFICATE-----\n  MIIC\n  -----END CERTIFICATE-----\n"))
	require.NoError(t, err)

	_, err = omni.AppendExtra(clash, join)
	require.ErrorContains(t, err, "do not fit with Omni's join config")

	var none omni.ExtraDocuments

	same, err := omni.AppendExtra(none, join)
	require.NoError(t, err)
	require.Equal(t, join, same)
}
