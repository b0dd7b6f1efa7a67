package wanbench

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"sync"
	"sync/atomic"
	"time"
)

// segmentSize is the most the proxy reads at once; every queued segment holds one buffer of this size.
const segmentSize = 64 << 10

// DefaultQueue is the most a Proxy holds per direction and connection: 256 MiB, ten times what a
// 1 GB/s stream has in flight over a 200 ms round trip, so the queue never binds before the delay does.
const DefaultQueue = 256 << 20

// Proxy is a TCP proxy on loopback that delays each direction's bytes by half a round-trip time, like a long
// WAN link without loss or a bandwidth limit. Each direction of each connection is a reader that stamps what
// it reads with the time it is due and a writer that passes it on at that time, with up to a queue's worth of
// bytes between them. A test can cut every connection at once or once some bytes have gone toward the
// clients, like a WAN link failing mid-transfer.
type Proxy struct {
	target string
	oneWay time.Duration
	slots  int
	bufs   sync.Pool

	down  atomic.Int64 // bytes forwarded toward the clients
	cutAt atomic.Int64 // cut every connection once down reaches it; 0: not armed
	cuts  atomic.Int32

	mu      sync.Mutex
	links   map[*link]struct{}
	stopped bool
	wg      sync.WaitGroup
}

// NewProxy returns a proxy to target that delays each direction by rtt/2 and holds up to queue bytes per
// direction and connection (DefaultQueue when not positive).
func NewProxy(target string, rtt time.Duration, queue int) *Proxy {
	if queue <= 0 {
		queue = DefaultQueue
	}

	p := &Proxy{
		target: target,
		oneWay: rtt / 2,
		slots:  max(queue/segmentSize, 1),
		links:  map[*link]struct{}{},
	}
	p.bufs.New = func() any { return new([segmentSize]byte) }

	return p
}

// Serve forwards the connections ln accepts to the target until ctx is done; then it closes ln and every
// connection and returns nil once they are gone.
func (p *Proxy) Serve(ctx context.Context, ln net.Listener) error {
	stop := context.AfterFunc(ctx, func() { ln.Close() }) //nolint:errcheck // stopping
	defer stop()

	for {
		in, err := ln.Accept()
		if err != nil {
			p.mu.Lock()
			p.stopped = true
			p.mu.Unlock()

			p.Cut()
			p.wg.Wait()

			if ctx.Err() != nil {
				return nil
			}

			return fmt.Errorf("delay proxy accept: %w", err)
		}

		p.wg.Go(func() { p.handle(ctx, in) })
	}
}

// Cut closes every connection through the proxy; new ones still pass.
func (p *Proxy) Cut() {
	p.mu.Lock()
	links := make([]*link, 0, len(p.links))

	for l := range p.links {
		links = append(links, l)
	}
	p.mu.Unlock()

	for _, l := range links {
		l.close()
	}
}

// CutAfter arms one Cut for when n more bytes have been forwarded toward the clients.
func (p *Proxy) CutAfter(n int64) {
	p.cutAt.Store(p.down.Load() + max(n, 1))
}

// Cuts is how many armed cuts (CutAfter) have happened.
func (p *Proxy) Cuts() int { return int(p.cuts.Load()) }

// Forwarded is the bytes forwarded toward the clients so far.
func (p *Proxy) Forwarded() int64 { return p.down.Load() }

// link is one proxied connection: the client's side and the target's.
type link struct {
	in, out net.Conn
	once    sync.Once
	done    chan struct{}
}

func (l *link) close() {
	l.once.Do(func() {
		close(l.done)
		l.in.Close()  //nolint:errcheck // cutting
		l.out.Close() //nolint:errcheck
	})
}

func (p *Proxy) handle(ctx context.Context, in net.Conn) {
	var d net.Dialer

	out, err := d.DialContext(ctx, "tcp", p.target)
	if err != nil {
		in.Close() //nolint:errcheck // the client sees the refusal as a closed connection

		return
	}

	l := &link{in: in, out: out, done: make(chan struct{})}

	p.mu.Lock()
	stopped := p.stopped
	if !stopped {
		p.links[l] = struct{}{}
	}
	p.mu.Unlock()

	if !stopped {
		var wg sync.WaitGroup

		wg.Go(func() { p.forward(l, out, in, false) })
		wg.Go(func() { p.forward(l, in, out, true) })
		wg.Wait()
	}

	l.close()

	p.mu.Lock()
	delete(p.links, l)
	p.mu.Unlock()
}

// segment is what one read got, due at a time.
type segment struct {
	buf *[segmentSize]byte
	n   int
	due time.Time
}

// forward copies src to dst, each segment rtt/2 after it was read; down marks the direction toward the
// client. An end of file is passed on as a half close once everything before it is written; any other error
// closes the link.
func (p *Proxy) forward(l *link, dst, src net.Conn, down bool) {
	queue := make(chan segment, p.slots)
	written := make(chan struct{})

	go func() {
		defer close(written)
		p.write(l, dst, queue, down)
	}()

	defer func() { <-written }()
	defer close(queue)

	for {
		buf := p.bufs.Get().(*[segmentSize]byte) // only New fills the pool
		n, err := src.Read(buf[:])

		if n > 0 {
			select {
			case queue <- segment{buf: buf, n: n, due: time.Now().Add(p.oneWay)}:
			case <-l.done:
				return
			}
		} else {
			p.bufs.Put(buf)
		}

		if errors.Is(err, io.EOF) {
			return
		}

		if err != nil {
			l.close()

			return
		}
	}
}

func (p *Proxy) write(l *link, dst net.Conn, queue <-chan segment, down bool) {
	timer := time.NewTimer(time.Hour)
	defer timer.Stop()

	for seg := range queue {
		if wait := time.Until(seg.due); wait > 0 {
			timer.Reset(wait)

			select {
			case <-timer.C:
			case <-l.done:
				return
			}
		}

		_, err := dst.Write(seg.buf[:seg.n])
		p.bufs.Put(seg.buf)

		if err != nil {
			l.close()

			return
		}

		if down {
			p.forwarded(int64(seg.n))
		}
	}

	// the source ended: so does this direction, after everything it sent
	if tc, ok := dst.(*net.TCPConn); ok {
		tc.CloseWrite() //nolint:errcheck // the other direction may have closed the connection already
	}
}

func (p *Proxy) forwarded(n int64) {
	total := p.down.Add(n)

	if at := p.cutAt.Load(); at > 0 && total >= at && p.cutAt.CompareAndSwap(at, 0) {
		p.cuts.Add(1)
		p.Cut()
	}
}
