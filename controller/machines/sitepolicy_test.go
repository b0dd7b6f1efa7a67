package machines_test

import (
	"testing"

	"github.com/siderolabs/gen/optional"
	"github.com/stretchr/testify/require"

	"github.com/outpost-metal/outpost/controller/machines"
	bmcpb "github.com/outpost-metal/outpost/shared/api/bmc"
	bootpb "github.com/outpost-metal/outpost/shared/api/boot"
)

// A site's labels are kept in memory with its policy (the observation reads them for every machine at every
// poll): a copy of what was set, replaced as a whole, gone when cleared.
func TestSitePoliciesKeepLabels(t *testing.T) {
	t.Parallel()

	p := machines.NewSitePolicies()
	set := map[string]string{"rack": "r7"}
	p.SetLabels("site-a", set)
	set["rack"] = "changed by the caller"

	require.Equal(t, map[string]string{"rack": "r7"}, p.SiteLabels("site-a"))
	require.Nil(t, p.SiteLabels("site-b"))

	p.SetLabels("site-a", map[string]string{"row": "3"})
	require.Equal(t, map[string]string{"row": "3"}, p.SiteLabels("site-a"), "replaced as a whole")

	p.SetLabels("site-a", nil)
	require.Nil(t, p.SiteLabels("site-a"))

	var none *machines.SitePolicies
	require.Nil(t, none.SiteLabels("site-a"))
}

// An operator's site settings are parsed once, into the typed policy; "" leaves a setting to the controller,
// anything else unknown is refused with what is wanted.
func TestParseSitePolicy(t *testing.T) {
	t.Parallel()

	for _, tc := range []struct {
		name, proto, wipe, sb string
		want                  machines.SitePolicy
		wantErr               string
	}{
		{name: "secure boot on", sb: "on", want: machines.SitePolicy{SecureBoot: bootpb.SecureBoot_SECURE_BOOT_ON}},
		{name: "secure boot off", sb: "off", want: machines.SitePolicy{SecureBoot: bootpb.SecureBoot_SECURE_BOOT_OFF}},
		{name: "secure boot auto is no setting", sb: "auto", want: machines.SitePolicy{}},
		{name: "unknown secure boot", sb: "maybe", wantErr: `secure boot must be "on", "off" or "auto": "maybe"`},
		{name: "nothing set", want: machines.SitePolicy{}},
		{name: "auto is a setting of its own", proto: "auto", want: machines.SitePolicy{BMCProtocol: optional.Some(bmcpb.Protocol_PROTOCOL_AUTO)}},
		{
			name: "redfish and zeroes", proto: "redfish", wipe: "zeroes",
			want: machines.SitePolicy{BMCProtocol: optional.Some(bmcpb.Protocol_PROTOCOL_REDFISH), WipeMethod: machines.WipeZeroes},
		},
		{name: "unknown protocol", proto: "smoke", wantErr: `bmc protocol "smoke": want auto, ipmi or redfish`},
		{name: "unknown wipe", wipe: "shred", wantErr: `wipe method "shred": want fast or zeroes`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()

			got, err := machines.ParseSitePolicy(tc.proto, tc.wipe, tc.sb, false)
			if tc.wantErr != "" {
				require.EqualError(t, err, tc.wantErr)

				return
			}

			require.NoError(t, err)
			require.Equal(t, tc.want, got)
		})
	}
}

// The flag values take the settings' words and nothing else.
func TestSettingFlags(t *testing.T) {
	t.Parallel()

	var proto bmcpb.Protocol

	f := machines.BMCProtocolFlag(&proto)
	require.NoError(t, f.Set("ipmi"))
	require.Equal(t, bmcpb.Protocol_PROTOCOL_IPMI, proto)
	require.Equal(t, "ipmi", f.String())
	require.EqualError(t, f.Set("smoke"), `bmc protocol "smoke": want auto, ipmi or redfish`)
	require.Equal(t, bmcpb.Protocol_PROTOCOL_IPMI, proto, "a refused value changes nothing")

	wipe := machines.WipeFast
	w := machines.WipeMethodFlag(&wipe)
	require.NoError(t, w.Set("zeroes"))
	require.Equal(t, machines.WipeZeroes, wipe)
	require.Equal(t, "zeroes", w.String())
	require.EqualError(t, w.Set("shred"), `wipe method "shred": want fast or zeroes`)
	require.Equal(t, machines.WipeZeroes, wipe)
	require.Equal(t, "method", w.Type())
}
