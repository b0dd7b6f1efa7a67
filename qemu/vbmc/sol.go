package vbmc

import (
	"context"
	"errors"
	"fmt"
	"io"
	"sync"

	"github.com/bougou/go-ipmi/pkg/hal"
)

// ConsoleBuffer bounds what a Console keeps for a remote console that has not collected it yet: older bytes are
// dropped first, so a guest printing faster than the SOL session drains cannot grow the BMC's memory.
const ConsoleBuffer = 64 << 10

// ErrConsoleBusy is Open's answer while a SOL session holds the console: a serial port serves one activation
// (IPMI v2.0 §15.3).
var ErrConsoleBusy = errors.New("serial console is attached to another sol session")

// Console is a machine's serial line as its BMC's SOL payload serves it (IPMI v2.0 §15). Serve drains the line
// whether or not a remote console is attached (a line nobody reads stalls the guest's UART); what arrives while
// one is attached is kept for it, at most ConsoleBuffer bytes.
type Console struct {
	mu       sync.Mutex
	line     io.Writer
	attached *solConn
	dropped  int64
}

// NewConsole returns a Console with no line yet.
func NewConsole() *Console { return &Console{} }

// Serve makes line the machine's serial line (one QEMU run's connection) until it ends or ctx does; it closes
// line. Input typed at an attached console goes to the newest line.
func (c *Console) Serve(ctx context.Context, line io.ReadWriteCloser) error {
	c.mu.Lock()
	c.line = line
	c.mu.Unlock()

	stop := context.AfterFunc(ctx, func() { line.Close() }) //nolint:errcheck
	defer stop()

	defer func() {
		c.mu.Lock()
		if c.line == line {
			c.line = nil
		}
		c.mu.Unlock()

		line.Close() //nolint:errcheck
	}()

	buf := make([]byte, 4096)

	for {
		n, err := line.Read(buf)
		if n > 0 {
			c.deliver(buf[:n])
		}

		if err != nil {
			if ctx.Err() != nil || errors.Is(err, io.EOF) {
				return nil
			}

			return fmt.Errorf("read serial line: %w", err)
		}
	}
}

// Dropped returns how many output bytes an attached remote console lost because it fell behind.
func (c *Console) Dropped() int64 {
	c.mu.Lock()
	defer c.mu.Unlock()

	return c.dropped
}

func (c *Console) deliver(p []byte) {
	c.mu.Lock()
	defer c.mu.Unlock()

	a := c.attached
	if a == nil {
		return
	}

	a.pending = append(a.pending, p...)
	if over := len(a.pending) - ConsoleBuffer; over > 0 {
		a.pending = a.pending[:copy(a.pending, a.pending[over:])]
		c.dropped += int64(over)
	}
}

// Open implements hal.ConsoleHAL: it attaches a SOL activation, refusing a second one.
func (c *Console) Open(context.Context) (hal.ConsoleConn, error) {
	c.mu.Lock()
	defer c.mu.Unlock()

	if c.attached != nil {
		return nil, ErrConsoleBusy
	}

	c.attached = &solConn{c: c}

	return c.attached, nil
}

// solConn is one SOL activation's end of a Console.
type solConn struct {
	c       *Console
	pending []byte // guarded by c.mu
	closed  bool   // guarded by c.mu
}

// ReadAvailable implements hal.ConsoleConn without blocking.
func (s *solConn) ReadAvailable(p []byte) (int, error) {
	s.c.mu.Lock()
	defer s.c.mu.Unlock()

	if s.closed {
		return 0, io.ErrClosedPipe
	}

	n := copy(p, s.pending)
	s.pending = s.pending[:copy(s.pending, s.pending[n:])]

	return n, nil
}

// Write implements hal.ConsoleConn: typed bytes go to the serial line; with no line (the machine is off) they are
// dropped, as a UART with nothing behind it would.
func (s *solConn) Write(p []byte) (int, error) {
	s.c.mu.Lock()
	line, closed := s.c.line, s.closed
	s.c.mu.Unlock()

	if closed {
		return 0, io.ErrClosedPipe
	}

	if line == nil {
		return len(p), nil
	}

	// A line that goes away mid-write is the machine stopping, not the console failing: the bytes are lost as above.
	_, _ = line.Write(p)

	return len(p), nil
}

// Close implements hal.ConsoleConn: it detaches the activation.
func (s *solConn) Close() error {
	s.c.mu.Lock()
	defer s.c.mu.Unlock()

	s.closed = true
	if s.c.attached == s {
		s.c.attached = nil
	}

	return nil
}

// SendBreak implements hal.ConsoleConn: the lab's serial lines carry no BREAK.
func (s *solConn) SendBreak(context.Context) error { return hal.ErrNotSupported }

// consoleSlot is the console the IPMI front end's SOL payload serves: present from construction (go-ipmi reads
// the HAL's console once), set by SetConsole.
type consoleSlot struct {
	mu sync.Mutex
	c  *Console
}

// Open implements hal.ConsoleHAL.
func (s *consoleSlot) Open(ctx context.Context) (hal.ConsoleConn, error) {
	s.mu.Lock()
	c := s.c
	s.mu.Unlock()

	if c == nil {
		return nil, errors.New("this bmc has no serial console")
	}

	return c.Open(ctx)
}

// Console implements hal.HAL: the SOL payload's serial console.
func (h *ipmiHAL) Console() hal.ConsoleHAL { return &h.console }

// SetConsole makes c the console the BMC's SOL payload serves.
func (i *IPMI) SetConsole(c *Console) {
	i.hal.console.mu.Lock()
	i.hal.console.c = c
	i.hal.console.mu.Unlock()
}
