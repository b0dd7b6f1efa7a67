package tftp

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/netip"
	"sync/atomic"
	"time"

	"github.com/pin/tftp/v3"
	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/zap"
)

// Config configures the TFTP server.
type Config struct {
	// Listen is the UDP address to serve (default ":69").
	Listen string `json:"listen"`
	// Dir is where the iPXE binaries are read from at start-up.
	Dir string `json:"dir"`
	// BlockSize is the largest blksize granted (RFC 2348); the library clamps it further to the
	// interface MTU minus 28 bytes. 1468 fits a 1500-byte MTU.
	BlockSize int `json:"block_size"`
	// Timeout is the retransmission timeout; Retries the attempts per packet.
	Timeout time.Duration `json:"timeout"`
	Retries int           `json:"retries"`
}

// Default returns the production defaults.
func Default() Config {
	return Config{Listen: ":69", Dir: DefaultDir, BlockSize: 1468, Timeout: 2 * time.Second, Retries: 5}
}

// Validate checks the configuration.
func (c Config) Validate() error {
	var errs []error

	if c.Listen == "" {
		errs = append(errs, errors.New("listen is required"))
	}

	if c.Dir == "" {
		errs = append(errs, errors.New("dir is required"))
	}

	if c.BlockSize < 512 || c.BlockSize > 65464 {
		errs = append(errs, fmt.Errorf("block_size %d outside 512..65464", c.BlockSize))
	}

	if c.Timeout <= 0 || c.Retries <= 0 {
		errs = append(errs, errors.New("timeout and retries must be positive"))
	}

	return errors.Join(errs...)
}

// Fetch describes a completed or refused transfer, for the event journal ("PXE seen").
type Fetch struct {
	Name   string
	Remote netip.Addr
	// Err is nil for a completed transfer.
	Err error
}

// Observer is told about transfers.
type Observer interface {
	TFTPFetch(Fetch)
}

// Deps are the server's optional collaborators.
type Deps struct {
	Registerer prometheus.Registerer
	Observer   Observer
}

// Server is the read-only TFTP server.
type Server struct {
	cfg     Config
	log     *zap.Logger
	catalog *Catalog
	deps    Deps

	requests  *prometheus.CounterVec
	transfers *prometheus.CounterVec

	nServed, nRefused atomic.Int64
}

// New builds the server over a catalog (see LoadCatalog).
func New(cfg Config, logger *zap.Logger, catalog *Catalog, deps Deps) (*Server, error) {
	if err := cfg.Validate(); err != nil {
		return nil, fmt.Errorf("tftp config: %w", err)
	}

	if deps.Registerer == nil {
		deps.Registerer = prometheus.NewRegistry()
	}

	s := &Server{
		cfg: cfg, log: logger.With(zap.String("component", "tftp")), catalog: catalog, deps: deps,
		requests: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "outpost_tftp_requests_total", Help: "TFTP read requests, by result (served, not_found, bad_name, write_refused).",
		}, []string{"result"}),
		transfers: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "outpost_tftp_transfers_total", Help: "TFTP transfers finished, by outcome (ok, failed).",
		}, []string{"outcome"}),
	}

	for _, c := range []prometheus.Collector{s.requests, s.transfers} {
		if err := deps.Registerer.Register(c); err != nil {
			return nil, fmt.Errorf("register tftp metrics: %w", err)
		}
	}

	s.log.Info("tftp ready", zap.Strings("files", catalog.Names()), zap.Int("block_size", cfg.BlockSize))

	return s, nil
}

// Counters returns named counts for the edge status RPC.
func (s *Server) Counters() map[string]int64 {
	return map[string]int64{"tftp_served": s.nServed.Load(), "tftp_refused": s.nRefused.Load()}
}

// Run listens on cfg.Listen and serves until ctx ends.
func (s *Server) Run(ctx context.Context) error {
	var lc net.ListenConfig

	conn, err := lc.ListenPacket(ctx, "udp4", s.cfg.Listen)
	if err != nil {
		return fmt.Errorf("listen tftp on %s: %w", s.cfg.Listen, err)
	}

	return s.Serve(ctx, conn)
}

// Serve answers read requests on conn until ctx ends, then waits for running transfers to finish
// (bounded by the retransmission timeout). The library takes ownership of conn and closes it.
func (s *Server) Serve(ctx context.Context, conn net.PacketConn) error {
	srv := tftp.NewServer(s.read, s.write)
	srv.SetBlockSize(s.cfg.BlockSize)
	srv.SetTimeout(s.cfg.Timeout)
	srv.SetRetries(s.cfg.Retries)
	srv.SetHook(hook{s})

	errc := make(chan error, 1)

	go func() { errc <- srv.Serve(conn) }()

	select {
	case err := <-errc:
		if err != nil {
			return fmt.Errorf("serve tftp: %w", err)
		}

		return nil
	case <-ctx.Done():
		srv.Shutdown()

		if err := <-errc; err != nil {
			return fmt.Errorf("serve tftp: %w", err)
		}

		return nil
	}
}

func remoteOf(rf any) netip.Addr {
	if ot, ok := rf.(tftp.OutgoingTransfer); ok {
		a := ot.RemoteAddr()

		return a.AddrPort().Addr().Unmap()
	}

	return netip.Addr{}
}

func (s *Server) read(name string, rf io.ReaderFrom) error {
	remote := remoteOf(rf)

	f, err := s.catalog.Lookup(name)
	if err != nil {
		result := "not_found"
		if errors.Is(err, ErrBadName) {
			result = "bad_name"
		}

		s.requests.WithLabelValues(result).Inc()
		s.nRefused.Add(1)
		s.log.Debug("tftp request refused", zap.String("name", name), zap.Stringer("remote", remote), zap.Error(err))

		if s.deps.Observer != nil {
			s.deps.Observer.TFTPFetch(Fetch{Name: name, Remote: remote, Err: err})
		}

		return err
	}

	s.requests.WithLabelValues("served").Inc()

	if ot, ok := rf.(tftp.OutgoingTransfer); ok {
		ot.SetSize(int64(len(f.Data)))
	}

	if _, err := rf.ReadFrom(f.Reader()); err != nil {
		// EDK2 asks for tsize and aborts before downloading: normal, logged at debug only.
		s.log.Debug("tftp transfer ended early", zap.String("name", f.Name), zap.Stringer("remote", remote), zap.Error(err))

		return fmt.Errorf("send %s: %w", f.Name, err)
	}

	s.nServed.Add(1)

	if s.deps.Observer != nil {
		s.deps.Observer.TFTPFetch(Fetch{Name: f.Name, Remote: remote})
	}

	return nil
}

func (s *Server) write(name string, _ io.WriterTo) error {
	s.requests.WithLabelValues("write_refused").Inc()
	s.nRefused.Add(1)

	return fmt.Errorf("write %q: server is read-only", name)
}

type hook struct{ s *Server }

func (h hook) OnSuccess(tftp.TransferStats) { h.s.transfers.WithLabelValues("ok").Inc() }

func (h hook) OnFailure(_ tftp.TransferStats, _ error) { h.s.transfers.WithLabelValues("failed").Inc() }
