// Package intents carries out each of the controller's destructive or disruptive calls (disk wipes, power
// actions, BMC user changes) at most once per intent ID, across uplink cuts, repeated deliveries and edge
// restarts, and tells the controller what became of each (shared/api/intents).
//
// Before a call with an intent ID is carried out, a record that it started is written and synced to a bounded
// file in the state directory; when it ends, its outcome (the gRPC status, and the response of a call that
// succeeded) is written after it. A call runs apart from its caller: an uplink cut that ends the caller's
// call does not stop it. A repeated call with the same ID waits for the running one or gets the recorded
// outcome; one that started before the edge restarted and has no outcome is never carried out again (its
// effect is unknown, and the controller is told so).
package intents

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/zap"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	intentspb "github.com/outpost-metal/outpost/shared/api/intents"
)

// FileName is the store's file in the state directory.
const FileName = "intents.log"

// maxResponse bounds a kept response; agent and BMC responses to intent calls are empty or a few bytes. A
// larger one is relayed once and not kept: a repeat gets an empty response.
const maxResponse = 16 << 10

// Config configures a Store.
type Config struct {
	// Dir is the state directory.
	Dir string
	// MaxEntries bounds the intents kept; beyond it the oldest finished ones are forgotten (a question about
	// one is then answered STATE_UNKNOWN).
	MaxEntries int
	// RunTimeout bounds a call whose caller set no deadline.
	RunTimeout time.Duration
}

// Default returns the production defaults.
func Default() Config {
	return Config{Dir: "/var/lib/outpost-edge", MaxEntries: 16384, RunTimeout: 10 * time.Minute}
}

// Validate checks the configuration.
func (c Config) Validate() error {
	if c.Dir == "" || c.MaxEntries <= 0 || c.RunTimeout <= 0 {
		return errors.New("intents: a directory, a positive entry bound and a positive run timeout are required")
	}

	return nil
}

// Store is the edge's record of intents. It is safe for concurrent use.
type Store struct {
	cfg  Config
	log  *zap.Logger
	now  func() time.Time
	path string

	mu      sync.Mutex
	f       *os.File
	entries map[string]*entry
	order   []string // IDs, oldest first
	records int      // records in the file
	closed  bool

	calls *prometheus.CounterVec
}

type entry struct {
	out *intentspb.IntentOutcome
	// done is closed when a call running in this process ends (nil for one loaded from disk).
	done chan struct{}
}

// Open loads the store from cfg.Dir (creating it when missing). Intents that started before the edge
// restarted and have no outcome are interrupted: never carried out again.
func Open(cfg Config, log *zap.Logger, now func() time.Time) (*Store, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}

	s := &Store{
		cfg: cfg, log: log.With(zap.String("component", "intents")), now: now,
		path:    filepath.Join(cfg.Dir, FileName),
		entries: map[string]*entry{},
		calls: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "outpost_edge_intent_calls_total",
			Help: "Calls carrying an intent ID, by what the edge did (carried_out, joined: waited for the same intent running, repeated: answered the recorded outcome, interrupted: refused, it started before a restart and its outcome is unknown).",
		}, []string{"result"}),
	}

	if err := os.MkdirAll(cfg.Dir, 0o700); err != nil {
		return nil, fmt.Errorf("intents: state directory: %w", err)
	}

	data, err := os.ReadFile(s.path)
	if err != nil && !errors.Is(err, os.ErrNotExist) {
		return nil, fmt.Errorf("intents: read %s: %w", s.path, err)
	}

	outs, valid := DecodeAll(data)
	if valid < len(data) {
		s.log.Warn("intent store ends in a torn or corrupt record: dropped", zap.Int("valid_bytes", valid), zap.Int("bytes", len(data)))
	}

	interrupted := 0

	for _, o := range outs {
		s.put(o)
	}

	for _, e := range s.entries {
		if e.out.GetState() == intentspb.State_STATE_RUNNING {
			e.out.State = intentspb.State_STATE_INTERRUPTED
			interrupted++
		}
	}

	s.evict()

	// Rewritten at once: drops a torn tail and forgotten intents, and writes the interrupted ones as such.
	if err = s.rewrite(); err != nil {
		return nil, err
	}

	s.log.Info("intent store loaded", zap.Int("intents", len(s.entries)), zap.Int("interrupted", interrupted))

	return s, nil
}

// Collectors returns the store's metrics.
func (s *Store) Collectors() []prometheus.Collector { return []prometheus.Collector{s.calls} }

// Close closes the file; later calls fail.
func (s *Store) Close() error {
	s.mu.Lock()
	defer s.mu.Unlock()

	s.closed = true

	return s.f.Close()
}

// put sets an intent's latest record (loading).
func (s *Store) put(o *intentspb.IntentOutcome) {
	id := o.GetIntentId()
	if _, ok := s.entries[id]; !ok {
		s.order = append(s.order, id)
	}

	s.entries[id] = &entry{out: o}
}

// evict forgets the oldest finished intents beyond the bound.
func (s *Store) evict() {
	over := len(s.entries) - s.cfg.MaxEntries
	if over <= 0 {
		return
	}

	kept := s.order[:0]

	for _, id := range s.order {
		if e := s.entries[id]; over > 0 && (e.done == nil || isClosed(e.done)) {
			delete(s.entries, id)
			over--

			continue
		}

		kept = append(kept, id)
	}

	s.order = kept
}

func isClosed(ch chan struct{}) bool {
	select {
	case <-ch:
		return true
	default:
		return false
	}
}

// rewrite writes every kept intent's latest record to a new file and replaces the old one.
func (s *Store) rewrite() error {
	var buf []byte

	for _, id := range s.order {
		rec, err := AppendRecord(buf, s.entries[id].out)
		if err != nil {
			return err
		}

		buf = rec
	}

	tmp := s.path + ".tmp"
	if err := writeSynced(tmp, buf); err != nil {
		return fmt.Errorf("intents: write %s: %w", tmp, err)
	}

	if err := os.Rename(tmp, s.path); err != nil {
		return fmt.Errorf("intents: replace %s: %w", s.path, err)
	}

	if s.f != nil {
		s.f.Close() //nolint:errcheck // replaced; nothing was written to it since its last sync
	}

	f, err := os.OpenFile(s.path, os.O_WRONLY|os.O_APPEND, 0o600)
	if err != nil {
		return fmt.Errorf("intents: open %s: %w", s.path, err)
	}

	s.f, s.records = f, len(s.order)

	return nil
}

func writeSynced(path string, data []byte) error {
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_TRUNC, 0o600)
	if err != nil {
		return err
	}

	if _, err = f.Write(data); err == nil {
		err = f.Sync()
	}

	if cerr := f.Close(); err == nil {
		err = cerr
	}

	return err
}

// appendLocked writes one record and syncs it; the file is compacted when it holds more than twice the
// kept intents.
func (s *Store) appendLocked(o *intentspb.IntentOutcome) error {
	if s.closed {
		return errors.New("intents: store closed")
	}

	rec, err := AppendRecord(nil, o)
	if err != nil {
		return err
	}

	if _, err = s.f.Write(rec); err != nil {
		return fmt.Errorf("intents: append: %w", err)
	}

	if err = s.f.Sync(); err != nil {
		return fmt.Errorf("intents: sync: %w", err)
	}

	s.records++

	if s.records > 2*len(s.order)+64 {
		return s.rewrite()
	}

	return nil
}

// Do carries out intent id (op on machineID) with fn unless the store knows it: a running one is waited for,
// a finished one answered with its recorded outcome, an interrupted one refused with Aborted. It returns the
// encoded response, or the call's gRPC status as an error. fn's context ends at the caller's deadline (or the
// store's run timeout), not when the caller goes away; fn returns the encoded response.
func (s *Store) Do(ctx context.Context, id, machineID, op string, fn func(ctx context.Context) ([]byte, error)) ([]byte, error) {
	if err := intentspb.CheckID(id); err != nil {
		return nil, status.Error(codes.InvalidArgument, err.Error())
	}

	s.mu.Lock()

	e, known := s.entries[id]
	if known {
		s.mu.Unlock()

		return s.answer(ctx, e, machineID, op)
	}

	started := s.now()
	e = &entry{done: make(chan struct{}), out: &intentspb.IntentOutcome{
		IntentId: id, MachineId: machineID, Op: op, State: intentspb.State_STATE_RUNNING, StartedUnixMs: started.UnixMilli(),
	}}

	// The start is on disk before anything is done: a restart after this point never does it again.
	if err := s.appendLocked(e.out); err != nil {
		s.mu.Unlock()
		s.log.Error("intent not recorded: not carried out", zap.String("intent_id", id), zap.String("machine_id", machineID), zap.Error(err))

		return nil, status.Errorf(codes.Unavailable, "intent %s not recorded at the edge: %v", id, err)
	}

	s.entries[id] = e
	s.order = append(s.order, id)
	s.evict()
	s.mu.Unlock()

	s.calls.WithLabelValues("carried_out").Inc()

	runCtx, cancel := s.detach(ctx)

	go func() {
		defer cancel()

		resp, err := fn(runCtx)
		s.finish(e, resp, err)
	}()

	return s.wait(ctx, e)
}

// detach is ctx without its cancellation, ending at its deadline (the store's run timeout when it has none).
func (s *Store) detach(ctx context.Context) (context.Context, context.CancelFunc) {
	base := context.WithoutCancel(ctx)

	if deadline, ok := ctx.Deadline(); ok {
		return context.WithDeadline(base, deadline)
	}

	return context.WithTimeout(base, s.cfg.RunTimeout)
}

// finish records a call's outcome and wakes those waiting for it.
func (s *Store) finish(e *entry, resp []byte, err error) {
	st := status.Convert(err)

	s.mu.Lock()
	defer s.mu.Unlock()

	out := proto.Clone(e.out).(*intentspb.IntentOutcome)
	out.EndedUnixMs = s.now().UnixMilli()
	out.Code, out.Message = uint32(st.Code()), st.Message()

	if err == nil {
		out.State = intentspb.State_STATE_DONE
		if len(resp) <= maxResponse {
			out.Response = resp
		}
	} else {
		out.State = intentspb.State_STATE_FAILED
	}

	if werr := s.appendLocked(out); werr != nil {
		// Kept in memory: this process answers repeats right; after a restart the intent is interrupted.
		s.log.Error("intent outcome not recorded on disk", zap.String("intent_id", out.GetIntentId()), zap.Error(werr))
	}

	e.out = out
	close(e.done)
}

// wait waits for a running intent and returns its outcome (the caller's context ending first: its error).
func (s *Store) wait(ctx context.Context, e *entry) ([]byte, error) {
	select {
	case <-e.done:
	case <-ctx.Done():
		return nil, status.FromContextError(ctx.Err()).Err()
	}

	s.mu.Lock()
	out := e.out
	s.mu.Unlock()

	return result(out)
}

// answer is what a call with a known intent ID gets.
func (s *Store) answer(ctx context.Context, e *entry, machineID, op string) ([]byte, error) {
	s.mu.Lock()
	out, done := e.out, e.done
	s.mu.Unlock()

	if out.GetMachineId() != machineID || out.GetOp() != op {
		return nil, status.Errorf(codes.AlreadyExists, "intent %s is %s for machine %s, not %s for machine %s",
			out.GetIntentId(), out.GetOp(), out.GetMachineId(), op, machineID)
	}

	switch {
	case out.GetState() == intentspb.State_STATE_INTERRUPTED:
		s.calls.WithLabelValues("interrupted").Inc()

		return nil, status.Errorf(codes.Aborted, "intent %s (%s for machine %s) started before the edge restarted; whether it took effect is unknown",
			out.GetIntentId(), op, machineID)
	case done != nil && !isClosed(done):
		s.calls.WithLabelValues("joined").Inc()

		return s.wait(ctx, e)
	default:
		s.calls.WithLabelValues("repeated").Inc()

		return result(out)
	}
}

func result(out *intentspb.IntentOutcome) ([]byte, error) {
	if out.GetState() == intentspb.State_STATE_DONE {
		return out.GetResponse(), nil
	}

	return nil, status.Error(codes.Code(out.GetCode()), out.GetMessage())
}

// Outcome returns what the store knows of intent id (STATE_UNKNOWN when nothing); an intent held for another
// machine is refused.
func (s *Store) Outcome(id, machineID string) (*intentspb.IntentOutcome, error) {
	if err := intentspb.CheckID(id); err != nil {
		return nil, status.Error(codes.InvalidArgument, err.Error())
	}

	s.mu.Lock()
	defer s.mu.Unlock()

	e, ok := s.entries[id]
	if !ok {
		return &intentspb.IntentOutcome{IntentId: id, MachineId: machineID, State: intentspb.State_STATE_UNKNOWN}, nil
	}

	if e.out.GetMachineId() != machineID {
		return nil, status.Errorf(codes.AlreadyExists, "intent %s is for machine %s, not %s", id, e.out.GetMachineId(), machineID)
	}

	out := proto.Clone(e.out).(*intentspb.IntentOutcome)
	out.Response = nil

	return out, nil
}
