// Package linklab runs a controller's uplink server and edges' uplink clients in one process on loopback,
// for tests of anything that crosses the uplink. It is test tooling: nothing in the product imports it.
package linklab

import (
	"context"
	"crypto/rand"
	"errors"
	"net"
	"sync"
	"testing"
	"time"

	"github.com/cosi-project/runtime/pkg/state"
	"github.com/cosi-project/runtime/pkg/state/impl/inmem"
	"github.com/cosi-project/runtime/pkg/state/impl/namespaced"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/require"
	"go.uber.org/zap"
	"go.uber.org/zap/zaptest"
	"google.golang.org/grpc"

	"github.com/outpost-metal/outpost/controller/resources"
	"github.com/outpost-metal/outpost/controller/sites"
	edgeuplink "github.com/outpost-metal/outpost/edge/uplink"
)

// ControllerOptions customise StartController.
type ControllerOptions struct {
	Logger        *zap.Logger
	Register      []func(grpc.ServiceRegistrar)
	ServerOptions []grpc.ServerOption
	OnSession     []sites.SessionFunc
	Now           func() time.Time
	CertValidity  time.Duration
	// Limits are the uplink server's limits; zero fields mean their defaults.
	Limits sites.Limits
	// Listener is used instead of a new 127.0.0.1:0 listener.
	Listener net.Listener
	// State and CA are used instead of new ones (a restarted controller keeps both).
	State state.State
	CA    *sites.CA
	// Version is the release the controller holds edges to (empty: the build's own).
	Version string
}

// Controller is a running uplink server with its registry.
type Controller struct {
	Server   *sites.Server
	Registry *sites.Registry
	Admin    *sites.Admin
	CA       *sites.CA
	State    state.State
	Metrics  *prometheus.Registry
	Addr     string

	cancel context.CancelFunc
	done   chan error
}

// NewState returns in-memory namespaced COSI state with the controller's resources registered.
func NewState(t testing.TB) state.State {
	t.Helper()
	require.NoError(t, resources.Register())

	return state.WrapCore(namespaced.NewState(inmem.Build))
}

// StartController starts an uplink server on loopback; it stops when the test ends.
func StartController(t testing.TB, opts ControllerOptions) *Controller {
	t.Helper()

	if opts.Logger == nil {
		opts.Logger = zaptest.NewLogger(t)
	}

	if opts.Now == nil {
		opts.Now = time.Now
	}

	st := opts.State
	if st == nil {
		st = NewState(t)
	}

	ca := opts.CA
	if ca == nil {
		var err error

		ca, _, _, err = sites.NewCA(opts.Now())
		require.NoError(t, err)
	}

	registry := sites.NewRegistry(st, ca, rand.Reader, opts.Now)
	metrics := prometheus.NewRegistry()

	srv, err := sites.NewServer(sites.Options{
		Logger:        opts.Logger,
		Registry:      registry,
		CA:            ca,
		Statuses:      st,
		Metrics:       metrics,
		Now:           opts.Now,
		Register:      opts.Register,
		ServerOptions: opts.ServerOptions,
		OnSession:     opts.OnSession,
		CertValidity:  opts.CertValidity,
		Limits:        opts.Limits,
		Version:       opts.Version,
	})
	require.NoError(t, err)

	ln := opts.Listener
	if ln == nil {
		ln, err = net.Listen("tcp", "127.0.0.1:0")
		require.NoError(t, err)
	}

	ctx, cancel := context.WithCancel(context.Background())
	c := &Controller{
		Server: srv, Registry: registry, Admin: sites.NewAdmin(registry, srv, st, nil), CA: ca, State: st,
		Metrics: metrics, Addr: ln.Addr().String(), cancel: cancel, done: make(chan error, 1),
	}

	go func() { c.done <- srv.Serve(ctx, ln) }()

	t.Cleanup(c.Stop)

	return c
}

// Stop stops the server and waits for every session to end. It is safe to call twice.
func (c *Controller) Stop() {
	c.cancel()

	if err, ok := <-c.done; ok {
		close(c.done)

		if err != nil {
			panic(err)
		}
	}
}

// Restart stops the controller and starts a new one on the same address with the same state and CA, as a
// restarted controller process would come back; opts gives the new one's services (its in-memory parts
// start afresh). down runs while no controller listens.
func (c *Controller) Restart(t testing.TB, opts ControllerOptions, down func()) *Controller {
	t.Helper()

	c.Stop()

	if down != nil {
		down()
	}

	ln, err := net.Listen("tcp", c.Addr)
	require.NoError(t, err, "listen again on the controller's address")

	opts.Listener, opts.State, opts.CA = ln, c.State, c.CA

	return StartController(t, opts)
}

// CreateSite creates a site and returns its join token.
func (c *Controller) CreateSite(t testing.TB, siteID string, opts sites.TokenOptions) string {
	t.Helper()

	tok, _, err := c.Registry.Create(context.Background(), siteID, "test site "+siteID, opts)
	require.NoError(t, err)

	return tok.String()
}

// WaitConnected waits until the site has a session.
func (c *Controller) WaitConnected(t testing.TB, siteID string) grpc.ClientConnInterface {
	t.Helper()

	return c.WaitConnectedWithin(t, siteID, 10*time.Second)
}

// WaitConnectedWithin is WaitConnected with its own bound.
func (c *Controller) WaitConnectedWithin(t testing.TB, siteID string, within time.Duration) grpc.ClientConnInterface {
	t.Helper()

	var conn grpc.ClientConnInterface

	require.Eventually(t, func() bool {
		var err error

		conn, err = c.Server.Conn(siteID)

		return err == nil
	}, within, 5*time.Millisecond, "site %s never connected", siteID)

	return conn
}

// DialFrom returns an edge dialer whose connections leave from the loopback address ip (on Linux every
// 127.0.0.0/8 address is the loopback without configuration), so that tests can give edges and attackers
// the distinct sources the controller's per-source limits tell apart.
func DialFrom(ip string) func(ctx context.Context, address string) (net.Conn, error) {
	d := &net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(ip)}}

	return func(ctx context.Context, address string) (net.Conn, error) {
		return d.DialContext(ctx, "tcp", address)
	}
}

// Edge is a running edge uplink client.
type Edge struct {
	Client   *edgeuplink.Client
	StateDir string

	cancel context.CancelFunc
	done   chan error
	once   sync.Once
	err    error
}

// EdgeOptions customise StartEdge.
type EdgeOptions struct {
	Options  edgeuplink.Options
	StateDir string
	// Configure adjusts the uplink configuration before the client is built.
	Configure func(*edgeuplink.Config)
}

// StartEdge starts an edge uplink client dialling addr; it stops when the test ends.
func StartEdge(t testing.TB, addr, token string, opts EdgeOptions) *Edge {
	t.Helper()

	if opts.StateDir == "" {
		opts.StateDir = t.TempDir()
	}

	if opts.Options.Logger == nil {
		opts.Options.Logger = zaptest.NewLogger(t)
	}

	cfg := edgeuplink.Default()
	cfg.ControllerAddress = addr
	cfg.StateDir = opts.StateDir
	cfg.JoinToken = token
	cfg.BackoffMin = 20 * time.Millisecond
	cfg.BackoffMax = 200 * time.Millisecond

	if opts.Configure != nil {
		opts.Configure(&cfg)
	}

	client, err := edgeuplink.New(cfg, opts.Options)
	require.NoError(t, err)

	ctx, cancel := context.WithCancel(context.Background())
	e := &Edge{Client: client, StateDir: opts.StateDir, cancel: cancel, done: make(chan error, 1)}

	go func() { e.done <- client.Run(ctx) }()

	t.Cleanup(func() { e.Stop() }) //nolint:errcheck

	return e
}

// Stop stops the client and returns what Run returned.
func (e *Edge) Stop() error {
	e.cancel()
	e.once.Do(func() { e.err = <-e.done })

	return e.err
}

// Wait waits for Run to return by itself (a permanent error) and returns its error.
func (e *Edge) Wait(t testing.TB, timeout time.Duration) error {
	t.Helper()

	select {
	case err := <-e.done:
		e.once.Do(func() { e.err = err })

		return err
	case <-time.After(timeout):
		t.Fatalf("edge uplink did not stop within %s", timeout)

		return errors.New("unreachable")
	}
}

// Proxy is a TCP proxy on loopback whose connections a test can cut, like a WAN link failing.
type Proxy struct {
	Addr string

	ln     net.Listener
	target string
	mu     sync.Mutex
	conns  map[net.Conn]struct{}
	down   bool
	hole   bool
	wg     sync.WaitGroup
}

// StartProxy forwards a new loopback port to target until the test ends.
func StartProxy(t testing.TB, target string) *Proxy {
	t.Helper()

	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)

	p := &Proxy{Addr: ln.Addr().String(), ln: ln, target: target, conns: map[net.Conn]struct{}{}}

	p.wg.Go(p.accept)

	t.Cleanup(func() {
		ln.Close() //nolint:errcheck
		p.Cut()
		p.wg.Wait()
	})

	return p
}

func (p *Proxy) accept() {
	for {
		in, err := p.ln.Accept()
		if err != nil {
			return
		}

		p.mu.Lock()
		down, hole := p.down, p.hole
		if hole {
			// Held open, never answered, until the next Cut.
			p.conns[in] = struct{}{}
		}
		p.mu.Unlock()

		if down {
			in.Close() //nolint:errcheck

			continue
		}

		if hole {
			continue
		}

		out, err := net.Dial("tcp", p.target)
		if err != nil {
			in.Close() //nolint:errcheck

			continue
		}

		p.track(in, out)

		p.wg.Go(func() { pipe(in, out) })
		p.wg.Go(func() { pipe(out, in) })
	}
}

func (p *Proxy) track(conns ...net.Conn) {
	p.mu.Lock()
	defer p.mu.Unlock()

	for _, c := range conns {
		p.conns[c] = struct{}{}
	}
}

func pipe(dst, src net.Conn) {
	buf := make([]byte, 64<<10)

	for {
		n, err := src.Read(buf)
		if n > 0 {
			if _, werr := dst.Write(buf[:n]); werr != nil {
				break
			}
		}

		if err != nil {
			break
		}
	}

	dst.Close() //nolint:errcheck
	src.Close() //nolint:errcheck
}

// Cut closes every connection through the proxy (new ones still pass unless SetDown).
func (p *Proxy) Cut() {
	p.mu.Lock()
	defer p.mu.Unlock()

	for c := range p.conns {
		c.Close() //nolint:errcheck
	}

	p.conns = map[net.Conn]struct{}{}
}

// SetBlackhole makes the proxy accept new connections and never forward a byte of them (hole=true), as a
// network that drops everything looks to a client: its dials succeed and then hear nothing. Cut closes them.
func (p *Proxy) SetBlackhole(hole bool) {
	p.mu.Lock()
	p.hole = hole
	p.mu.Unlock()
}

// SetDown makes the proxy refuse new connections (down=true) or pass them again.
func (p *Proxy) SetDown(down bool) {
	p.mu.Lock()
	p.down = down
	p.mu.Unlock()
}
