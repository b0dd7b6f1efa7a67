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

// Flow-control windows. A sender has at most a window in flight, so one stream moves at most window/RTT, and
// less in practice: yamux grants a window back only once half of it has been read, gRPC once a quarter has.
// The former 4 MiB yamux window held an asset relay to 18 MB/s at 100 ms and 9 MB/s at 200 ms. These are
// sized to the bandwidth-delay product of a long WAN instead: measured with `make bench-wan`, 128 MiB each
// carries about 250 MB/s at 200 ms, as much as the relay moves at all on two cores (64 MiB each: 150 MB/s).
//
// Memory is at most window times streams, and a window fills only while its reader lags behind:
//   - yamux buffers up to StreamWindow per stream. A session has two, one gRPC connection each way (a third
//     for a moment while gRPC reconnects): at most 256 MiB per site at either end. gRPC's transport reads its
//     stream as data arrives and closes a connection whose peer overruns gRPC's own windows, so outside a
//     stall these buffers hold little, and a site cannot make the controller hold more than gRPC allows.
//   - the edge's client connection (RelayDialOptions) buffers up to BulkCallWindow per call its caller has not
//     read yet; its connection window (BulkConnWindow) is granted back as data arrives and bounds what is in
//     flight, not memory. The edge's asset fetcher runs two downloads at once: at most 256 MiB more at the
//     edge, 512 MiB with yamux's, should its disk stall while the controller keeps sending.
//   - the controller's gRPC connections and both ends' servers keep gRPC's defaults (windows grown by its
//     bandwidth estimate, to 16 MiB at most): nothing large flows from edges to the controller.
const (
	// StreamWindow is yamux's receive window per stream (MaxStreamWindowSize). Every gRPC connection over a
	// session is one yamux stream, so it bounds all of that connection's calls in flight together.
	StreamWindow = 128 << 20
	// BulkCallWindow is the HTTP/2 receive window of one call on the edge's client connection (RFC 9113
	// section 6.9.2, SETTINGS_INITIAL_WINDOW_SIZE): one relayed asset in flight.
	BulkCallWindow = 128 << 20
	// BulkConnWindow is the HTTP/2 receive window of the edge's whole client connection (RFC 9113 section
	// 6.9): the calls in flight together; like yamux's, since yamux's stream carries the whole connection.
	BulkConnWindow = StreamWindow
)

// YamuxConfig returns the yamux configuration both ends use.
func YamuxConfig(logger *zap.Logger) *yamux.Config {
	cfg := yamux.DefaultConfig()
	cfg.EnableKeepAlive = true
	cfg.KeepAliveInterval = KeepAliveInterval
	cfg.ConnectionWriteTimeout = WriteTimeout
	cfg.MaxStreamWindowSize = StreamWindow
	cfg.LogOutput = nil
	cfg.Logger = zap.NewStdLog(logger.With(zap.String("component", "yamux")))

	return cfg
}

// RelayDialOptions are NewPeer's options for the edge's client connection, the one boot assets are relayed
// to: fixed HTTP/2 windows of BulkCallWindow per call and BulkConnWindow per connection in place of gRPC's
// estimated ones, which stop at 16 MiB (84 MB/s at 200 ms).
func RelayDialOptions() []grpc.DialOption {
	return []grpc.DialOption{
		grpc.WithInitialWindowSize(BulkCallWindow),
		grpc.WithInitialConnWindowSize(BulkConnWindow),
	}
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
