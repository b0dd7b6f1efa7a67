package limits

import (
	"sync"
	"time"

	"go.uber.org/zap"
)

// DefaultLogInterval is how often a RejectLog writes a line per reason at most.
const DefaultLogInterval = 10 * time.Second

// Clock is the time a RejectLog uses; tests drive it by hand.
type Clock interface {
	Now() time.Time
	// AfterFunc calls f once d has passed and returns a function that cancels the call.
	AfterFunc(d time.Duration, f func()) (stop func() bool)
}

type realClock struct{}

// SystemClock returns the wall clock.
func SystemClock() Clock { return realClock{} }

func (realClock) Now() time.Time { return time.Now() }

func (realClock) AfterFunc(d time.Duration, f func()) func() bool { return time.AfterFunc(d, f).Stop }

// RejectLog keeps a component's refusal log lines to one per reason per interval, whatever the packet rate:
// the first refusal of a reason that was quiet for an interval is logged at once (count 1), the ones after it
// are counted and summed up in one line when the interval ends (count N, with the fields of the latest one).
// It is safe for concurrent use; Flush writes what is pending (at shutdown).
type RejectLog struct {
	log      *zap.Logger
	msg      string
	interval time.Duration
	clock    Clock

	mu      sync.Mutex
	reasons map[string]*rejects
}

type rejects struct {
	last    time.Time // when the last line was written
	pending int64
	fields  []zap.Field
	stop    func() bool // the pending summary, when scheduled
}

// NewRejectLog returns a RejectLog writing msg at warn level to log, at most one line per reason per interval
// (DefaultLogInterval when 0). clock may be nil (the wall clock).
func NewRejectLog(log *zap.Logger, msg string, interval time.Duration, clock Clock) *RejectLog {
	if interval <= 0 {
		interval = DefaultLogInterval
	}

	if clock == nil {
		clock = realClock{}
	}

	return &RejectLog{log: log, msg: msg, interval: interval, clock: clock, reasons: map[string]*rejects{}}
}

// Note counts one refusal for reason; fields describe it (the remote, the limit, what the operator can do).
func (r *RejectLog) Note(reason string, fields ...zap.Field) {
	r.mu.Lock()
	defer r.mu.Unlock()

	st := r.reasons[reason]
	if st == nil {
		st = &rejects{}
		r.reasons[reason] = st
	}

	now := r.clock.Now()

	if st.stop == nil && st.pending == 0 && (st.last.IsZero() || now.Sub(st.last) >= r.interval) {
		st.last = now
		r.write(reason, 1, false, fields)

		return
	}

	st.pending++
	st.fields = fields

	if st.stop == nil {
		st.stop = r.clock.AfterFunc(st.last.Add(r.interval).Sub(now), func() { r.flush(reason) })
	}
}

func (r *RejectLog) flush(reason string) {
	r.mu.Lock()
	defer r.mu.Unlock()

	st := r.reasons[reason]
	if st == nil || st.stop == nil {
		return // flushed meanwhile
	}

	st.stop = nil

	if st.pending > 0 {
		st.last = r.clock.Now()
		r.write(reason, st.pending, true, st.fields)
		st.pending, st.fields = 0, nil
	}
}

func (r *RejectLog) write(reason string, n int64, summary bool, fields []zap.Field) {
	all := make([]zap.Field, 0, len(fields)+3)
	all = append(all, zap.String("reason", reason), zap.Int64("count", n))

	if summary {
		all = append(all, zap.Duration("interval", r.interval))
	}

	r.log.Warn(r.msg, append(all, fields...)...)
}

// Flush writes the pending counts now and stops the timers, so nothing is logged later from a timer (a
// component calls it when it stops). Refusals noted afterwards are logged as before.
func (r *RejectLog) Flush() {
	r.mu.Lock()
	defer r.mu.Unlock()

	now := r.clock.Now()

	for reason, st := range r.reasons {
		if st.stop != nil {
			st.stop()
			st.stop = nil
		}

		if st.pending > 0 {
			st.last = now
			r.write(reason, st.pending, true, st.fields)
			st.pending, st.fields = 0, nil
		}
	}
}
