package boot_test

import (
	"context"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/stretchr/testify/require"
	"go.uber.org/zap/zaptest"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	"github.com/outpost-metal/outpost/edge/boot"
	bootpb "github.com/outpost-metal/outpost/shared/api/boot"
	"github.com/outpost-metal/outpost/shared/metal"
)

const (
	uuidDisk    = "aaaaaaaa-0000-0000-0000-000000000001"
	uuidInstall = "aaaaaaaa-0000-0000-0000-000000000002"
)

func open(t *testing.T, dir string) *boot.Table {
	t.Helper()

	tbl, err := boot.Open(boot.Config{StateDir: dir}, zaptest.NewLogger(t))
	require.NoError(t, err)

	return tbl
}

func snapshot() *bootpb.ApplyRequest {
	return &bootpb.ApplyRequest{Change: &bootpb.ApplyRequest_Snapshot{Snapshot: &bootpb.Table{
		Version: 5,
		Plans: []*bootpb.Plan{
			{Uuid: "AAAAAAAA-0000-0000-0000-000000000001", Macs: []string{"52:54:00:00:00:01"}, Mode: bootpb.Mode_MODE_DISK, DiskMethod: bootpb.DiskMethod_DISK_METHOD_IPXE_SANBOOT, SnpOnly: true, SecureBoot: bootpb.SecureBoot_SECURE_BOOT_OFF},
			{Uuid: uuidInstall, SecureBoot: bootpb.SecureBoot_SECURE_BOOT_ON, Mode: bootpb.Mode_MODE_INSTALL, Install: &bootpb.Kernel{KernelUrl: "/assets/talos/vmlinuz"}, ExtraArgs: []string{"talos.platform=metal"}, Config: []byte("own")},
		},
		KernelArgs: []string{"console=ttyS0"},
		Config:     []byte("join-config"),
	}}}
}

func TestSnapshotPersistsAndReloads(t *testing.T) {
	t.Parallel()

	dir := t.TempDir()
	tbl := open(t, dir)
	require.Zero(t, tbl.Version())

	v, err := tbl.Apply(snapshot())
	require.NoError(t, err)
	require.EqualValues(t, 5, v)

	st, err := os.Stat(filepath.Join(dir, boot.FileName))
	require.NoError(t, err)
	require.Equal(t, os.FileMode(0o600), st.Mode().Perm())

	again := open(t, dir)
	require.EqualValues(t, 5, again.Version())

	e := again.Lookup(uuidDisk, nil, "x86_64")
	require.True(t, e.Known)
	require.Equal(t, bootpb.Mode_MODE_DISK, e.Mode)
	require.Equal(t, bootpb.DiskMethod_DISK_METHOD_IPXE_SANBOOT, e.DiskMethod)
}

func TestLookup(t *testing.T) {
	t.Parallel()

	tbl := open(t, t.TempDir())
	_, err := tbl.Apply(snapshot())
	require.NoError(t, err)

	mac1 := net.HardwareAddr{0x52, 0x54, 0, 0, 0, 1}

	for _, tc := range []struct {
		name  string
		uuid  metal.ID
		mac   net.HardwareAddr
		known bool
		mode  bootpb.Mode
		args  []string
		extra []string
	}{
		{name: "by uuid, any case", uuid: "{AAAAAAAA-0000-0000-0000-000000000001}", known: true, mode: bootpb.Mode_MODE_DISK, args: []string{"console=ttyS0"}},
		{name: "by mac", mac: mac1, known: true, mode: bootpb.Mode_MODE_DISK, args: []string{"console=ttyS0"}},
		{name: "install with extra args", uuid: uuidInstall, known: true, mode: bootpb.Mode_MODE_INSTALL, args: []string{"console=ttyS0"}, extra: []string{"talos.platform=metal"}},
		{name: "unknown is agent", uuid: "bbbbbbbb-0000-0000-0000-000000000009", mode: bootpb.Mode_MODE_AGENT, args: []string{"console=ttyS0"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()

			e := tbl.Lookup(tc.uuid, tc.mac, "x86_64")
			require.Equal(t, tc.known, e.Known)
			require.Equal(t, tc.mode, e.Mode)
			require.Equal(t, tc.args, e.KernelArgs)
			require.Equal(t, tc.extra, e.ExtraArgs)
			require.EqualValues(t, 5, e.Version)
		})
	}

	require.True(t, tbl.SNPOnly(mac1, ""))
	require.False(t, tbl.SNPOnly(net.HardwareAddr{1, 2, 3, 4, 5, 6}, uuidInstall))
	require.True(t, tbl.DiskPlan(mac1, ""), "the disk plan by MAC")
	require.True(t, tbl.DiskPlan(nil, "{AAAAAAAA-0000-0000-0000-000000000001}"), "the disk plan by UUID")
	require.False(t, tbl.DiskPlan(nil, uuidInstall), "an install plan")
	require.False(t, tbl.DiskPlan(net.HardwareAddr{1, 2, 3, 4, 5, 6}, ""), "an unknown machine")
	require.Equal(t, []byte("own"), tbl.MachineConfig(uuidInstall))
	require.Equal(t, []byte("join-config"), tbl.MachineConfig(uuidDisk))

	for _, tc := range []struct {
		name     string
		uuid     string
		mac      net.HardwareAddr
		on, said bool
	}{
		{name: "secure boot off, by mac", mac: mac1, said: true},
		{name: "secure boot on, by uuid", uuid: uuidInstall, on: true, said: true},
		{name: "unknown machine: unsaid", mac: net.HardwareAddr{1, 2, 3, 4, 5, 6}},
	} {
		on, said := tbl.SecureBoot(tc.mac, tc.uuid)
		require.Equal(t, tc.on, on, tc.name)
		require.Equal(t, tc.said, said, tc.name)
	}

}

func TestDeltas(t *testing.T) {
	t.Parallel()

	dir := t.TempDir()
	tbl := open(t, dir)
	_, err := tbl.Apply(snapshot())
	require.NoError(t, err)

	delta := func(base, v uint64, upsert []*bootpb.Plan, remove ...string) *bootpb.ApplyRequest {
		return &bootpb.ApplyRequest{Change: &bootpb.ApplyRequest_Delta{Delta: &bootpb.Delta{BaseVersion: base, Version: v, Upsert: upsert, Remove: remove}}}
	}

	_, err = tbl.Apply(delta(4, 6, nil))
	require.ErrorIs(t, err, boot.ErrVersionMismatch)

	_, err = tbl.Apply(delta(5, 5, nil))
	require.ErrorIs(t, err, boot.ErrInvalid)

	v, err := tbl.Apply(delta(5, 6, []*bootpb.Plan{{Uuid: uuidDisk, Mode: bootpb.Mode_MODE_DENY}}, uuidInstall))
	require.NoError(t, err)
	require.EqualValues(t, 6, v)

	require.Equal(t, bootpb.Mode_MODE_DENY, tbl.Lookup(uuidDisk, nil, "").Mode)
	require.False(t, tbl.Lookup(uuidInstall, nil, "").Known)

	_, err = tbl.Apply(&bootpb.ApplyRequest{})
	require.ErrorIs(t, err, boot.ErrInvalid)

	_, err = tbl.Apply(delta(6, 7, []*bootpb.Plan{{Uuid: "x", Mode: bootpb.Mode_MODE_INSTALL}}))
	require.ErrorIs(t, err, boot.ErrInvalid, "install without kernel")
	require.EqualValues(t, 6, tbl.Version(), "a refused change leaves the table")

	require.EqualValues(t, 6, open(t, dir).Version())
}

func TestCorruptFileMovedAside(t *testing.T) {
	t.Parallel()

	dir := t.TempDir()
	require.NoError(t, os.WriteFile(filepath.Join(dir, boot.FileName), []byte("\xff\xff\xff garbage"), 0o600))

	tbl := open(t, dir)
	require.Zero(t, tbl.Version())
	require.FileExists(t, filepath.Join(dir, boot.FileName+".corrupt"))
	require.Equal(t, bootpb.Mode_MODE_AGENT, tbl.Lookup(uuidDisk, nil, "").Mode)
}

func TestServiceOverGRPC(t *testing.T) {
	t.Parallel()

	tbl := open(t, t.TempDir())

	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)

	srv := grpc.NewServer()
	reach := &bootpb.Reach{HttpBase: "http://10.0.0.2:8080", AgentAddress: "10.0.0.2:50000"}
	boot.NewService(tbl, func() *bootpb.Reach { return reach }).Register(srv)

	go srv.Serve(ln) //nolint:errcheck
	t.Cleanup(srv.Stop)

	conn, err := grpc.NewClient(ln.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	require.NoError(t, err)
	t.Cleanup(func() { conn.Close() }) //nolint:errcheck

	c := bootpb.NewBootPlansClient(conn)
	ctx := context.Background()

	st, err := c.State(ctx, &bootpb.StateRequest{})
	require.NoError(t, err)
	require.Zero(t, st.GetVersion())

	ack, err := c.Apply(ctx, snapshot())
	require.NoError(t, err)
	require.EqualValues(t, 5, ack.GetVersion())
	require.True(t, proto.Equal(reach, ack.GetReach()), "the acknowledgement carries how machines reach the edge: %v", ack.GetReach())

	_, err = c.Apply(ctx, &bootpb.ApplyRequest{Change: &bootpb.ApplyRequest_Delta{Delta: &bootpb.Delta{BaseVersion: 1, Version: 2}}})
	require.Equal(t, codes.FailedPrecondition, status.Code(err))

	_, err = c.Apply(ctx, &bootpb.ApplyRequest{})
	require.Equal(t, codes.InvalidArgument, status.Code(err))
}

// A snapshot that leaves out a machine the edge holds keeps its plan (a restarted controller that does not
// know the machine yet must not turn its disk boot into agent mode); only a machine the snapshot names as
// removed goes.
func TestSnapshotNeverDropsByIgnorance(t *testing.T) {
	t.Parallel()

	dir := t.TempDir()
	tbl := open(t, dir)

	_, err := tbl.Apply(snapshot())
	require.NoError(t, err)

	partial := &bootpb.ApplyRequest{Change: &bootpb.ApplyRequest_Snapshot{Snapshot: &bootpb.Table{
		Version: 6,
		Plans:   []*bootpb.Plan{{Uuid: uuidInstall, Mode: bootpb.Mode_MODE_AGENT}},
	}}}
	_, err = tbl.Apply(partial)
	require.NoError(t, err)

	require.Equal(t, bootpb.Mode_MODE_DISK, tbl.Lookup(uuidDisk, nil, "x86_64").Mode, "left out, kept")
	require.Equal(t, bootpb.Mode_MODE_AGENT, tbl.Lookup(uuidInstall, nil, "x86_64").Mode, "named, replaced")
	require.Equal(t, 1.0, testutil.ToFloat64(tbl.Collectors()[0]))

	removing := &bootpb.ApplyRequest{Change: &bootpb.ApplyRequest_Snapshot{Snapshot: &bootpb.Table{
		Version: 7,
		Plans:   []*bootpb.Plan{{Uuid: uuidInstall, Mode: bootpb.Mode_MODE_AGENT}},
		Removed: []string{strings.ToUpper(uuidDisk)},
	}}}
	_, err = tbl.Apply(removing)
	require.NoError(t, err)

	require.ElementsMatch(t, []string{uuidInstall}, tbl.UUIDs(), "removed on purpose, gone")
	require.Equal(t, 1.0, testutil.ToFloat64(tbl.Collectors()[0]))

	// the instruction is not kept as state: a reload holds the plans only
	reopened := open(t, dir)
	require.ElementsMatch(t, []string{uuidInstall}, reopened.UUIDs())
}

// The site's discovery policy and the MACs an operator registered come with the table, survive a restart,
// and make a registered machine known before any plan names it; a bad value is refused whole.
func TestSiteDiscoveryAndRegisteredMACs(t *testing.T) {
	t.Parallel()

	dir := t.TempDir()
	tbl := open(t, dir)
	registered, stranger := net.HardwareAddr{0x52, 0x54, 0, 0, 0, 0x42}, net.HardwareAddr{0x52, 0x54, 0, 0, 0, 0x43}

	require.Empty(t, tbl.Discovery(), "no policy until the controller sets one")
	require.False(t, tbl.Known(registered, ""))

	_, err := tbl.Apply(&bootpb.ApplyRequest{Change: &bootpb.ApplyRequest_Snapshot{Snapshot: &bootpb.Table{
		Version: 1, Discovery: bootpb.Discovery_DISCOVERY_KNOWN, RegisteredMacs: []string{"52-54-00-00-00-42"},
	}}})
	require.NoError(t, err)
	require.Equal(t, "known", tbl.Discovery())
	require.True(t, tbl.Known(registered, ""), "a registered MAC, written with dashes, is known")
	require.False(t, tbl.Known(stranger, ""))
	require.False(t, tbl.Known(nil, ""))

	reopened := open(t, dir)
	require.Equal(t, "known", reopened.Discovery())
	require.True(t, reopened.Known(registered, ""))

	for _, bad := range []*bootpb.Delta{
		{BaseVersion: 1, Version: 2, Discovery: bootpb.Discovery(9), ReplaceDiscovery: true},
		{BaseVersion: 1, Version: 2, RegisteredMacs: []string{"52:54:00:00:00:44", "not-a-mac"}, ReplaceRegisteredMacs: true},
		{BaseVersion: 1, Version: 2, RegisteredMacs: make([]string, boot.MaxRegisteredMACs+1), ReplaceRegisteredMacs: true},
	} {
		_, err := tbl.Apply(&bootpb.ApplyRequest{Change: &bootpb.ApplyRequest_Delta{Delta: bad}})
		require.ErrorIs(t, err, boot.ErrInvalid)
	}

	require.EqualValues(t, 1, tbl.Version(), "a refused change leaves the table")

	_, err = tbl.Apply(&bootpb.ApplyRequest{Change: &bootpb.ApplyRequest_Delta{Delta: &bootpb.Delta{
		BaseVersion: 1, Version: 2, Discovery: bootpb.Discovery_DISCOVERY_UNSPECIFIED, ReplaceDiscovery: true,
		RegisteredMacs: []string{stranger.String()}, ReplaceRegisteredMacs: true,
	}}})
	require.NoError(t, err)
	require.Empty(t, tbl.Discovery(), "handed back to the edge's own setting")
	require.False(t, tbl.Known(registered, ""), "unregistered")
	require.True(t, tbl.Known(stranger, ""))
}

// The site's DHCP service travels like discovery: set by a snapshot or a delta that replaces it, kept by deltas
// that do not, persisted, and refused whole when it does not check.
func TestDHCPService(t *testing.T) {
	t.Parallel()

	dir := t.TempDir()
	tbl := open(t, dir)
	require.Nil(t, tbl.DHCP(), "the edge's own until the controller sets one")

	full := &bootpb.DHCP{
		Mode: bootpb.DHCPMode_DHCP_MODE_FULL, Subnet: "10.9.0.0/24", PoolStart: "10.9.0.100", PoolEnd: "10.9.0.199",
		Gateway: "10.9.0.1", Reservations: []*bootpb.DHCPReservation{{Mac: "52:54:00:00:00:42", Ip: "10.9.0.42"}},
	}

	_, err := tbl.Apply(&bootpb.ApplyRequest{Change: &bootpb.ApplyRequest_Snapshot{Snapshot: &bootpb.Table{Version: 1, Dhcp: full}}})
	require.NoError(t, err)
	require.True(t, proto.Equal(full, tbl.DHCP()))

	_, err = tbl.Apply(&bootpb.ApplyRequest{Change: &bootpb.ApplyRequest_Delta{Delta: &bootpb.Delta{BaseVersion: 1, Version: 2, KernelArgs: []string{"x"}, ReplaceKernelArgs: true}}})
	require.NoError(t, err)
	require.True(t, proto.Equal(full, open(t, dir).DHCP()), "kept by a delta that does not replace it, and persisted")

	bad := proto.Clone(full).(*bootpb.DHCP)
	bad.Reservations = append(bad.Reservations, &bootpb.DHCPReservation{Mac: "52:54:00:00:00:43", Ip: "10.9.0.42"})
	_, err = tbl.Apply(&bootpb.ApplyRequest{Change: &bootpb.ApplyRequest_Delta{Delta: &bootpb.Delta{BaseVersion: 2, Version: 3, Dhcp: bad, ReplaceDhcp: true}}})
	require.ErrorIs(t, err, boot.ErrInvalid)
	require.ErrorContains(t, err, "10.9.0.42 is reserved for 52:54:00:00:00:42 and 52:54:00:00:00:43")

	_, err = tbl.Apply(&bootpb.ApplyRequest{Change: &bootpb.ApplyRequest_Delta{Delta: &bootpb.Delta{BaseVersion: 2, Version: 3, ReplaceDhcp: true}}})
	require.NoError(t, err)
	require.Nil(t, tbl.DHCP(), "handed back to the edge's own")
}

// The site's Secure Boot setting, by a delta as the controller sends it, says for machines whose plan does not;
// an unknown value is refused.
func TestSiteSecureBoot(t *testing.T) {
	t.Parallel()

	tbl := open(t, t.TempDir())
	_, err := tbl.Apply(snapshot())
	require.NoError(t, err)

	mac1 := net.HardwareAddr{0x52, 0x54, 0, 0, 0, 1}

	// The site's setting, by a delta as the controller sends it: for machines whose plan does not say.
	_, err = tbl.Apply(&bootpb.ApplyRequest{Change: &bootpb.ApplyRequest_Delta{Delta: &bootpb.Delta{
		BaseVersion: 5, Version: 6, SecureBoot: bootpb.SecureBoot_SECURE_BOOT_ON, ReplaceSecureBoot: true,
	}}})
	require.NoError(t, err)

	on, said := tbl.SecureBoot(net.HardwareAddr{1, 2, 3, 4, 5, 6}, "")
	require.Equal(t, []bool{true, true}, []bool{on, said}, "an unknown machine: the site's setting")

	on, said = tbl.SecureBoot(mac1, "")
	require.Equal(t, []bool{false, true}, []bool{on, said}, "a plan that says comes first")

	_, err = tbl.Apply(&bootpb.ApplyRequest{Change: &bootpb.ApplyRequest_Delta{Delta: &bootpb.Delta{
		BaseVersion: 6, Version: 7, SecureBoot: bootpb.SecureBoot(7), ReplaceSecureBoot: true,
	}}})
	require.ErrorIs(t, err, boot.ErrInvalid, "an unknown setting is refused")
}

// A plan's signed image is given for its agent and install modes, never for a disk plan; a signed image that
// is neither an /assets/ name nor an http(s) URL, or would not fit a DHCP reply, refuses the whole change.
func TestSignedImage(t *testing.T) {
	t.Parallel()

	tbl := open(t, t.TempDir())
	img := &bootpb.SignedImage{Url: "/assets/talos/v1.11.5/abc/amd64/secureboot-uki.efi", UpstreamUrl: "https://factory.invalid/image/abc/v1.11.5/metal-amd64-secureboot-uki.efi"}
	mac, _ := net.ParseMAC("52:54:00:00:00:07")

	_, err := tbl.Apply(&bootpb.ApplyRequest{Change: &bootpb.ApplyRequest_Snapshot{Snapshot: &bootpb.Table{
		Version: 1,
		Plans: []*bootpb.Plan{
			{Uuid: uuidDisk, Mode: bootpb.Mode_MODE_DISK, SignedImage: img},
			{Uuid: uuidInstall, Macs: []string{mac.String()}, Mode: bootpb.Mode_MODE_INSTALL, Install: &bootpb.Kernel{KernelUrl: "/assets/k"}, SignedImage: img},
		},
	}}})
	require.NoError(t, err)
	require.True(t, proto.Equal(img, tbl.SignedImage(nil, uuidInstall, metal.AMD64)))
	require.True(t, proto.Equal(img, tbl.SignedImage(mac, "", metal.AMD64)), "by MAC before the UUID is known")
	require.Nil(t, tbl.SignedImage(nil, uuidDisk, metal.AMD64), "a disk plan boots no signed image")
	require.Nil(t, tbl.SignedImage(nil, "aaaaaaaa-0000-0000-0000-000000000009", metal.AMD64), "no plan")

	for _, bad := range []*bootpb.SignedImage{
		{},
		{Url: "/assets/../etc/passwd"},
		{Url: "tftp://10.0.0.1/uki.efi"},
		{Url: "/tftp/uki.efi"},
		{Url: "/assets/uki.efi", UpstreamUrl: "https://factory.invalid/a b"},
		{Url: "http://10.0.0.1/" + strings.Repeat("a", 200)},
		{Url: "http://10.0.0.1/\x00"},
	} {
		_, err := tbl.Apply(&bootpb.ApplyRequest{Change: &bootpb.ApplyRequest_Snapshot{Snapshot: &bootpb.Table{
			Version: 2, Plans: []*bootpb.Plan{{Uuid: uuidInstall, Mode: bootpb.Mode_MODE_AGENT, SignedImage: bad}},
		}}})
		require.ErrorIs(t, err, boot.ErrInvalid, "%v", bad)
	}

	require.EqualValues(t, 1, tbl.Version(), "a refused change changes nothing")

	// The site's signed agent image, per arch, for machines in agent mode whose plan names none (or that have
	// no plan: a first boot); a delta replaces it.
	siteAgent := &bootpb.SignedImage{Url: "/assets/talos/v1.11.0/def/amd64/secureboot-uki.efi"}
	_, err = tbl.Apply(&bootpb.ApplyRequest{Change: &bootpb.ApplyRequest_Delta{Delta: &bootpb.Delta{
		BaseVersion: 1, Version: 2, ReplaceSignedAgent: true, SignedAgent: map[string]*bootpb.SignedImage{"x86_64": siteAgent},
		Upsert: []*bootpb.Plan{{Uuid: "aaaaaaaa-0000-0000-0000-000000000003", Mode: bootpb.Mode_MODE_AGENT}},
	}}})
	require.NoError(t, err)
	require.True(t, proto.Equal(siteAgent, tbl.SignedImage(nil, "aaaaaaaa-0000-0000-0000-000000000009", metal.AMD64)), "no plan: the site's")
	require.True(t, proto.Equal(siteAgent, tbl.SignedImage(nil, "aaaaaaaa-0000-0000-0000-000000000003", metal.AMD64)), "an agent plan naming none")
	require.Nil(t, tbl.SignedImage(nil, "aaaaaaaa-0000-0000-0000-000000000009", metal.ARM64), "none for arm64")
	require.True(t, proto.Equal(img, tbl.SignedImage(nil, uuidInstall, metal.AMD64)), "a plan's own comes first")

	for _, bad := range []map[string]*bootpb.SignedImage{{"amd64": siteAgent}, {"x86_64": nil}, {"arm64": {Url: "ftp://x/y"}}} {
		_, err := tbl.Apply(&bootpb.ApplyRequest{Change: &bootpb.ApplyRequest_Delta{Delta: &bootpb.Delta{
			BaseVersion: 2, Version: 3, ReplaceSignedAgent: true, SignedAgent: bad,
		}}})
		require.ErrorIs(t, err, boot.ErrInvalid, "%v", bad)
	}
}
