// Package journal is the edge's event journal: events (PXE seen, DHCP seen, boot served, ...) are appended
// with increasing sequence numbers to a bounded file in the state directory, delivered in order to the
// controller whenever the uplink is up, and dropped once the controller acknowledges them. After a restart
// the unacknowledged events are delivered again.
package journal

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"go.uber.org/zap"
	"google.golang.org/grpc"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/timestamppb"

	bootpb "github.com/outpost-metal/outpost/shared/api/boot"
)

// File names in the state directory.
const (
	LogName = "events.journal"
	IDName  = "events.journal-id"
)

// ErrClosed is returned after Close.
var ErrClosed = errors.New("journal closed")

// Config configures the journal.
type Config struct {
	// Dir is the state directory.
	Dir string
	// MaxEvents bounds the unacknowledged events; beyond it the oldest are dropped (and counted).
	MaxEvents int
	// MaxBytes is the file size that triggers a rewrite without acknowledged events.
	MaxBytes int64
	// BatchSize is the number of events per Publish call.
	BatchSize int
	// RetryInterval is the wait after a failed or unproductive Publish.
	RetryInterval time.Duration
}

// Default returns the production defaults.
func Default() Config {
	return Config{Dir: "/var/lib/outpost-edge", MaxEvents: 10000, MaxBytes: 8 << 20, BatchSize: 200, RetryInterval: 2 * time.Second}
}

// Validate checks the configuration.
func (c Config) Validate() error {
	if c.Dir == "" || c.MaxEvents <= 0 || c.MaxBytes <= 0 || c.BatchSize <= 0 || c.RetryInterval <= 0 {
		return errors.New("journal: a directory, and positive event and byte bounds, batch size and retry interval are required")
	}

	return nil
}

// Deps are the journal's injected clock and randomness (for the journal ID); both optional.
type Deps struct {
	Now  func() time.Time
	Rand io.Reader
}

// Journal is the on-disk event journal. It is safe for concurrent use.
type Journal struct {
	cfg  Config
	log  *zap.Logger
	now  func() time.Time
	id   string
	path string

	mu      sync.Mutex
	f       *os.File
	size    int64
	pending []*bootpb.Event
	nextSeq uint64
	acked   uint64
	dirty   bool
	closed  bool
	wake    chan struct{}

	dropped, appended, delivered atomic.Int64
}

// Open opens (or creates) the journal in cfg.Dir and loads the unacknowledged events.
// A torn or corrupt tail (a crash mid-write) is cut off.
func Open(cfg Config, logger *zap.Logger, deps Deps) (*Journal, error) {
	if err := cfg.Validate(); err != nil {
		return nil, fmt.Errorf("journal config: %w", err)
	}

	if deps.Now == nil {
		deps.Now = time.Now
	}

	if deps.Rand == nil {
		deps.Rand = rand.Reader
	}

	if err := os.MkdirAll(cfg.Dir, 0o700); err != nil {
		return nil, fmt.Errorf("create journal dir: %w", err)
	}

	j := &Journal{
		cfg: cfg, log: logger.With(zap.String("component", "journal")), now: deps.Now,
		path: filepath.Join(cfg.Dir, LogName), nextSeq: 1, wake: make(chan struct{}),
	}

	id, err := loadID(filepath.Join(cfg.Dir, IDName), deps.Rand)
	if err != nil {
		return nil, err
	}

	j.id = id

	data, err := os.ReadFile(j.path)
	if err != nil && !errors.Is(err, os.ErrNotExist) {
		return nil, fmt.Errorf("read journal: %w", err)
	}

	records, valid := DecodeAll(data)
	if valid < len(data) {
		j.log.Warn("journal tail is corrupt, cutting it off", zap.Int("valid_bytes", valid), zap.Int("file_bytes", len(data)))
	}

	j.replay(records)

	j.f, err = os.OpenFile(j.path, os.O_RDWR|os.O_CREATE, 0o600)
	if err != nil {
		return nil, fmt.Errorf("open journal: %w", err)
	}

	if err := j.f.Truncate(int64(valid)); err != nil {
		j.f.Close() //nolint:errcheck

		return nil, fmt.Errorf("truncate journal: %w", err)
	}

	if _, err := j.f.Seek(int64(valid), io.SeekStart); err != nil {
		j.f.Close() //nolint:errcheck

		return nil, fmt.Errorf("seek journal: %w", err)
	}

	j.size = int64(valid)
	j.log.Info("journal opened", zap.String("journal_id", j.id), zap.Int("pending", len(j.pending)), zap.Uint64("next_sequence", j.nextSeq))

	return j, nil
}

func loadID(path string, rnd io.Reader) (string, error) {
	b, err := os.ReadFile(path)
	if err == nil && len(strings.TrimSpace(string(b))) > 0 {
		return strings.TrimSpace(string(b)), nil
	}

	if err != nil && !errors.Is(err, os.ErrNotExist) {
		return "", fmt.Errorf("read journal id: %w", err)
	}

	raw := make([]byte, 16)
	if _, err := io.ReadFull(rnd, raw); err != nil {
		return "", fmt.Errorf("generate journal id: %w", err)
	}

	id := hex.EncodeToString(raw)
	if err := os.WriteFile(path, []byte(id+"\n"), 0o600); err != nil {
		return "", fmt.Errorf("write journal id: %w", err)
	}

	return id, nil
}

func (j *Journal) replay(records []Record) {
	for _, r := range records {
		switch r.Type {
		case typeEvent:
			var e bootpb.Event
			if err := proto.Unmarshal(r.Body, &e); err != nil || e.GetSequence() < j.nextSeq {
				continue // undecodable or out of order: skip rather than fail the edge
			}

			j.pending = append(j.pending, &e)
			j.nextSeq = e.GetSequence() + 1
		case typeAck:
			j.ackLocked(ackSeq(r.Body))
		}
	}

	if over := len(j.pending) - j.cfg.MaxEvents; over > 0 {
		j.pending = j.pending[over:]
		j.dropped.Add(int64(over))
	}
}

// ID names this journal; it changes only when the journal is recreated.
func (j *Journal) ID() string {
	return j.id
}

// Counters returns named counts for the edge status RPC.
func (j *Journal) Counters() map[string]int64 {
	j.mu.Lock()
	pending := len(j.pending)
	j.mu.Unlock()

	return map[string]int64{
		"journal_pending": int64(pending), "journal_appended": j.appended.Load(),
		"journal_delivered": j.delivered.Load(), "journal_dropped": j.dropped.Load(),
	}
}

// Append assigns the next sequence number and the time to e, writes it and returns the sequence.
func (j *Journal) Append(e *bootpb.Event) (uint64, error) {
	j.mu.Lock()
	defer j.mu.Unlock()

	if j.closed {
		return 0, ErrClosed
	}

	e = proto.Clone(e).(*bootpb.Event)
	e.Sequence = j.nextSeq

	if e.GetTime() == nil {
		e.Time = timestamppb.New(j.now())
	}

	payload, err := proto.Marshal(e)
	if err != nil {
		return 0, fmt.Errorf("encode event: %w", err)
	}

	if len(payload)+1 > maxBodyLen {
		return 0, fmt.Errorf("event of %d bytes is too large", len(payload))
	}

	if err := j.writeLocked(AppendRecord(nil, typeEvent, payload)); err != nil {
		return 0, err
	}

	j.nextSeq++
	j.pending = append(j.pending, e)
	j.appended.Add(1)

	if over := len(j.pending) - j.cfg.MaxEvents; over > 0 {
		j.pending = j.pending[over:]
		j.dropped.Add(int64(over))
	}

	close(j.wake)
	j.wake = make(chan struct{})

	return e.GetSequence(), j.maybeCompactLocked()
}

func (j *Journal) writeLocked(rec []byte) error {
	if _, err := j.f.Write(rec); err != nil {
		return fmt.Errorf("write journal: %w", err)
	}

	j.size += int64(len(rec))
	j.dirty = true

	return nil
}

// Pending returns up to max unacknowledged events in sequence order, after making them durable.
func (j *Journal) Pending(maxEvents int) ([]*bootpb.Event, error) {
	j.mu.Lock()
	defer j.mu.Unlock()

	if j.closed {
		return nil, ErrClosed
	}

	if err := j.syncLocked(); err != nil {
		return nil, err
	}

	n := min(maxEvents, len(j.pending))

	return append([]*bootpb.Event(nil), j.pending[:n]...), nil
}

func (j *Journal) syncLocked() error {
	if !j.dirty {
		return nil
	}

	if err := j.f.Sync(); err != nil {
		return fmt.Errorf("sync journal: %w", err)
	}

	j.dirty = false

	return nil
}

// Ack records that the controller has handled every event up to seq.
func (j *Journal) Ack(seq uint64) error {
	j.mu.Lock()
	defer j.mu.Unlock()

	if j.closed {
		return ErrClosed
	}

	if seq <= j.acked {
		return nil
	}

	if err := j.writeLocked(AppendRecord(nil, typeAck, ackPayload(seq))); err != nil {
		return err
	}

	before := len(j.pending)
	j.ackLocked(seq)
	j.delivered.Add(int64(before - len(j.pending)))

	return j.maybeCompactLocked()
}

func (j *Journal) ackLocked(seq uint64) {
	if seq <= j.acked {
		return
	}

	j.acked = seq

	i := 0
	for i < len(j.pending) && j.pending[i].GetSequence() <= seq {
		i++
	}

	j.pending = j.pending[i:]

	if seq >= j.nextSeq {
		j.nextSeq = seq + 1
	}
}

// maybeCompactLocked rewrites the file with only the pending events (and the ack mark, which keeps
// sequence numbers increasing) once it has grown past MaxBytes.
func (j *Journal) maybeCompactLocked() error {
	if j.size <= j.cfg.MaxBytes {
		return nil
	}

	var buf []byte
	if j.acked > 0 {
		buf = AppendRecord(buf, typeAck, ackPayload(j.acked))
	}

	for _, e := range j.pending {
		payload, err := proto.Marshal(e)
		if err != nil {
			return fmt.Errorf("encode event: %w", err)
		}

		buf = AppendRecord(buf, typeEvent, payload)
	}

	tmp := j.path + ".compact"
	if err := os.WriteFile(tmp, buf, 0o600); err != nil {
		return fmt.Errorf("write compacted journal: %w", err)
	}

	f, err := os.OpenFile(tmp, os.O_RDWR, 0o600)
	if err != nil {
		return fmt.Errorf("open compacted journal: %w", err)
	}

	if err := f.Sync(); err != nil {
		f.Close() //nolint:errcheck

		return fmt.Errorf("sync compacted journal: %w", err)
	}

	if err := os.Rename(tmp, j.path); err != nil {
		f.Close() //nolint:errcheck

		return fmt.Errorf("replace journal: %w", err)
	}

	if _, err := f.Seek(0, io.SeekEnd); err != nil {
		f.Close() //nolint:errcheck

		return fmt.Errorf("seek journal: %w", err)
	}

	j.f.Close() //nolint:errcheck
	j.f, j.size, j.dirty = f, int64(len(buf)), false

	return nil
}

// Close syncs and closes the journal.
func (j *Journal) Close() error {
	j.mu.Lock()
	defer j.mu.Unlock()

	if j.closed {
		return nil
	}

	j.closed = true
	close(j.wake)

	serr := j.f.Sync()
	cerr := j.f.Close()

	return errors.Join(serr, cerr)
}

func (j *Journal) waitCh() <-chan struct{} {
	j.mu.Lock()
	defer j.mu.Unlock()

	return j.wake
}

// Publisher is the controller's Events service as the journal uses it (bootpb.EventsClient fits).
type Publisher interface {
	Publish(ctx context.Context, in *bootpb.PublishRequest, opts ...grpc.CallOption) (*bootpb.PublishResponse, error)
}

// Deliver sends pending events in order, in batches, until ctx ends (it returns nil then). Publish errors are
// retried after RetryInterval. Run it for the life of each uplink session (it fits uplink.Options.OnSession via
// bootpb.NewEventsClient(conn)).
func (j *Journal) Deliver(ctx context.Context, pub Publisher) error {
	for {
		wake := j.waitCh()

		batch, err := j.Pending(j.cfg.BatchSize)
		if errors.Is(err, ErrClosed) {
			return nil
		}

		if err != nil {
			return err
		}

		if len(batch) == 0 {
			select {
			case <-ctx.Done():
				return nil
			case <-wake:
				continue
			}
		}

		resp, err := pub.Publish(ctx, &bootpb.PublishRequest{JournalId: j.id, Events: batch})
		if ctx.Err() != nil {
			return nil
		}

		progressed := false

		if err != nil {
			j.log.Warn("publishing events failed, will retry", zap.Error(err), zap.Int("batch", len(batch)))
		} else {
			progressed = resp.GetAcked() >= batch[0].GetSequence()
			if err := j.Ack(resp.GetAcked()); err != nil {
				return err
			}
		}

		if !progressed {
			select {
			case <-ctx.Done():
				return nil
			case <-time.After(j.cfg.RetryInterval):
			}
		}
	}
}
