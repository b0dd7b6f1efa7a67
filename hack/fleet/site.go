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

	"github.com/outpost-metal/outpost/edge/app"
	"github.com/outpost-metal/outpost/edge/assetcache"
	"github.com/outpost-metal/outpost/edge/bmc"
	"github.com/outpost-metal/outpost/edge/bootfiles"
	"github.com/outpost-metal/outpost/edge/config"
	"github.com/outpost-metal/outpost/edge/dhcp"
	"github.com/outpost-metal/outpost/edge/httpd"
	"github.com/outpost-metal/outpost/edge/tunnel"
	"github.com/outpost-metal/outpost/shared/metal"
)

// site is one simulated site: a real edge built by edge/app (uplink client, boot table, journal, HTTP server
// called in process, agent tunnel endpoint and proxy, intents, asset cache) whose site network is simulated: no
// DHCP or TFTP, its machines and their BMCs.
type site struct {
	fleet *fleet
	id    string
	index int
	ip    netip.Addr // the site's own loopback address: its uplink's source, its machines' address
	log   *zap.Logger

	ctx context.Context // the site's run context, which its machines' power-ons derive from

	edge *app.Edge
	// http is the edge's HTTP handler, which machines are answered by in process.
	http http.Handler
	// agentConns carry the site's agents in "site" mode, agentsPerConn each.
	agentConns []*grpc.ClientConn
	bmcs       *BMCService
	wan        *wan

	machines []*machine
	modes    sync.Map // machine ID -> boot mode last served (from the tap)
}

func newSite(f *fleet, index int, token string) (*site, error) {
	id := siteID(index)
	log := f.edgeLog.With(zap.String("site", id))
	ip := siteAddr(index)

	s := &site{fleet: f, id: id, index: index, ip: ip, log: log, wan: &wan{ip: ip, conns: map[net.Conn]struct{}{}}}

	cfg := config.Default()
	cfg.StateDir = filepath.Join(f.cfg.WorkDir, "sites", id)
	cfg.IPXEDir = f.ipxeDir
	cfg.HTTP.Listen = "127.0.0.1:0" // not dialled: machines are answered in process
	cfg.APIListen = "127.0.0.1:0"
	cfg.TFTP.Listen = ""
	cfg.Uplink.ControllerAddress = f.uplinkAddr
	cfg.Uplink.JoinToken = token

	// agents on their own connection come from their machine's address and are bound to its boot evidence as
	// on a real edge; all of a site's agents on one connection cannot be (one address), so they are taken as given
	if f.cfg.AgentConns == "site" {
		cfg.AgentBinding = tunnel.BindOff
		cfg.Tunnels.MaxTunnelsPerConn = max(cfg.Tunnels.MaxTunnelsPerConn, 2*f.cfg.MachinesPerSite)
		cfg.Tunnels.MaxTunnelsPerSource = max(cfg.Tunnels.MaxTunnelsPerSource, 2*f.cfg.MachinesPerSite)
		cfg.Tunnels.MaxTunnels = max(cfg.Tunnels.MaxTunnels, cfg.Tunnels.MaxTunnelsPerSource)
	}

	s.bmcs = newBMCService(bmc.Default(), &f.cfg.BMC, uint64(index)+1) // index is small

	var err error

	if s.edge, err = app.Build(context.Background(), cfg, log, app.Options{
		WrapHTTP: func(h http.Handler) http.Handler { s.http = h; return h },
		Tap:      bootTap{s},
		FilesDir: f.filesDir,
		BMCs:     s.bmcs,
		Upstream: noUpstream{},
		Dial:     s.wan.dial,
	}); err != nil {
		return nil, fmt.Errorf("edge of %s: %w", id, err)
	}

	if f.cfg.WatchBMCs {
		s.bmcs.watcher = newEdgeWatch(s.bmcs, s.edge.Journal(), bmc.DefaultWatcher())
	}

	if f.cfg.AgentConns == "site" {
		for range (f.cfg.MachinesPerSite + agentsPerConn - 1) / agentsPerConn {
			conn, err := s.dialAgent(ip)
			if err != nil {
				return nil, errors.Join(err, s.edge.Close())
			}

			s.agentConns = append(s.agentConns, conn)
		}
	}

	return s, nil
}

// dialAgent returns a connection to the site's agent tunnel endpoint from address ip (connecting lazily).
func (s *site) dialAgent(ip netip.Addr) (*grpc.ClientConn, error) {
	dialer := &net.Dialer{LocalAddr: &net.TCPAddr{IP: ip.AsSlice()}}

	conn, err := grpc.NewClient("passthrough:///"+s.edge.Addrs().API.String(),
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
	defer func() {
		for _, c := range s.agentConns {
			c.Close() //nolint:errcheck
		}
	}()

	eg, ctx := errgroup.WithContext(ctx)

	eg.Go(func() error { return s.edge.Run(ctx) })

	if s.bmcs.watcher != nil {
		eg.Go(func() error { return s.bmcs.watcher.run(ctx) })
	}

	err := eg.Wait()

	for _, m := range s.machines {
		m.powerOff()
	}

	return err
}

// get asks the edge's HTTP server for path as machine m would, from its address.
func (s *site) get(m *machine, path string) (int, []byte) {
	req := httptest.NewRequest(http.MethodGet, "http://edge.site.internal"+path, nil)
	req.RemoteAddr = netip.AddrPortFrom(m.ip, 4000).String()

	rec := httptest.NewRecorder()
	s.http.ServeHTTP(rec, req)

	return rec.Code, rec.Body.Bytes()
}

// bootScript asks boot.ipxe as iPXE does and returns the mode the edge served.
func (s *site) bootScript(m *machine) (httpd.Mode, error) {
	q := url.Values{"uuid": {m.id}, "mac": {m.mac.String()}, "arch": {"x86_64"}, "platform": {"efi"}}

	s.modes.Delete(m.id)

	code, _ := s.get(m, "/ipxe/boot.ipxe?"+q.Encode())

	mode, ok := s.modes.LoadAndDelete(m.id)
	if !ok {
		return "", fmt.Errorf("boot.ipxe answered %d and reported nothing", code)
	}

	return mode.(httpd.Mode), nil // only modes are stored
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

// bootTap tells the simulated machine what the edge served it (the edge journals it).
type bootTap struct{ s *site }

func (t bootTap) BootServed(b httpd.BootServed) {
	t.s.modes.Store(metal.NormalizeID(b.UUID.String()), b.Mode)
}

func (bootTap) DHCPSeen(dhcp.Seen) {}

func (bootTap) TFTPFetch(bootfiles.Fetch) {}

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
