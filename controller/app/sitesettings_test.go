package app_test

import (
	"bytes"
	"context"
	"io"
	"os"
	"path/filepath"
	"regexp"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.uber.org/zap/zaptest"

	"github.com/outpost-metal/outpost/controller/admincli"
	"github.com/outpost-metal/outpost/controller/app"
)

// A site's own settings through the admin socket: every value checked before any is stored (a bad one
// leaves all as they were, with the reason), "default" hands one back, and registered MACs go in all
// together or not at all.
func TestSiteSettingsThroughTheAdminSocket(t *testing.T) {
	cfg := testConfig(t)

	c, err := app.Build(t.Context(), cfg, zaptest.NewLogger(t))
	require.NoError(t, err)

	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan error, 1)

	go func() { done <- c.Run(ctx) }()

	t.Cleanup(func() {
		cancel()
		require.NoError(t, <-done)
	})

	var admin *admincli.Client

	require.Eventually(t, func() bool {
		admin, err = admincli.Dial(cfg.AdminSocketPath())
		if err != nil {
			return false
		}

		if err = admin.ListSites(ctx, io.Discard, time.Now()); err != nil {
			admin.Close() //nolint:errcheck

			return false
		}

		return true
	}, 10*time.Second, 20*time.Millisecond, "admin socket: %v", err)

	t.Cleanup(func() { admin.Close() }) //nolint:errcheck

	require.NoError(t, admin.CreateSite(ctx, "branch-1", "", admincli.TokenOptions{TTL: time.Hour}, io.Discard, io.Discard))

	str := func(s string) *string { return &s }
	// field is one "name: value" row of site show.
	field := func(text, name string) string {
		m := regexp.MustCompile(`(?m)^` + name + `:\s+(.*)$`).FindStringSubmatch(text)
		require.NotNil(t, m, "no %q in %q", name, text)

		return m[1]
	}
	show := func(name string) string {
		var out bytes.Buffer
		require.NoError(t, admin.ShowSite(ctx, "branch-1", &out, time.Now()))

		return field(out.String(), name)
	}

	require.Equal(t, "default", show("discovery"))

	var out bytes.Buffer
	require.NoError(t, admin.SetSiteSettings(ctx, "branch-1", admincli.SiteSettings{
		Discovery: str("known"), BMCProtocol: str("redfish"), WipeMethod: str("zeroes"),
	}, &out))
	require.Equal(t, "zeroes", field(out.String(), "wipe method"))

	// One bad value among good ones: nothing changes, and the error names it.
	err = admin.SetSiteSettings(ctx, "branch-1", admincli.SiteSettings{Discovery: str("all"), WipeMethod: str("shred")}, io.Discard)
	require.ErrorContains(t, err, `wipe method "shred": want fast or zeroes`)
	require.Equal(t, "known", show("discovery"))

	err = admin.SetSiteSettings(ctx, "branch-1", admincli.SiteSettings{BMCProtocol: str("smoke")}, io.Discard)
	require.ErrorContains(t, err, `bmc protocol "smoke"`)

	// Secure Boot: the machines' BMCs say until the site says; a word other than on, off or auto is refused.
	require.Equal(t, "each machine's BMC says", show("secure boot"))
	require.NoError(t, admin.SetSiteSettings(ctx, "branch-1", admincli.SiteSettings{SecureBoot: str("on")}, io.Discard))
	require.Equal(t, "on", show("secure boot"))

	err = admin.SetSiteSettings(ctx, "branch-1", admincli.SiteSettings{SecureBoot: str("maybe")}, io.Discard)
	require.ErrorContains(t, err, `secure boot must be "on", "off" or "auto": "maybe"`)
	require.Equal(t, "on", show("secure boot"))

	require.NoError(t, admin.SetSiteSettings(ctx, "branch-1", admincli.SiteSettings{SecureBoot: str("")}, io.Discard))
	require.Equal(t, "each machine's BMC says", show("secure boot"))

	// Documents machinery refuses, or that Omni's join config has already, are refused with the reason.
	dir := t.TempDir()
	write := func(name, text string) string {
		p := filepath.Join(dir, name)
		require.NoError(t, os.WriteFile(p, []byte(text), 0o600))

		return p
	}

	err = admin.SetSiteSettings(ctx, "branch-1", admincli.SiteSettings{ExtraConfigFile: str(write("bad.yaml", "apiVersion: v1alpha1\nkind: Nonsense\n"))}, io.Discard)
	require.ErrorContains(t, err, "extra machine-config documents")

	err = admin.SetSiteSettings(ctx, "branch-1", admincli.SiteSettings{ExtraConfigFile: str(write("link.yaml",
		"apiVersion: v1alpha1\nkind: SideroLinkConfig\napiUrl: https://omni.example:8090?jointoken=x\n"))}, io.Discard)
	require.ErrorContains(t, err, "Omni's join config has this document already")

	resolvers := write("resolvers.yaml", "apiVersion: v1alpha1\nkind: ResolverConfig\nnameservers:\n  - address: 10.0.0.53\n")
	require.NoError(t, admin.SetSiteSettings(ctx, "branch-1", admincli.SiteSettings{ExtraConfigFile: str(resolvers)}, io.Discard))
	require.Contains(t, show("extra machine config"), "of the site's own")

	require.NoError(t, admin.SetSiteSettings(ctx, "branch-1", admincli.SiteSettings{Discovery: str(""), ExtraConfigFile: str("")}, io.Discard))
	require.Equal(t, "default", show("discovery"))
	require.Equal(t, "default", show("extra machine config"))
	require.Equal(t, "zeroes", show("wipe method"), "the flags not given stay")

	// Registered MACs: a malformed one refuses the whole call.
	err = admin.RegisterMachines(ctx, "branch-1", []string{"52:54:00:00:00:01", "52:54:00:00:00"}, false, "", io.Discard)
	require.ErrorContains(t, err, `"52:54:00:00:00" is not a MAC address`)
	require.Equal(t, "0", show("registered machines"))

	out.Reset()
	require.NoError(t, admin.RegisterMachines(ctx, "branch-1", []string{"52-54-00-00-00-01", "52:54:00:00:00:02", "52:54:00:00:00:01"}, false, "", &out))
	require.Equal(t, "site branch-1: 2 registered machines\n", out.String())

	out.Reset()
	require.NoError(t, admin.RegisterMachines(ctx, "branch-1", []string{"52:54:00:00:00:01"}, true, "", &out))
	require.Equal(t, "site branch-1: 1 registered machines\n", out.String())

	err = admin.RegisterMachines(ctx, "nowhere", []string{"52:54:00:00:00:01"}, false, "", io.Discard)
	require.ErrorContains(t, err, "unknown site")

	// The DHCP service: checked as a whole when set (pool in one subnet, gateway in it), reservations inside the
	// subnet and never one address for two MACs.
	list := func(v ...string) *[]string { return &v }
	hour := time.Hour

	err = admin.SetSiteSettings(ctx, "branch-1", admincli.SiteSettings{DHCPMode: str("full")}, io.Discard)
	require.ErrorContains(t, err, "full dhcp mode needs a pool")

	err = admin.SetSiteSettings(ctx, "branch-1", admincli.SiteSettings{DHCPMode: str("full"), DHCPPool: str("10.9.0.100-10.9.1.20"), DHCPSubnet: str("10.9.0.0/24")}, io.Discard)
	require.ErrorContains(t, err, "dhcp pool end 10.9.1.20 is not a host address of the subnet 10.9.0.0/24")

	err = admin.SetSiteSettings(ctx, "branch-1", admincli.SiteSettings{DHCPMode: str("full"), DHCPPool: str("10.9.0.0/24"), DHCPGateway: str("10.8.0.1")}, io.Discard)
	require.ErrorContains(t, err, "dhcp gateway 10.8.0.1 is not a host address of the subnet 10.9.0.0/24")
	require.Equal(t, "default", show("dhcp"), "nothing stored")

	out.Reset()
	require.NoError(t, admin.SetSiteSettings(ctx, "branch-1", admincli.SiteSettings{
		DHCPMode: str("full"), DHCPPool: str("10.9.0.100-10.9.0.199"), DHCPSubnet: str("10.9.0.7/24"), DHCPGateway: str("10.9.0.1"),
		DHCPDNS: list("10.9.0.53", "10.9.0.54"), DHCPNTP: list("10.9.0.123"), DHCPLeaseTime: &hour,
	}, &out))
	require.Equal(t, "full", field(out.String(), "dhcp"))
	require.Equal(t, "10.9.0.100-10.9.0.199 in 10.9.0.0/24", field(out.String(), "dhcp pool"))
	require.Equal(t, "1h0m0s", field(out.String(), "dhcp lease time"))

	err = admin.RegisterMachines(ctx, "branch-1", []string{"52:54:00:00:00:07"}, false, "10.9.1.7", io.Discard)
	require.ErrorContains(t, err, "dhcp reservation of 52:54:00:00:00:07 10.9.1.7 is not a host address of the subnet")
	require.NoError(t, admin.RegisterMachines(ctx, "branch-1", []string{"52:54:00:00:00:07"}, false, "10.9.0.7", io.Discard))

	err = admin.RegisterMachines(ctx, "branch-1", []string{"52:54:00:00:00:08"}, false, "10.9.0.7", io.Discard)
	require.ErrorContains(t, err, "10.9.0.7 is reserved for 52:54:00:00:00:07 and 52:54:00:00:00:08")

	err = admin.RegisterMachines(ctx, "branch-1", []string{"52:54:00:00:00:08", "52:54:00:00:00:09"}, false, "10.9.0.8", io.Discard)
	require.ErrorContains(t, err, "want one IPv4 address for one MAC added")
	require.Equal(t, "1", show("dhcp reservations"))

	require.NoError(t, admin.RegisterMachines(ctx, "branch-1", []string{"52:54:00:00:00:07"}, true, "", io.Discard))
	require.Equal(t, "0", show("dhcp reservations"), "removing the MAC drops its reservation")

	require.NoError(t, admin.SetSiteSettings(ctx, "branch-1", admincli.SiteSettings{DHCPMode: str("off")}, io.Discard))
	require.Equal(t, "off", show("dhcp"))
}
