package bootlab_test

import (
	"context"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.uber.org/zap"
	"go.uber.org/zap/zaptest"
	"google.golang.org/grpc"

	"github.com/outpost-metal/outpost/controller/bootevents"
	"github.com/outpost-metal/outpost/controller/bootplans"
	"github.com/outpost-metal/outpost/controller/boottables"
	"github.com/outpost-metal/outpost/controller/sites"
	"github.com/outpost-metal/outpost/edge/assetcache"
	"github.com/outpost-metal/outpost/edge/boot"
	"github.com/outpost-metal/outpost/edge/bootfiles"
	"github.com/outpost-metal/outpost/edge/dhcp"
	"github.com/outpost-metal/outpost/edge/httpd"
	"github.com/outpost-metal/outpost/edge/journal"
	edgeuplink "github.com/outpost-metal/outpost/edge/uplink"
	"github.com/outpost-metal/outpost/qemu/linklab"
	bootpb "github.com/outpost-metal/outpost/shared/api/boot"
)

const (
	diskUUID    = "0d15c000-0000-4000-8000-000000000001"
	unknownUUID = "0d15c000-0000-4000-8000-0000000000ff"
)

// eventLog is the controller's event handler in this test: it records every event it is given.
type eventLog struct {
	mu   sync.Mutex
	seqs []uint64
	evs  []*bootpb.Event
}

func (l *eventLog) HandleEvent(_ context.Context, site string, e *bootpb.Event) error {
	l.mu.Lock()
	defer l.mu.Unlock()

	if site != "branch" {
		return nil
	}

	l.seqs = append(l.seqs, e.GetSequence())
	l.evs = append(l.evs, e)

	return nil
}

func (l *eventLog) snapshot() ([]uint64, []*bootpb.Event) {
	l.mu.Lock()
	defer l.mu.Unlock()

	return append([]uint64(nil), l.seqs...), append([]*bootpb.Event(nil), l.evs...)
}

func bootScript(t *testing.T, base, uuid string) (int, string) {
	t.Helper()

	resp, err := http.Get(base + "/ipxe/boot.ipxe?uuid=" + uuid + "&mac=52-54-00-00-00-01&arch=x86_64")
	require.NoError(t, err)

	defer resp.Body.Close() //nolint:errcheck

	b, err := io.ReadAll(resp.Body)
	require.NoError(t, err)

	return resp.StatusCode, string(b)
}

// TestBootWithUplinkDown runs the edge boot service over the real uplink: the controller pushes a boot table
// and stops, machines still boot from the persisted table (disk to disk, unknown to agent mode), and the
// events recorded meanwhile reach the controller after it returns, in order, once.
func TestBootWithUplinkDown(t *testing.T) {
	t.Parallel()

	log := zaptest.NewLogger(t, zaptest.Level(zap.WarnLevel))
	events := &eventLog{}
	receiver := bootevents.NewReceiver(log, sites.SiteFromContext, events)
	tables := boottables.New(log, nil)

	ctrl := linklab.StartController(t, linklab.ControllerOptions{
		Logger:    log,
		Register:  []func(grpc.ServiceRegistrar){receiver.Register},
		OnSession: []sites.SessionFunc{tables.OnSession},
	})
	token := ctrl.CreateSite(t, "branch", sites.TokenOptions{})

	// The edge's boot pieces, wired as the edge app wires them.
	stateDir := t.TempDir()
	table, err := boot.Open(boot.Config{StateDir: stateDir}, log)
	require.NoError(t, err)

	jcfg := journal.Default()
	jcfg.Dir = stateDir
	jcfg.RetryInterval = 20 * time.Millisecond
	jrnl, err := journal.Open(jcfg, log, journal.Deps{})
	require.NoError(t, err)
	t.Cleanup(func() { jrnl.Close() }) //nolint:errcheck

	recorder := journal.NewRecorder(jrnl, log)

	// The agent image the edge serves unknown machines (without it they would wait for it).
	files := t.TempDir()
	require.NoError(t, os.MkdirAll(filepath.Join(files, "agent", "x86_64"), 0o755))

	for _, f := range []string{"vmlinuz", "initramfs.xz"} {
		require.NoError(t, os.WriteFile(filepath.Join(files, "agent", "x86_64", f), []byte(f), 0o644))
	}

	store, err := assetcache.New(assetcache.Config{Dir: t.TempDir(), MaxBytes: 1 << 20, Attempts: 1}, log, nil)
	require.NoError(t, err)
	served, err := assetcache.NewHandler(store, files)
	require.NoError(t, err)
	t.Cleanup(func() { served.Close() }) //nolint:errcheck

	httpSrv, err := httpd.New(httpd.Default(), log, httpd.Deps{
		Table: table, Catalog: bootfiles.NewCatalog(map[string][]byte{"ipxe.efi": []byte("x")}), Observer: recorder, Assets: served,
	})
	require.NoError(t, err)
	t.Cleanup(func() { httpSrv.Close() }) //nolint:errcheck

	web := httptest.NewServer(httpSrv.Handler())
	t.Cleanup(web.Close)

	linklab.StartEdge(t, ctrl.Addr, token, linklab.EdgeOptions{Options: edgeuplink.Options{
		Logger:   log,
		Register: []func(grpc.ServiceRegistrar){boot.NewService(table, nil).Register},
		OnSession: []edgeuplink.SessionFunc{func(ctx context.Context, conn grpc.ClientConnInterface) error {
			return jrnl.Deliver(ctx, bootpb.NewEventsClient(conn))
		}},
	}})

	// The controller pushes the site's table and waits for the edge's acknowledgement.
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()

	version, err := tables.Push(ctx, "branch", bootplans.Plan{MachineID: diskUUID, Mode: bootplans.ModeDisk})
	require.NoError(t, err)
	require.Equal(t, version, table.Version())

	// The controller stops (as its process would), and comes back later on the same address with the same
	// state and CA; its in-memory parts (event receiver, plan pusher) start afresh.
	receiver2 := bootevents.NewReceiver(log, sites.SiteFromContext, events)
	tables2 := boottables.New(log, nil)

	ctrl = ctrl.Restart(t, linklab.ControllerOptions{
		Logger:    log,
		Register:  []func(grpc.ServiceRegistrar){receiver2.Register},
		OnSession: []sites.SessionFunc{tables2.OnSession},
	}, func() {
		// Machines keep booting from the persisted table.
		code, body := bootScript(t, web.URL, diskUUID)
		require.Equal(t, http.StatusOK, code)
		require.Contains(t, body, "exit 1", "a machine marked disk is handed to its disk")

		code, body = bootScript(t, web.URL, unknownUUID)
		require.Equal(t, http.StatusOK, code)
		require.Contains(t, body, "metal.provider.address=", "an unknown machine gets agent mode")

		recorder.DHCPSeen(dhcp.Seen{MAC: net.HardwareAddr{0x52, 0x54, 0, 0, 0, 1}, Firmware: dhcp.FirmwareUEFIx86})
		recorder.TFTPFetch(bootfiles.Fetch{Name: "ipxe.efi"})

		// The boot table survives an edge restart too (reopened from the state directory).
		reopened, err := boot.Open(boot.Config{StateDir: stateDir}, log)
		require.NoError(t, err)
		require.Equal(t, bootpb.Mode_MODE_DISK, reopened.Lookup(diskUUID, nil, "x86_64").Mode)

		// The journal holds the four events while nothing can take them.
		require.Eventually(t, func() bool { return jrnl.Counters()["journal_pending"] == 4 }, 5*time.Second, 10*time.Millisecond)

		seqs, _ := events.snapshot()
		require.Empty(t, seqs, "nothing reaches the controller while it is down")
	})

	// The edge reconnects to the restarted controller with its enrolled identity.
	ctrl.WaitConnected(t, "branch")

	// The restarted controller plans the same table from its state and pushes it as a snapshot.
	_, err = tables2.Push(ctx, "branch", bootplans.Plan{MachineID: diskUUID, Mode: bootplans.ModeDisk})
	require.NoError(t, err)
	require.Greater(t, table.Version(), version, "a snapshot of the new controller's table")

	// The events arrive in order, once.
	require.Eventually(t, func() bool { s, _ := events.snapshot(); return len(s) >= 4 }, 15*time.Second, 10*time.Millisecond)

	// Give a duplicate, if there were one, the chance to arrive before checking.
	_, err = jrnl.Append(&bootpb.Event{Kind: &bootpb.Event_PxeSeen{PxeSeen: &bootpb.PXESeen{File: "marker"}}})
	require.NoError(t, err)
	require.Eventually(t, func() bool { s, _ := events.snapshot(); return len(s) >= 5 }, 15*time.Second, 10*time.Millisecond)

	seqs, evs := events.snapshot()
	require.Equal(t, []uint64{1, 2, 3, 4, 5}, seqs)
	// The HTTP handler records its event after flushing the answer, so the kinds may interleave;
	// the sequence numbers are what must arrive in order, once.
	var kinds []string
	for _, e := range evs[:4] {
		switch {
		case e.GetBootServed() != nil:
			kinds = append(kinds, "boot-served "+e.GetBootServed().GetMode())
		case e.GetDhcpSeen() != nil:
			kinds = append(kinds, "dhcp-seen "+e.GetDhcpSeen().GetFirmware())
		case e.GetPxeSeen() != nil:
			kinds = append(kinds, "pxe-seen "+e.GetPxeSeen().GetFile())
		}
	}

	require.ElementsMatch(t, []string{"boot-served disk", "boot-served agent", "dhcp-seen uefi-x86", "pxe-seen ipxe.efi"}, kinds)
	require.Equal(t, "marker", evs[4].GetPxeSeen().GetFile())
	require.Equal(t, uint64(5), receiver2.Acked("branch", jrnl.ID()))
}
