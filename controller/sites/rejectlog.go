package sites

import (
	"sync"
	"time"

	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
)

// rejectLog logs refused connections without letting a flood write the disk full: the first refusal of a
// reason is logged in full, later ones within the interval are only counted, and flush (every interval)
// writes one line per reason with the count and the last example. The reasons are a fixed set, so its
// memory is bounded.
type rejectLog struct {
	log      *zap.Logger
	interval time.Duration
	now      func() time.Time

	mu       sync.Mutex
	byReason map[string]*rejectState
}

type rejectState struct {
	logged     time.Time
	suppressed int
	level      zapcore.Level
	msg        string
	example    string
	remote     string
	site       string
}

func newRejectLog(log *zap.Logger, interval time.Duration, now func() time.Time) *rejectLog {
	return &rejectLog{log: log, interval: interval, now: now, byReason: map[string]*rejectState{}}
}

// reject logs (or counts) one refusal: msg is the line's message, reason the metric label, why the words
// an operator acts on; site may be empty.
func (l *rejectLog) reject(level zapcore.Level, msg, reason, why, remote, site string) {
	now := l.now()

	l.mu.Lock()

	st := l.byReason[reason]
	if st == nil {
		st = &rejectState{}
		l.byReason[reason] = st
	}

	if !st.logged.IsZero() && now.Sub(st.logged) < l.interval {
		st.suppressed++
		st.level, st.msg, st.example, st.remote, st.site = level, msg, why, remote, site
		l.mu.Unlock()

		return
	}

	st.logged = now
	l.mu.Unlock()

	fields := []zap.Field{zap.String("reason", why), zap.String("reason_code", reason), zap.String("remote", remote)}
	if site != "" {
		fields = append(fields, zap.String("site", site))
	}

	l.log.Log(level, msg, fields...)
}

// flush writes one line per reason whose refusals were only counted since its last line.
func (l *rejectLog) flush() {
	now := l.now()

	type summary struct {
		reason string
		state  rejectState
	}

	var out []summary

	l.mu.Lock()

	for reason, st := range l.byReason {
		if st.suppressed == 0 {
			continue
		}

		out = append(out, summary{reason: reason, state: *st})
		st.suppressed = 0
		st.logged = now
	}

	l.mu.Unlock()

	for _, s := range out {
		fields := []zap.Field{
			zap.String("reason_code", s.reason),
			zap.Int("count", s.state.suppressed),
			zap.Duration("interval", l.interval),
			zap.String("last_reason", s.state.example),
			zap.String("last_remote", s.state.remote),
		}

		if s.state.site != "" {
			fields = append(fields, zap.String("last_site", s.state.site))
		}

		l.log.Log(s.state.level, s.state.msg+" (more of the same, counted)", fields...)
	}
}
