package status_test

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.uber.org/zap/zaptest"
	"google.golang.org/grpc/codes"
	grpcstatus "google.golang.org/grpc/status"

	"github.com/outpost-metal/outpost/controller/machines"
	"github.com/outpost-metal/outpost/controller/status"
	"github.com/outpost-metal/outpost/controller/timeline"
	adminpb "github.com/outpost-metal/outpost/shared/api/admin"
	bootpb "github.com/outpost-metal/outpost/shared/api/boot"
)

// role is a controller that acts or stands by as the test says, the lease held by "ctrl-b".
type role struct{ acting atomic.Bool }

func (r *role) ActingElsewhere(context.Context) (string, string, bool) {
	if r.acting.Load() {
		return "", "", false
	}

	return "ctrl-b", "10.0.0.2:8443", true
}

func TestSetBootMode(t *testing.T) {
	t.Parallel()

	const id = "4c4c4544-0042-3510-8052-b4c04f384833"

	locs := machines.NewLocations(zaptest.NewLogger(t))
	_, err := locs.Seen("site-a", id)
	require.NoError(t, err)
	locs.SetFirmware(id, "bios", "dhcp")

	r := &role{}
	api := status.NewAPI(timeline.New(timeline.DefaultConfig(), time.Now), status.WithLocations(locs), status.WithRole(r))

	set := func(machine, fw string) (*adminpb.SetBootModeResponse, codes.Code, string) {
		resp, err := api.SetBootMode(t.Context(), &adminpb.SetBootModeRequest{MachineId: machine, Firmware: fw})

		return resp, grpcstatus.Code(err), grpcstatus.Convert(err).Message()
	}

	// A standby refuses and names the acting controller; nothing changes.
	_, code, msg := set(id, "uefi")
	require.Equal(t, codes.FailedPrecondition, code)
	require.Contains(t, msg, "ctrl-b (uplink 10.0.0.2:8443)")
	require.Equal(t, "bios", must(locs.Locate(id)).Firmware)

	r.acting.Store(true)

	resp, code, _ := set(id, "UEFI")
	require.Equal(t, codes.OK, code)
	require.Equal(t, "uefi", resp.GetFirmware())
	require.Equal(t, "operator", resp.GetSource())
	require.Equal(t, "uefi", must(locs.Locate(id)).Firmware)

	_, code, msg = set(id, "efi")
	require.Equal(t, codes.InvalidArgument, code)
	require.Contains(t, msg, `"bios", "uefi" or "auto"`)

	resp, code, _ = set(id, "Auto")
	require.Equal(t, codes.OK, code)
	require.Equal(t, []string{"uefi", ""}, []string{resp.GetFirmware(), resp.GetSource()}, "handed back: kept until the machine reports")

	_, code, msg = set("4c4c4544-0042-3510-8052-b4c04f384899", "bios")
	require.Equal(t, codes.NotFound, code)
	require.Contains(t, msg, "never seen at a site")

	// clearing an alert: refused on a standby; on the acting one it says what was cleared
	locs.Raise(id, machines.AlertTunnelContested, "test")

	r.acting.Store(false)
	_, err = api.ClearAlert(t.Context(), &adminpb.ClearAlertRequest{MachineId: id})
	require.Equal(t, codes.FailedPrecondition, grpcstatus.Code(err))
	require.Equal(t, machines.AlertTunnelContested, must(locs.Locate(id)).Alert)

	r.acting.Store(true)
	resp2, err := api.ClearAlert(t.Context(), &adminpb.ClearAlertRequest{MachineId: id})
	require.NoError(t, err)
	require.Equal(t, machines.AlertTunnelContested, resp2.GetCleared())
	require.Empty(t, must(locs.Locate(id)).Alert)
}

func must[T any](v T, ok bool) T {
	if !ok {
		panic("not found")
	}

	return v
}

// sitesSay is a site setting for Secure Boot, as SitePolicies gives it.
type sitesSay map[string]bootpb.SecureBoot

func (s sitesSay) SecureBoot(site string) bootpb.SecureBoot { return s[site] }

// An operator's word on a machine's Secure Boot is taken on the acting controller, answered with what the
// machine's plans say now and who said it; bad words and unknown machines are refused by name.
func TestSetSecureBoot(t *testing.T) {
	t.Parallel()

	const id = "4c4c4544-0042-3510-8052-b4c04f384833"

	locs := machines.NewLocations(zaptest.NewLogger(t))
	_, err := locs.Seen("site-a", id)
	require.NoError(t, err)
	locs.SetSecureBoot(id, bootpb.SecureBoot_SECURE_BOOT_ON)

	sites := sitesSay{}
	r := &role{}
	book := timeline.New(timeline.DefaultConfig(), time.Now)
	book.Record(id, "boot", "seen", false)
	api := status.NewAPI(book, status.WithLocations(locs), status.WithRole(r), status.WithSitePolicies(sites))

	// machine show says it, and who said it
	shown := func() []string {
		resp, err := api.ShowMachine(t.Context(), &adminpb.ShowMachineRequest{MachineId: id})
		require.NoError(t, err)

		return []string{resp.GetMachine().GetSecureBoot(), resp.GetMachine().GetSecureBootSource()}
	}

	require.Equal(t, []string{"on", "bmc"}, shown())

	set := func(machine, sb string) (*adminpb.SetSecureBootResponse, codes.Code, string) {
		resp, err := api.SetSecureBoot(t.Context(), &adminpb.SetSecureBootRequest{MachineId: machine, SecureBoot: sb})

		return resp, grpcstatus.Code(err), grpcstatus.Convert(err).Message()
	}

	_, code, msg := set(id, "off")
	require.Equal(t, codes.FailedPrecondition, code, "a standby refuses")
	require.Contains(t, msg, "ctrl-b")

	r.acting.Store(true)

	resp, code, _ := set(id, "OFF")
	require.Equal(t, codes.OK, code)
	require.Equal(t, []string{"off", "operator"}, []string{resp.GetSecureBoot(), resp.GetSource()})
	require.Equal(t, bootpb.SecureBoot_SECURE_BOOT_OFF, must(locs.Locate(id)).SecureBootOverride)

	resp, code, _ = set(id, "auto")
	require.Equal(t, codes.OK, code)
	require.Equal(t, []string{"on", "bmc"}, []string{resp.GetSecureBoot(), resp.GetSource()}, "handed back to the BMC's answer")

	sites["site-a"] = bootpb.SecureBoot_SECURE_BOOT_OFF
	resp, code, _ = set(id, "auto")
	require.Equal(t, codes.OK, code)
	require.Equal(t, []string{"off", "site"}, []string{resp.GetSecureBoot(), resp.GetSource()}, "the site's setting over the BMC's")
	require.Equal(t, []string{"off", "site"}, shown())

	delete(sites, "site-a")
	locs.SetSecureBoot(id, bootpb.SecureBoot_SECURE_BOOT_UNSPECIFIED)
	require.Equal(t, []string{"", ""}, shown(), "nobody says: nothing shown")

	for _, bad := range []string{"", "yes"} {
		_, code, msg = set(id, bad)
		require.Equal(t, codes.InvalidArgument, code, bad)
		require.Contains(t, msg, `"on", "off" or "auto"`)
	}

	_, code, msg = set("4c4c4544-0042-3510-8052-b4c04f384899", "on")
	require.Equal(t, codes.NotFound, code)
	require.Contains(t, msg, "never seen at a site")
}
