package admincli_test

import (
	"bytes"
	"context"
	"encoding/json"
	"net"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"google.golang.org/grpc"

	"github.com/outpost-metal/outpost/controller/admincli"
	"github.com/outpost-metal/outpost/controller/lifecycle"
	"github.com/outpost-metal/outpost/controller/status"
	"github.com/outpost-metal/outpost/controller/timeline"
	adminpb "github.com/outpost-metal/outpost/shared/api/admin"
	bootpb "github.com/outpost-metal/outpost/shared/api/boot"
)

const (
	m1 = "4c4c4544-0042-3510-8052-b4c04f4e3232"
	m2 = "4c4c4544-0042-3510-8052-b4c04f4e3233"
	m3 = "4c4c4544-0042-3510-8052-b4c04f4e3234"
)

// siteAdmin serves one site.
type siteAdmin struct {
	adminpb.UnimplementedAdminServer
}

func (siteAdmin) ShowSite(_ context.Context, req *adminpb.ShowSiteRequest) (*adminpb.ShowSiteResponse, error) {
	return &adminpb.ShowSiteResponse{Site: &adminpb.Site{SiteId: req.GetSiteId(), Connected: true, EdgeVersion: "v1.2.3"}}, nil
}

func (siteAdmin) ListSites(context.Context, *adminpb.ListSitesRequest) (*adminpb.ListSitesResponse, error) {
	return &adminpb.ListSitesResponse{Sites: []*adminpb.Site{{SiteId: "branch-7", Connected: true}}}, nil
}

// fleet is three machines at two sites, one that booted (with a hostile BMC error), on the real Machines API.
func fleet(t *testing.T) *admincli.Client {
	t.Helper()

	// the book's entries are written ten minutes ago: m2, powered on then, has seen no DHCP since
	book := timeline.New(timeline.DefaultConfig(), func() time.Time { return time.Now().Add(-10 * time.Minute) })
	book.Record(m2, timeline.KindPower, "powered on into agent mode", false)
	book.Summarize(m1, lifecycle.MachineSummary{Site: "branch-7", Phase: lifecycle.PhaseReady, Power: "off", BMCAddress: "10.0.1.5", BMCProtocol: "ipmi"})
	book.Summarize(m2, lifecycle.MachineSummary{Site: "branch-7", Phase: lifecycle.PhaseWiping, Power: "on"})
	book.Summarize(m3, lifecycle.MachineSummary{Site: "branch-9", Phase: lifecycle.PhaseReady, Power: "on"})

	for _, e := range []*bootpb.Event{
		{Kind: &bootpb.Event_DhcpSeen{DhcpSeen: &bootpb.DHCPSeen{Mac: "52:54:00:00:00:01", Firmware: "bios"}}},
		{Kind: &bootpb.Event_BootServed{BootServed: &bootpb.BootServed{Uuid: m1, Mac: "52:54:00:00:00:01", Mode: "agent"}}},
		{Kind: &bootpb.Event_AgentTunnel{AgentTunnel: &bootpb.AgentTunnel{MachineId: m1, Open: true}}},
		{Kind: &bootpb.Event_PowerChanged{PowerChanged: &bootpb.PowerChanged{MachineId: m1, State: "unknown", Error: "bmc\x1b]0;owned\x07\x1b[2J"}}},
		// a machine whose DHCP request named no UUID and whose boot went no further: known by its MAC only
		{Kind: &bootpb.Event_DhcpSeen{DhcpSeen: &bootpb.DHCPSeen{Mac: "52:54:00:00:00:09", Firmware: "bios"}}},
	} {
		require.NoError(t, book.HandleEvent(t.Context(), "branch-7", e))
	}

	sock := filepath.Join(t.TempDir(), "admin.sock")

	ln, err := net.Listen("unix", sock)
	require.NoError(t, err)

	srv := grpc.NewServer()
	adminpb.RegisterAdminServer(srv, siteAdmin{})
	adminpb.RegisterMachinesServer(srv, status.NewAPI(book))

	go srv.Serve(ln) //nolint:errcheck

	t.Cleanup(srv.Stop)

	c, err := admincli.Dial(sock)
	require.NoError(t, err)

	t.Cleanup(func() { c.Close() }) //nolint:errcheck

	return c
}

func TestMachineList(t *testing.T) {
	t.Parallel()

	c := fleet(t)

	var out bytes.Buffer

	require.NoError(t, c.ListMachines(t.Context(), admincli.MachineFilter{}, &out, time.Now()))

	lines := strings.Split(strings.TrimSpace(out.String()), "\n")
	require.Len(t, lines, 4, out.String())
	require.Contains(t, lines[0], "PHASE")
	require.Contains(t, lines[1], m1)
	require.Contains(t, lines[1], "ipmi 10.0.1.5")
	require.Contains(t, lines[3], "branch-9")
	require.NotContains(t, out.String(), "\x1b", "hostile BMC error printed escaped")
	require.Contains(t, out.String(), `bmc\x1b]0;owned`)

	out.Reset()
	require.NoError(t, c.ListMachines(t.Context(), admincli.MachineFilter{Site: "branch-7", Phase: lifecycle.PhaseWiping}, &out, time.Now()))
	require.Contains(t, out.String(), m2)
	require.NotContains(t, out.String(), m1)
	require.NotContains(t, out.String(), m3)

	require.ErrorContains(t, c.ListMachines(t.Context(), admincli.MachineFilter{Phase: "bogus"}, &out, time.Now()), "phase")
}

func TestMachineListJSON(t *testing.T) {
	t.Parallel()

	c := fleet(t)
	c.Output = admincli.OutputJSON

	var out bytes.Buffer

	require.NoError(t, c.ListMachines(t.Context(), admincli.MachineFilter{Phase: lifecycle.PhaseReady}, &out, time.Now()))

	var got struct {
		Machines []struct {
			MachineID string `json:"machineId"`
			SiteID    string `json:"siteId"`
			Phase     string `json:"phase"`
		} `json:"machines"`
		Total int `json:"total"`
	}

	require.NoError(t, json.Unmarshal(out.Bytes(), &got), out.String())
	require.Equal(t, 2, got.Total)
	require.Equal(t, m1, got.Machines[0].MachineID)
	require.Equal(t, "branch-9", got.Machines[1].SiteID)
}

func TestMachineShow(t *testing.T) {
	t.Parallel()

	c := fleet(t)

	var out bytes.Buffer

	require.NoError(t, c.ShowMachine(t.Context(), strings.ToUpper(m1), &out, time.Now()))

	s := out.String()
	require.Contains(t, s, "ipmi 10.0.1.5")
	require.Contains(t, s, "52:54:00:00:00:01")
	require.Contains(t, s, "timeline:")

	// the boot steps in the order they happened
	iDHCP, iBoot, iAgent := strings.Index(s, "dhcp"), strings.Index(s, "boot-served"), strings.Index(s, "agent-up")
	require.Positive(t, iDHCP)
	require.Less(t, iDHCP, iBoot)
	require.Less(t, iBoot, iAgent)
	require.Contains(t, s, "ERROR BMC not answering")
	require.NotContains(t, s, "\x1b")

	require.NotContains(t, s, "diagnosis:", "m1 booted as far as it should")

	// A machine powered on ten minutes ago that no DHCP came from since: said where its boot stopped.
	out.Reset()
	require.NoError(t, c.ShowMachine(t.Context(), m2, &out, time.Now()))
	require.Regexp(t, `diagnosis:\s+powered on at \d\d:\d\d:\d\d and no DHCP request from its interfaces since`, out.String())

	require.ErrorContains(t, c.ShowMachine(t.Context(), "00000000-0000-0000-0000-000000000000", &out, time.Now()), "no machine")

	c.Output = admincli.OutputJSON
	out.Reset()
	require.NoError(t, c.ShowMachine(t.Context(), m1, &out, time.Now()))

	var got struct {
		Machine  struct{ Phase string }
		Timeline []struct {
			Kind  string
			Error bool
		}
	}

	require.NoError(t, json.Unmarshal(out.Bytes(), &got), out.String())
	require.Equal(t, lifecycle.PhaseReady, got.Machine.Phase)
	require.Equal(t, timeline.KindPhase, got.Timeline[0].Kind)
	require.Equal(t, timeline.KindDHCP, got.Timeline[1].Kind)
	require.True(t, got.Timeline[len(got.Timeline)-1].Error)
}

// site show lists the site's machines, in table and JSON.
func TestSiteShowListsMachines(t *testing.T) {
	t.Parallel()

	c := fleet(t)

	var out bytes.Buffer

	require.NoError(t, c.ShowSite(t.Context(), "branch-7", &out, time.Now()))
	require.Contains(t, out.String(), "machines: 2")
	require.Contains(t, out.String(), m1)
	require.Contains(t, out.String(), m2)
	require.NotContains(t, out.String(), m3)

	c.Output = admincli.OutputJSON
	out.Reset()
	require.NoError(t, c.ShowSite(t.Context(), "branch-7", &out, time.Now()))

	var got struct {
		Site struct {
			Site struct {
				SiteID string `json:"siteId"`
			}
		}
		Machines struct{ Total int }
	}

	require.NoError(t, json.Unmarshal(out.Bytes(), &got), out.String())
	require.Equal(t, "branch-7", got.Site.Site.SiteID)
	require.Equal(t, 2, got.Machines.Total)

	out.Reset()
	require.NoError(t, c.ListSites(t.Context(), &out, time.Now()))
	require.True(t, json.Valid(out.Bytes()), out.String())
}

// frames cancels its context once it has seen n frames of a watch.
type frames struct {
	mu     sync.Mutex
	n      int
	seen   []string
	cancel context.CancelFunc
}

func (f *frames) Write(p []byte) (int, error) {
	f.mu.Lock()
	defer f.mu.Unlock()

	f.seen = append(f.seen, string(p))
	if len(f.seen) >= f.n {
		f.cancel()
	}

	return len(p), nil
}

func TestWatchRedraws(t *testing.T) {
	t.Parallel()

	c := fleet(t)

	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()

	f := &frames{n: 2, cancel: cancel}
	require.NoError(t, c.WatchMachines(ctx, admincli.MachineFilter{Site: "branch-9"}, f, time.Millisecond, time.Now))

	require.Len(t, f.seen, 2)

	for _, frame := range f.seen {
		require.True(t, strings.HasPrefix(frame, "\x1b[H\x1b[2J"), "each frame starts by clearing the screen")
		require.Contains(t, frame, m3)
		require.NotContains(t, frame, m1)
	}
}

func TestMachineWhy(t *testing.T) {
	t.Parallel()

	c := fleet(t)

	var out bytes.Buffer

	// m2 was powered on ten minutes ago and no DHCP came: the step that did not happen, then that boot's entries.
	require.NoError(t, c.WhyMachine(t.Context(), m2, &out))
	require.Regexp(t, `^`+m2+`: powered on at \d\d:\d\d:\d\d and no DHCP request from its interfaces since`, out.String())
	require.Contains(t, out.String(), "this boot:")
	require.Contains(t, out.String(), "powered on into agent mode")

	// m1's boot reached its agent: nothing amiss, and nothing of that finished boot listed as this one's.
	out.Reset()
	require.NoError(t, c.WhyMachine(t.Context(), m1, &out))
	require.Contains(t, out.String(), m1+": nothing amiss")
	require.NotContains(t, out.String(), "boot-served")
	require.NotContains(t, out.String(), "\x1b")

	require.ErrorContains(t, c.WhyMachine(t.Context(), "00000000-0000-0000-0000-000000000000", &out), "no machine")

	// By MAC: a machine only its edge has seen, and a known machine's interface.
	out.Reset()
	require.NoError(t, c.WhyMachine(t.Context(), "52-54-00-00-00-09", &out))
	require.Regexp(t, `^52:54:00:00:00:09 \(no machine ID seen yet\): its DHCP request was seen at \d\d:\d\d:\d\d but no boot file`, out.String())

	out.Reset()
	require.NoError(t, c.WhyMachine(t.Context(), "52:54:00:00:00:01", &out))
	require.Contains(t, out.String(), m1+": nothing amiss")

	require.ErrorContains(t, c.WhyMachine(t.Context(), "52:54:00:00:00:77", &out), "no machine")
}
