package uplink

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"time"

	"github.com/hashicorp/yamux"
	"go.uber.org/zap"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
)

// Keepalive settings: yamux pings every KeepAliveInterval and drops the session when a ping or a write
// is not answered within WriteTimeout, so a dead WAN link is noticed within about 30 seconds.
const (
	KeepAliveInterval = 10 * time.Second
	WriteTimeout      = 15 * time.Second
)

// YamuxConfig returns the yamux configuration both ends use.
func YamuxConfig(logger *zap.Logger) *yamux.Config {
	cfg := yamux.DefaultConfig()
	cfg.EnableKeepAlive = true
	cfg.KeepAliveInterval = KeepAliveInterval
	cfg.ConnectionWriteTimeout = WriteTimeout
	// Large windows keep bulk transfers (asset relay) fast on long links; gRPC adds its own flow control on top.
	cfg.MaxStreamWindowSize = 4 << 20
	cfg.LogOutput = nil
	cfg.Logger = zap.NewStdLog(logger.With(zap.String("component", "yamux")))

	return cfg
}

// Peer is one end of an established uplink session. It serves gRPC on the streams the other end opens
// and reaches the other end's gRPC services through Conn.
type Peer struct {
	session *yamux.Session
	conn    *grpc.ClientConn
}

// NewPeer wraps an established yamux session. The client connection it creates opens one yamux stream
// per HTTP/2 connection and never dials anything else.
func NewPeer(session *yamux.Session, opts ...grpc.DialOption) (*Peer, error) {
	dialer := func(context.Context, string) (net.Conn, error) {
		stream, err := session.Open()
		if err != nil {
			return nil, fmt.Errorf("open uplink stream: %w", err)
		}

		return stream, nil
	}

	opts = append([]grpc.DialOption{
		grpc.WithTransportCredentials(insecure.NewCredentials()), // the session is already inside mutual TLS
		grpc.WithContextDialer(dialer),
	}, opts...)

	// passthrough: the target is not a name to resolve; every connection goes through the dialer above.
	conn, err := grpc.NewClient("passthrough:///uplink", opts...)
	if err != nil {
		return nil, fmt.Errorf("create uplink client: %w", err)
	}

	return &Peer{session: session, conn: conn}, nil
}

// Conn reaches the other end's gRPC services.
func (p *Peer) Conn() *grpc.ClientConn { return p.conn }

// Done is closed when the session ends.
func (p *Peer) Done() <-chan struct{} { return p.session.CloseChan() }

// RemoteAddr is the address of the other end.
func (p *Peer) RemoteAddr() net.Addr { return p.session.RemoteAddr() }

// Serve serves srv on the streams the other end opens until the session ends or ctx is done,
// then stops srv and closes the session. It returns nil when the session simply ended.
func (p *Peer) Serve(ctx context.Context, srv *grpc.Server) error {
	served := make(chan error, 1)

	go func() { served <- srv.Serve(p.session) }()

	select {
	case <-ctx.Done():
	case <-p.session.CloseChan():
	case err := <-served:
		served <- err // put it back for the common exit path below
	}

	p.Close()
	srv.Stop()

	if err := <-served; err != nil && !isClosed(err) {
		return fmt.Errorf("serve uplink session: %w", err)
	}

	return nil
}

// Close ends the session and the client connection.
func (p *Peer) Close() {
	p.conn.Close()    //nolint:errcheck // closing; nothing to do about an error
	p.session.Close() //nolint:errcheck
}

func isClosed(err error) bool {
	return errors.Is(err, yamux.ErrSessionShutdown) || errors.Is(err, io.EOF) ||
		errors.Is(err, net.ErrClosed) || errors.Is(err, grpc.ErrServerStopped)
}
