package fleet

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"net/url"
	"path/filepath"
	"strings"
	"sync"
	"time"

	pb "github.com/siderolabs/siderolink/api/siderolink"
	"go.uber.org/zap"
	"golang.org/x/sync/errgroup"
	"golang.zx2c4.com/wireguard/wgctrl/wgtypes"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/outpost-metal/outpost/edge/assetcache"
	"github.com/outpost-metal/outpost/edge/bmc"
	"github.com/outpost-metal/outpost/edge/boot"
	"github.com/outpost-metal/outpost/edge/bootfiles"
	"github.com/outpost-metal/outpost/edge/httpd"
	"github.com/outpost-metal/outpost/edge/journal"
	"github.com/outpost-metal/outpost/edge/tunnel"
	"github.com/outpost-metal/outpost/edge/uplink"
	bootpb "github.com/outpost-metal/outpost/shared/api/boot"
	"github.com/outpost-metal/outpost/shared/metal"
)

// site is one simulated site: a real edge's components (uplink client, boot table, journal, iPXE HTTP handler,
// agent tunnel endpoint and proxy, asset cache) without its site-network listeners, its machines and their BMCs.
type site struct {
	fleet *fleet
	id    string
	index int
	ip    netip.Addr // the site's own loopback address: its uplink's source, its machines' address
	log   *zap.Logger

	ctx context.Context // the site's run context, which its machines' power-ons derive from

	table    *boot.Table
	jrnl     *journal.Journal
	recorder *journal.Recorder
	book     *tunnel.BootBook
	tunnels  *tunnel.Server
	tunnelLn net.Listener
	// agentConns carry the site's agents in "site" mode, agentsPerConn each.
	agentConns []*grpc.ClientConn
	httpSrv    *httpd.Server
	served     *assetcache.Handler
	fetcher    *assetcache.Fetcher
	bmcs       *BMCService
	link       *uplink.Client
	wan        *wan

	machines []*machine
	modes    sync.Map // machine ID -> boot mode last served (from the observer)
}

func newSite(f *fleet, index int, token string) (*site, error) {
	id := siteID(index)
	dir := filepath.Join(f.cfg.WorkDir, "sites", id)
	log := f.edgeLog.With(zap.String("site", id))
	ip := siteAddr(index)

	s := &site{fleet: f, id: id, index: index, ip: ip, log: log, book: tunnel.NewBootBook(nil), wan: &wan{ip: ip, conns: map[net.Conn]struct{}{}}}

	var err error

	if s.table, err = boot.Open(boot.Config{StateDir: dir}, log); err != nil {
		return nil, err
	}

	jcfg := journal.Default()
	jcfg.Dir = dir

	if s.jrnl, err = journal.Open(jcfg, log, journal.Deps{}); err != nil {
		return nil, err
	}

	s.recorder = journal.NewRecorder(s.jrnl, log)
	// agents on their own connection come from their machine's address and are bound to its boot evidence as
	// on a real edge; all of a site's agents on one connection cannot be (one address), so they are taken as given
	limits, binding := tunnel.DefaultLimits(), tunnel.BindAddress
	if f.cfg.AgentConns == "site" {
		binding = tunnel.BindOff
		limits.MaxTunnelsPerConn = max(limits.MaxTunnelsPerConn, 2*f.cfg.MachinesPerSite)
		limits.MaxTunnelsPerSource = max(limits.MaxTunnelsPerSource, 2*f.cfg.MachinesPerSite)
		limits.MaxTunnels = max(limits.MaxTunnels, limits.MaxTunnelsPerSource)
	}

	s.tunnels = tunnel.New(tunnel.Options{Logger: log, Events: tunnelEvents{s.recorder}, Addresses: s.book, Evidence: s.book, Limits: limits, Binding: binding})

	acfg := assetcache.Default()
	acfg.Dir = filepath.Join(dir, "assets")

	store, err := assetcache.New(acfg, log, assetcache.NoneNeeded{}, time.Now)
	if err != nil {
		return nil, err
	}

	if s.fetcher, err = assetcache.NewFetcher(assetcache.DefaultFetcher(), store, noUpstream{}, log); err != nil {
		return nil, err
	}

	if s.served, err = assetcache.NewHandler(store, f.filesDir); err != nil {
		return nil, err
	}

	hcfg := httpd.Default()
	hcfg.Listen = "in-process:80"

	if s.httpSrv, err = httpd.New(hcfg, log, httpd.Deps{Table: s.table, Catalog: f.catalog, Observer: bootObserver{s}, Assets: s.served}); err != nil {
		return nil, err
	}

	s.bmcs = newBMCService(bmc.Default(), &f.cfg.BMC, uint64(index)+1) // index is small
	if f.cfg.WatchBMCs {
		s.bmcs.watcher = newEdgeWatch(s.bmcs, s.recorder, bmc.DefaultWatcher())
	}

	if s.tunnelLn, err = net.Listen("tcp", "127.0.0.1:0"); err != nil {
		return nil, fmt.Errorf("agent tunnel listener of %s: %w", id, err)
	}

	if f.cfg.AgentConns == "site" {
		for range (f.cfg.MachinesPerSite + agentsPerConn - 1) / agentsPerConn {
			conn, err := s.dialAgent(ip)
			if err != nil {
				return nil, err
			}

			s.agentConns = append(s.agentConns, conn)
		}
	}

	ucfg := uplink.Default()
	ucfg.ControllerAddress = f.uplinkAddr
	ucfg.StateDir = dir
	ucfg.JoinToken = token

	if s.link, err = uplink.New(ucfg, uplink.Options{
		Logger: log,
		Register: []func(grpc.ServiceRegistrar){
			boot.NewService(s.table).Register,
			s.bmcs.Register,
			assetcache.NewService(s.fetcher).Register,
		},
		ServerOptions: []grpc.ServerOption{s.tunnels.ServerOption()},
		OnSession: []uplink.SessionFunc{
			func(ctx context.Context, conn grpc.ClientConnInterface) error {
				events := bootpb.NewEventsClient(conn)
				s.reportInventory(ctx, events)

				return s.jrnl.Deliver(ctx, events)
			},
			s.fetcher.OnSession,
		},
		Counters: func() map[string]int64 {
			c := s.jrnl.Counters()
			c["boot_table_version"] = int64(s.table.Version()) // versions stay far below 2^63

			return c
		},
		Dial: s.wan.dial,
	}); err != nil {
		return nil, err
	}

	return s, nil
}

// dialAgent returns a connection to the site's agent tunnel endpoint from address ip (connecting lazily).
func (s *site) dialAgent(ip netip.Addr) (*grpc.ClientConn, error) {
	dialer := &net.Dialer{LocalAddr: &net.TCPAddr{IP: ip.AsSlice()}}

	conn, err := grpc.NewClient("passthrough:///"+s.tunnelLn.Addr().String(),
		grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithContextDialer(func(ctx context.Context, addr string) (net.Conn, error) { return dialer.DialContext(ctx, "tcp", addr) }),
	)
	if err != nil {
		return nil, fmt.Errorf("agent connection to site %s: %w", s.id, err)
	}

	return conn, nil
}

// agentsPerConn is how many agents share one connection in "site" mode: the edge allows 16 streams on an agent
// connection (one agent needs one), so a site's 40 agents on one connection left all but 16 waiting for a
// stream, counted up but never connected.
const agentsPerConn = 8

// run runs the site's edge until ctx ends. ctx also bounds its machines.
func (s *site) run(ctx context.Context) error {
	defer s.jrnl.Close()    //nolint:errcheck
	defer s.httpSrv.Close() //nolint:errcheck
	defer s.served.Close()  //nolint:errcheck
	defer func() {
		for _, c := range s.agentConns {
			c.Close() //nolint:errcheck
		}
	}()

	eg, ctx := errgroup.WithContext(ctx)

	eg.Go(func() error { return s.link.Run(ctx) })
	eg.Go(func() error { return s.tunnels.Serve(ctx, s.tunnelLn) })
	eg.Go(func() error { return s.fetcher.Run(ctx) })

	if s.bmcs.watcher != nil {
		eg.Go(func() error { return s.bmcs.watcher.run(ctx) })
	}

	err := eg.Wait()

	for _, m := range s.machines {
		m.powerOff()
	}

	return err
}

// reportInventory is edge/app's: what the edge holds at the start of a session.
func (s *site) reportInventory(ctx context.Context, events bootpb.EventsClient) {
	req := &bootpb.InventoryRequest{Tunnels: s.tunnels.Open(), Table: s.table.UUIDs(), TableVersion: s.table.Version()}

	if _, err := events.Inventory(ctx, req); err != nil {
		s.log.Warn("inventory not taken by the controller", zap.Error(err))
	}
}

// get asks the edge's HTTP server for path as machine m would, from its address.
func (s *site) get(m *machine, path string) (int, []byte) {
	req := httptest.NewRequest(http.MethodGet, "http://edge.site.internal"+path, nil)
	req.RemoteAddr = netip.AddrPortFrom(m.ip, 4000).String()

	rec := httptest.NewRecorder()
	s.httpSrv.Handler().ServeHTTP(rec, req)

	return rec.Code, rec.Body.Bytes()
}

// bootScript asks boot.ipxe as iPXE does and returns the mode the edge served.
func (s *site) bootScript(m *machine) (string, error) {
	q := url.Values{"uuid": {m.id}, "mac": {m.mac.String()}, "arch": {"x86_64"}, "platform": {"efi"}}

	s.modes.Delete(m.id)

	code, _ := s.get(m, "/ipxe/boot.ipxe?"+q.Encode())

	mode, ok := s.modes.LoadAndDelete(m.id)
	if !ok {
		return "", fmt.Errorf("boot.ipxe answered %d and reported nothing", code)
	}

	return mode.(string), nil // only modes are stored
}

// provision joins the machine to Omni as the agent image does at boot: the join config from the edge's /config,
// then SideroLink Provision at its API URL with the join token, a WireGuard key and a JSON node-unique token.
func (s *site) provision(ctx context.Context, m *machine) error {
	code, body := s.get(m, "/config?u="+m.id)
	if code != http.StatusOK {
		return fmt.Errorf("join config from the edge: HTTP %d", code)
	}

	api, err := siderolinkAPI(body)
	if err != nil {
		return err
	}

	conn, err := s.fleet.omniConn(api.Host)
	if err != nil {
		return err
	}

	key, err := wgtypes.GeneratePrivateKey()
	if err != nil {
		return err
	}

	token := api.Query().Get("jointoken")
	unique := `{"Fingerprint":"fp-` + m.id + `","Token":"tok-` + m.id + `"}`
	talos := "v1.11.5"

	cctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()

	if _, err = pb.NewProvisionServiceClient(conn).Provision(cctx, &pb.ProvisionRequest{
		NodeUuid: m.id, NodePublicKey: key.PublicKey().String(), JoinToken: &token, NodeUniqueToken: &unique, TalosVersion: &talos,
	}); err != nil {
		return fmt.Errorf("provision %s: %w", m.id, err)
	}

	return nil
}

// siderolinkAPI finds the SideroLinkConfig apiUrl in the Talos documents of a join config.
func siderolinkAPI(doc []byte) (*url.URL, error) {
	sc := bufio.NewScanner(bytes.NewReader(doc))
	for sc.Scan() {
		if v, ok := strings.CutPrefix(strings.TrimSpace(sc.Text()), "apiUrl:"); ok {
			u, err := url.Parse(strings.Trim(strings.TrimSpace(v), `"'`))
			if err != nil {
				return nil, fmt.Errorf("siderolink apiUrl: %w", err)
			}

			return u, nil
		}
	}

	return nil, errors.New("join config has no SideroLinkConfig apiUrl")
}

// bootObserver journals boot-script answers (as edge/app's does), notes where each machine asked from and tells
// the simulated machine what it was served.
type bootObserver struct{ s *site }

func (o bootObserver) BootServed(b httpd.BootServed) {
	o.s.book.Note(b.UUID, b.Remote, b.MAC)
	o.s.recorder.BootServed(b)
	o.s.modes.Store(metal.NormalizeID(b.UUID), b.Mode)
}

func (o bootObserver) HTTPFetch(f bootfiles.Fetch) { o.s.recorder.HTTPFetch(f) }

// tunnelEvents journals agent tunnels opening and closing (edge/app's).
type tunnelEvents struct{ rec *journal.Recorder }

func (t tunnelEvents) TunnelOpened(e tunnel.Event) { t.record(e, true) }
func (t tunnelEvents) TunnelClosed(e tunnel.Event) { t.record(e, false) }

func (t tunnelEvents) record(e tunnel.Event, open bool) {
	ev := &bootpb.AgentTunnel{MachineId: e.MachineID, Open: open, AddressMismatch: e.AddressMismatch}

	if e.RemoteAddr.IsValid() {
		ev.RemoteIp = e.RemoteAddr.Addr().String()
	}

	if e.SeenAddr.IsValid() {
		ev.SeenIp = e.SeenAddr.String()
	}

	t.rec.Record(&bootpb.Event{Kind: &bootpb.Event_AgentTunnel{AgentTunnel: ev}})
}

// noUpstream is the asset fetcher's upstream: the simulator has no image factory (and no network to reach one).
type noUpstream struct{}

func (noUpstream) Name() string { return "http" }

func (noUpstream) Open(context.Context, assetcache.Ref, int64) (io.ReadCloser, error) {
	return nil, errors.New("no upstream in the fleet simulator")
}

// wan is a site's WAN link: the uplink's dialer, from the site's own address, which the benchmark can cut.
type wan struct {
	ip netip.Addr

	mu    sync.Mutex
	down  bool
	conns map[net.Conn]struct{}
}

var errWANDown = errors.New("site WAN link is down")

func (w *wan) dial(ctx context.Context, address string) (net.Conn, error) {
	w.mu.Lock()
	down := w.down
	w.mu.Unlock()

	if down {
		return nil, errWANDown
	}

	d := &net.Dialer{LocalAddr: &net.TCPAddr{IP: w.ip.AsSlice()}, KeepAlive: 15 * time.Second}

	c, err := d.DialContext(ctx, "tcp", address)
	if err != nil {
		return nil, err
	}

	tc := &wanConn{Conn: c, w: w}

	w.mu.Lock()
	defer w.mu.Unlock()

	if w.down {
		c.Close() //nolint:errcheck

		return nil, errWANDown
	}

	w.conns[tc] = struct{}{}

	return tc, nil
}

func (w *wan) isDown() bool {
	w.mu.Lock()
	defer w.mu.Unlock()

	return w.down
}

// flap cuts the link every period for half of it until ctx ends (leaving it up) and says how many times.
func (w *wan) flap(ctx context.Context, period time.Duration) int {
	t := time.NewTicker(period / 2)
	defer t.Stop()

	defer w.setDown(false)

	cuts := 0

	for {
		select {
		case <-ctx.Done():
			return cuts
		case <-t.C:
		}

		down := !w.isDown()
		if down {
			cuts++
		}

		w.setDown(down)
	}
}

// setDown cuts the link (closing its connections) or restores it.
func (w *wan) setDown(down bool) {
	w.mu.Lock()
	defer w.mu.Unlock()

	w.down = down

	if down {
		for c := range w.conns {
			c.(*wanConn).Conn.Close() //nolint:errcheck // only wanConns are kept
		}

		w.conns = map[net.Conn]struct{}{}
	}
}

type wanConn struct {
	net.Conn

	w *wan
}

func (c *wanConn) Close() error {
	c.w.mu.Lock()
	delete(c.w.conns, c)
	c.w.mu.Unlock()

	return c.Conn.Close()
}

// siteID names site i.
func siteID(i int) string { return fmt.Sprintf("site-%04d", i) }

// siteAddr is site i's loopback address (127.10.0.0/16 and up), its uplink's and its machines' source.
func siteAddr(i int) netip.Addr {
	return netip.AddrFrom4([4]byte{127, byte(10 + i>>16), byte(i >> 8), byte(i)}) // bounded by Validate
}

// machineAddr is machine i's own loopback address (127.128.0.0/9), the source of its agent's connection.
func machineAddr(i int) netip.Addr {
	return netip.AddrFrom4([4]byte{127, byte(128 + i>>16), byte(i >> 8), byte(i)}) // bounded by Validate
}

// bmcAddr is machine i's BMC address (127.64.0.0/10: never dialled, the simulated BMC service answers for it).
func bmcAddr(i int) string {
	return netip.AddrFrom4([4]byte{127, byte(64 + i>>16), byte(i >> 8), byte(i)}).String() // bounded by Validate
}

// machineID is machine i's SMBIOS UUID.
func machineID(i int) string { return fmt.Sprintf("f1ee7000-0000-4000-8000-%012x", i) }

// machineMAC is machine i's MAC (locally administered).
func machineMAC(i int) net.HardwareAddr {
	return net.HardwareAddr{0x02, 0xf1, 0xee, byte(i >> 16), byte(i >> 8), byte(i)} // bounded by Validate
}
