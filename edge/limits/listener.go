package limits

import (
	"io"
	"net"
	"net/http"
	"net/netip"
	"sync/atomic"

	"go.uber.org/zap"
)

// Listener accepts connections within a Limiter's bounds, keyed by the remote IP address. A connection over a
// bound is closed at once with a reset (the server never reads from it and no socket lingers in TIME_WAIT),
// counted by the Limiter and noted in the RejectLog; Accept goes on with the next connection.
//
// An accepted connection is evictable until something is written to it (a client that never completes a
// request, as slowloris does, never gets a byte), and again whenever its server reports it idle (ConnState).
type Listener struct {
	net.Listener

	lim   *Limiter
	log   *RejectLog
	hints map[Reason]string
}

// NewListener wraps ln. hints, per bound, tell the operator in the refusal line what raises it.
func NewListener(ln net.Listener, lim *Limiter, log *RejectLog, hints map[Reason]string) *Listener {
	return &Listener{Listener: ln, lim: lim, log: log, hints: hints}
}

// Limiter returns the Limiter the Listener counts with.
func (l *Listener) Limiter() *Limiter { return l.lim }

// Accept returns the next connection within the bounds.
func (l *Listener) Accept() (net.Conn, error) {
	for {
		c, err := l.Listener.Accept()
		if err != nil {
			return nil, err
		}

		src := RemoteIP(c)
		lc := &conn{Conn: c}
		lc.evictable.Store(true)

		slot, err := l.lim.Acquire(src, lc.reset)
		if err != nil {
			reset(c)

			if re, ok := AsRefused(err); ok {
				l.log.Note(string(re.Reason), zap.Stringer("remote", src), zap.Int("limit", re.Limit), zap.String("hint", l.hints[re.Reason]))
			}

			continue
		}

		lc.slot = slot

		return lc, nil
	}
}

// RemoteIP returns the IP address of c's peer (invalid when it has none).
func RemoteIP(c net.Conn) netip.Addr {
	if a, ok := c.RemoteAddr().(*net.TCPAddr); ok {
		return a.AddrPort().Addr().Unmap()
	}

	ap, err := netip.ParseAddrPort(c.RemoteAddr().String())
	if err != nil {
		return netip.Addr{}
	}

	return ap.Addr().Unmap()
}

// ConnState is an http.Server ConnState hook for a server on a Listener: an idle keep-alive connection becomes
// evictable (closing it costs its client a reconnect at most). It ignores connections from other listeners.
func ConnState(c net.Conn, st http.ConnState) {
	if lc, ok := c.(*conn); ok && st == http.StateIdle {
		lc.setEvictable(true)
	}
}

// conn holds a Limiter slot until it is closed.
type conn struct {
	net.Conn

	slot      *Slot
	evictable atomic.Bool
}

func (c *conn) setEvictable(on bool) {
	if c.evictable.Swap(on) != on {
		c.slot.SetEvictable(on)
	}
}

func (c *conn) Write(b []byte) (int, error) {
	c.setEvictable(false)

	return c.Conn.Write(b)
}

// ReadFrom keeps the underlying connection's sendfile/splice path (net/http uses it for file bodies).
func (c *conn) ReadFrom(r io.Reader) (int64, error) {
	c.setEvictable(false)

	if rf, ok := c.Conn.(io.ReaderFrom); ok {
		return rf.ReadFrom(r)
	}

	return io.Copy(writerOnly{c.Conn}, r)
}

// CloseWrite lets net/http half-close the connection as it does a *net.TCPConn.
func (c *conn) CloseWrite() error {
	if cw, ok := c.Conn.(interface{ CloseWrite() error }); ok {
		return cw.CloseWrite()
	}

	return nil
}

func (c *conn) Close() error {
	c.slot.Release()

	return c.Conn.Close()
}

// reset ends an evicted connection; its server sees the error on its next read or write and closes it.
func (c *conn) reset() { reset(c.Conn) }

func reset(c net.Conn) {
	if tc, ok := c.(*net.TCPConn); ok {
		_ = tc.SetLinger(0) //nolint:errcheck // best effort: a plain close is fine too
	}

	_ = c.Close() //nolint:errcheck // nothing to do about it
}

type writerOnly struct{ io.Writer }
