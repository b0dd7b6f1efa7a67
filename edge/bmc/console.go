package bmc

import (
	"context"
	"errors"
	"fmt"
	"io"
	"strings"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/zap"
	"golang.org/x/sync/errgroup"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/outpost-metal/outpost/edge/bmc/ipmi"
	bootpb "github.com/outpost-metal/outpost/shared/api/boot"
	consolepb "github.com/outpost-metal/outpost/shared/api/console"
)

const (
	// ConsoleInputFrame bounds the typed bytes of one Input frame.
	ConsoleInputFrame = 1 << 10
	// consoleOutputFrames bounds the output frames queued for one session (of at most consoleOutputFrame bytes
	// each: 256 KiB): a reader that falls further behind loses output and is told how much.
	consoleOutputFrames = 256
	consoleOutputFrame  = 1 << 10
)

// ErrConsoleHeld is the refusal of a second writer: the error names who holds the console.
var ErrConsoleHeld = errors.New("console is held for writing")

// ConsoleService serves consolepb.ConsoleServer: a machine's serial console through its BMC's IPMI SOL, on the
// edge's uplink. One writer per machine; every session is logged (who, read or write, bytes each way, output
// dropped for a slow reader). Credentials are never logged.
type ConsoleService struct {
	consolepb.UnimplementedConsoleServer

	m       *Manager
	log     *zap.Logger
	now     func() time.Time
	journal ConsoleJournal

	mu      sync.Mutex
	writers map[string]writer

	sessions *prometheus.CounterVec
	dropped  prometheus.Counter
}

type writer struct {
	operator string
	since    time.Time
}

// NewConsoleService returns the console service over m's BMC settings.
func NewConsoleService(m *Manager) *ConsoleService {
	return &ConsoleService{
		m: m, log: m.log.With(zap.String("component", "console")), now: m.now, writers: map[string]writer{},
		sessions: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "outpost_edge_console_sessions_total",
			Help: "Serial console sessions attached through the edge, by mode (read, write) and result (ok, refused, failed).",
		}, []string{"mode", "result"}),
		dropped: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "outpost_edge_console_dropped_bytes_total",
			Help: "Serial console output bytes dropped because a session's reader fell behind.",
		}),
	}
}

// ConsoleJournal takes the edge's journal entries (journal.Recorder); Record must not block.
type ConsoleJournal interface {
	Record(e *bootpb.Event)
}

// WithJournal makes the service journal every session's end and every refused writer to j.
func (s *ConsoleService) WithJournal(j ConsoleJournal) *ConsoleService {
	s.journal = j

	return s
}

// record journals a session.
func (s *ConsoleService) record(c *bootpb.ConsoleSession) {
	if s.journal != nil {
		s.journal.Record(&bootpb.Event{Kind: &bootpb.Event_ConsoleSession{ConsoleSession: c}})
	}
}

// Collectors returns the service's metrics.
func (s *ConsoleService) Collectors() []prometheus.Collector {
	return []prometheus.Collector{s.sessions, s.dropped}
}

// Register registers the service on r (the edge's uplink server).
func (s *ConsoleService) Register(r grpc.ServiceRegistrar) { consolepb.RegisterConsoleServer(r, s) }

// hold takes the write side of key's console for operator, or says who has it.
func (s *ConsoleService) hold(key, operator string) (release func(), err error) {
	s.mu.Lock()
	defer s.mu.Unlock()

	if w, ok := s.writers[key]; ok {
		return nil, fmt.Errorf("%w by %s since %s", ErrConsoleHeld, w.operator, w.since.UTC().Format(time.RFC3339))
	}

	s.writers[key] = writer{operator: operator, since: s.now()}

	return func() {
		s.mu.Lock()
		delete(s.writers, key)
		s.mu.Unlock()
	}, nil
}

// Attach implements consolepb.ConsoleServer.
func (s *ConsoleService) Attach(stream consolepb.Console_AttachServer) error {
	first, err := stream.Recv()
	if err != nil {
		return err
	}

	open := first.GetOpen()
	if open == nil || open.GetTarget().GetHost() == "" {
		return status.Error(codes.InvalidArgument, "console: the first frame must open a bmc target")
	}

	t, c := fromProto(open.GetTarget())
	operator := operatorName(open.GetOperator())
	key := open.GetTarget().GetMachineId()
	if key == "" {
		key = t.String()
	}

	mode := "read"
	if open.GetWrite() {
		mode = "write"

		release, err := s.hold(key, operator)
		if err != nil {
			s.sessions.WithLabelValues(mode, bootpb.ConsoleResult_CONSOLE_RESULT_REFUSED.Name()).Inc()
			s.log.Info("console writer refused", zap.String("machine_id", key), zap.String("operator", operator), zap.Error(err))
			s.record((&bootpb.ConsoleSession{MachineId: key, Operator: operator, Write: true}).SetResult(bootpb.ConsoleResult_CONSOLE_RESULT_REFUSED))

			return status.Error(codes.FailedPrecondition, fmt.Sprintf("console of %s: %v", key, err))
		}
		defer release()
	}

	ctx := stream.Context()
	start := s.now()

	cl, err := ipmi.Dial(ctx, ipmi.Config{
		Host: t.Host, Port: t.ipmiPort(), Username: c.Username, Password: c.Password,
		CipherSuites: s.m.cfg.IPMICipherSuites, Timeout: s.m.cfg.IPMIExchangeTimeout,
	})
	if err != nil {
		s.sessions.WithLabelValues(mode, bootpb.ConsoleResult_CONSOLE_RESULT_FAILED.Name()).Inc()

		return status.Error(codes.Unavailable, fmt.Sprintf("console of %s: %v", key, err))
	}

	defer func() {
		done, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
		defer cancel()

		cl.Close(done) //nolint:errcheck // the session ends either way
	}()

	sess := &consoleSession{frames: make(chan []byte, consoleOutputFrames), wake: make(chan struct{}, 1)}

	err = s.run(ctx, stream, cl, sess, open.GetWrite())

	result := bootpb.ConsoleResult_CONSOLE_RESULT_OK
	if err != nil {
		result = bootpb.ConsoleResult_CONSOLE_RESULT_FAILED
	}

	s.sessions.WithLabelValues(mode, result.Name()).Inc()
	out, in, dropped := sess.counts()
	s.record((&bootpb.ConsoleSession{
		MachineId: key, Operator: operator, Write: open.GetWrite(),
		DurationMs: uint64(max(s.now().Sub(start).Milliseconds(), 0)),
		BytesOut:   uint64(max(out, 0)), BytesIn: uint64(max(in, 0)), DroppedBytes: uint64(max(dropped, 0)),
	}).SetResult(result))
	s.log.Info("console session ended", zap.String("machine_id", key), zap.String("operator", operator),
		zap.String("mode", mode), zap.Time("attached_at", start), zap.Duration("duration", s.now().Sub(start)),
		zap.Int64("bytes_out", out), zap.Int64("bytes_in", in), zap.Int64("dropped_bytes", dropped), zap.Error(err))

	if _, ok := status.FromError(err); ok && err != nil {
		return err
	}

	if err != nil {
		return status.Error(codes.Unavailable, fmt.Sprintf("console of %s: %v", key, err))
	}

	return nil
}

func (s *ConsoleService) run(ctx context.Context, stream consolepb.Console_AttachServer, cl *ipmi.Client, sess *consoleSession, write bool) error {
	if err := stream.Send(&consolepb.Output{Kind: &consolepb.Output_Attached{Attached: &consolepb.Attached{Write: write, Via: "ipmi-sol"}}}); err != nil {
		return nil // the operator left before the first frame
	}

	ctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)

	inR, inW := io.Pipe()

	// The operator's frames: typed bytes, or the end. Not in the group: Recv ends when Attach returns.
	go func() {
		defer inW.Close() //nolint:errcheck

		cancel(s.input(ctx, stream, inW, sess, write))
	}()

	g, gctx := errgroup.WithContext(ctx)

	g.Go(func() error { // output to the operator, in order, with a notice for what a slow reader lost
		return s.output(gctx, stream, sess)
	})

	g.Go(func() error {
		defer inR.Close() //nolint:errcheck
		defer sess.close()

		return cl.SOL(gctx, inR, sess)
	})

	err := g.Wait()
	if cause := context.Cause(ctx); err == nil && cause != nil && !errors.Is(cause, errOperatorLeft) {
		err = cause
	}

	if errors.Is(err, errOperatorLeft) {
		return nil
	}

	return err
}

var errOperatorLeft = errors.New("operator left")

func (s *ConsoleService) input(ctx context.Context, stream consolepb.Console_AttachServer, in io.Writer, sess *consoleSession, write bool) error {
	warned := false

	for {
		f, err := stream.Recv()
		if err != nil {
			return errOperatorLeft
		}

		data := f.GetData()

		switch {
		case len(data) > ConsoleInputFrame:
			return status.Errorf(codes.InvalidArgument, "console: an input frame of %d bytes (at most %d)", len(data), ConsoleInputFrame)
		case len(data) == 0:
			continue
		case !write:
			if !warned {
				sess.notice("read-only session: typing is not sent (attach with --write)")

				warned = true
			}

			continue
		}

		if _, err := in.Write(data); err != nil {
			return ctx.Err()
		}

		sess.mu.Lock()
		sess.in += int64(len(data))
		sess.mu.Unlock()
	}
}

func (s *ConsoleService) output(ctx context.Context, stream consolepb.Console_AttachServer, sess *consoleSession) error {
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-sess.wake:
		case b, ok := <-sess.frames:
			if !ok {
				return nil
			}

			if err := stream.Send(&consolepb.Output{Kind: &consolepb.Output_Data{Data: b}}); err != nil {
				return errOperatorLeft
			}
		}

		for _, n := range sess.takeNotices() {
			if err := stream.Send(&consolepb.Output{Kind: &consolepb.Output_Notice{Notice: n}}); err != nil {
				return errOperatorLeft
			}
		}

		if d := sess.takeDropped(); d > 0 {
			s.dropped.Add(float64(d))

			msg := fmt.Sprintf("console output dropped: %d bytes (this reader fell behind)", d)
			if err := stream.Send(&consolepb.Output{Kind: &consolepb.Output_Notice{Notice: msg}}); err != nil {
				return errOperatorLeft
			}
		}
	}
}

// consoleSession is the bounded queue between the SOL stream (Write) and the operator's stream.
type consoleSession struct {
	frames chan []byte
	wake   chan struct{}

	mu                    sync.Mutex
	closed                bool
	out, in               int64
	dropped, droppedTotal int64
	notices               []string
}

// Write implements io.Writer for SOLStream: it never blocks; what does not fit is dropped and counted.
func (c *consoleSession) Write(p []byte) (int, error) {
	c.mu.Lock()
	defer c.mu.Unlock()

	if c.closed {
		return 0, io.ErrClosedPipe
	}

	n := len(p)

	for len(p) > 0 {
		k := min(len(p), consoleOutputFrame)

		select {
		case c.frames <- append([]byte(nil), p[:k]...):
			c.out += int64(k)
		default:
			c.dropped += int64(k)
			c.droppedTotal += int64(k)
			c.poke()
		}

		p = p[k:]
	}

	return n, nil
}

func (c *consoleSession) poke() {
	select {
	case c.wake <- struct{}{}:
	default:
	}
}

func (c *consoleSession) notice(msg string) {
	c.mu.Lock()
	if len(c.notices) < 8 {
		c.notices = append(c.notices, msg)
	}
	c.mu.Unlock()
	c.poke()
}

func (c *consoleSession) takeNotices() []string {
	c.mu.Lock()
	defer c.mu.Unlock()

	n := c.notices
	c.notices = nil

	return n
}

func (c *consoleSession) takeDropped() int64 {
	c.mu.Lock()
	defer c.mu.Unlock()

	d := c.dropped
	c.dropped = 0

	return d
}

// counts returns the bytes sent to the operator, typed and dropped so far.
func (c *consoleSession) counts() (out, in, dropped int64) {
	c.mu.Lock()
	defer c.mu.Unlock()

	return c.out, c.in, c.droppedTotal
}

func (c *consoleSession) close() {
	c.mu.Lock()
	defer c.mu.Unlock()

	if !c.closed {
		c.closed = true
		close(c.frames)
	}
}

// operatorName is who an operator says it is, as the edge repeats it (to a second writer, in logs): at most 64
// bytes of letters, digits and "@._-", anything else as "_"; "unknown" for nothing.
func operatorName(s string) string {
	const operatorChars = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789@._-"

	b := []byte(s[:min(len(s), 64)])
	for i, c := range b {
		if strings.IndexByte(operatorChars, c) < 0 {
			b[i] = '_'
		}
	}

	if len(b) == 0 {
		return "unknown"
	}

	return string(b)
}
