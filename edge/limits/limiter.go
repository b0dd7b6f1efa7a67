// Package limits bounds what the site network can make the edge hold: a Limiter counts the holdings
// (connections, transfers, tunnels) of each source address and of all of them together and refuses beyond
// its bounds, a Listener applies one to accepted connections, and a RejectLog keeps the refusals' log lines
// to one per reason per interval.
package limits

import (
	"container/list"
	"errors"
	"fmt"
	"net/netip"
	"sync"

	"github.com/prometheus/client_golang/prometheus"
)

// Config bounds what sources may hold at once. A zero field means no bound.
type Config struct {
	// Total bounds what all sources together hold.
	Total int
	// PerSource bounds what one source address holds.
	PerSource int
}

// Validate checks the configuration.
func (c Config) Validate() error {
	if c.Total < 0 || c.PerSource < 0 {
		return fmt.Errorf("limits %d total and %d per source: must not be negative", c.Total, c.PerSource)
	}

	if c.Total > 0 && c.PerSource > c.Total {
		return fmt.Errorf("per-source limit %d above the total limit %d", c.PerSource, c.Total)
	}

	return nil
}

// Reason names the bound that refused or made room; it is the "reason" label of a Limiter's counters.
type Reason string

// The bounds of a Limiter.
const (
	PerSource Reason = "per_source"
	Total     Reason = "total"
)

// RefusedError is returned by Acquire when a bound is reached and no evictable holding can make room.
type RefusedError struct {
	Reason Reason
	Limit  int
	Source netip.Addr
}

func (e *RefusedError) Error() string {
	if e.Reason == PerSource {
		return fmt.Sprintf("%s already holds %d (per-source limit)", e.Source, e.Limit)
	}

	return fmt.Sprintf("%d held in total (total limit)", e.Limit)
}

// AsRefused returns the refusal err is or wraps, if any.
func AsRefused(err error) (*RefusedError, bool) {
	var re *RefusedError

	ok := errors.As(err, &re)

	return re, ok
}

// Limiter counts what each source address holds and refuses beyond Config's bounds.
//
// A holding acquired with an evict function can be marked evictable: its holder has not yet shown it is a
// live client (a TFTP request not acknowledged yet, a connection that never got a response) or is idle.
// When a bound is reached, the oldest evictable holding makes room: the source's own at the per-source
// bound, anyone's at the total bound. A flood of requests that never go further therefore displaces its own
// kind, oldest first, and a client that answers within the time the flood takes to cycle through the bound
// keeps its place. Holdings that are not evictable are never displaced. A Limiter is safe for concurrent use.
type Limiter struct {
	cfg Config

	mu        sync.Mutex
	total     int
	sources   map[netip.Addr]*source
	evictable list.List // of *Slot, longest evictable first
	refused   map[Reason]int64
	evicted   map[Reason]int64
	peak      int
}

type source struct {
	n         int
	evictable list.List // of *Slot
}

// New returns a Limiter with cfg's bounds (see Config.Validate).
func New(cfg Config) *Limiter {
	return &Limiter{cfg: cfg, sources: map[netip.Addr]*source{}, refused: map[Reason]int64{}, evicted: map[Reason]int64{}}
}

// Config returns the Limiter's bounds.
func (l *Limiter) Config() Config { return l.cfg }

// Slot is one holding; Release gives it back.
type Slot struct {
	l      *Limiter
	src    netip.Addr
	evict  func()
	global *list.Element
	local  *list.Element
	gone   bool
}

// Acquire takes a holding for src, evicting the oldest evictable holding when a bound is reached, or returns
// a *RefusedError. An invalid src (a peer without an IP address) is bound by the total only. evict, when not nil, is how the holding is ended if it is ever evicted: it is called without
// the Limiter's lock held, must not block and need not call Release. A new holding with an evict function
// starts evictable; the holder calls SetEvictable(false) once its client has shown it is live.
func (l *Limiter) Acquire(src netip.Addr, evict func()) (*Slot, error) {
	src = src.Unmap()

	l.mu.Lock()

	st := l.sources[src]
	if st == nil {
		st = &source{}
	}

	var victim *Slot

	switch {
	case l.cfg.PerSource > 0 && src.IsValid() && st.n >= l.cfg.PerSource:
		e := st.evictable.Front()
		if e == nil {
			l.refused[PerSource]++
			l.mu.Unlock()

			return nil, &RefusedError{Reason: PerSource, Limit: l.cfg.PerSource, Source: src}
		}

		victim = e.Value.(*Slot) // the lists hold only *Slot
		l.evicted[PerSource]++
	case l.cfg.Total > 0 && l.total >= l.cfg.Total:
		e := l.evictable.Front()
		if e == nil {
			l.refused[Total]++
			l.mu.Unlock()

			return nil, &RefusedError{Reason: Total, Limit: l.cfg.Total, Source: src}
		}

		victim = e.Value.(*Slot) // the lists hold only *Slot
		l.evicted[Total]++
	}

	if victim != nil {
		l.releaseLocked(victim)
	}

	// The victim may have been this source's last holding.
	st = l.sources[src]
	if st == nil {
		st = &source{}
		l.sources[src] = st
	}

	s := &Slot{l: l, src: src, evict: evict}
	st.n++
	l.total++
	l.peak = max(l.peak, l.total)

	if evict != nil {
		s.global = l.evictable.PushBack(s)
		s.local = st.evictable.PushBack(s)
	}

	l.mu.Unlock()

	if victim != nil {
		victim.evict()
	}

	return s, nil
}

// SetEvictable marks the holding evictable (its client is idle or has not shown it is live) or not. A holding
// that becomes evictable joins the end of the line. Holdings acquired without an evict function are never evictable.
func (s *Slot) SetEvictable(on bool) {
	if s == nil || s.evict == nil {
		return
	}

	l := s.l

	l.mu.Lock()
	defer l.mu.Unlock()

	if s.gone || on == (s.global != nil) {
		return
	}

	st := l.sources[s.src]

	if on {
		s.global = l.evictable.PushBack(s)
		s.local = st.evictable.PushBack(s)

		return
	}

	l.evictable.Remove(s.global)
	st.evictable.Remove(s.local)
	s.global, s.local = nil, nil
}

// Release gives the holding back; it may be called more than once, and after an eviction.
func (s *Slot) Release() {
	if s == nil {
		return
	}

	s.l.mu.Lock()
	defer s.l.mu.Unlock()

	s.l.releaseLocked(s)
}

func (l *Limiter) releaseLocked(s *Slot) {
	if s.gone {
		return
	}

	s.gone = true
	st := l.sources[s.src]

	if s.global != nil {
		l.evictable.Remove(s.global)
		st.evictable.Remove(s.local)
		s.global, s.local = nil, nil
	}

	st.n--
	l.total--

	if st.n == 0 {
		delete(l.sources, s.src)
	}
}

// Stats is a snapshot of a Limiter.
type Stats struct {
	// Held is what all sources hold now; Peak the most they held at once; Sources how many addresses hold anything.
	Held, Peak, Sources int
	// Evictable is how many of the holdings could make room now.
	Evictable int
	// Refused and Evicted count, by bound, the acquisitions refused and the holdings evicted so far.
	Refused, Evicted map[Reason]int64
}

// Stats returns a snapshot of the counts.
func (l *Limiter) Stats() Stats {
	l.mu.Lock()
	defer l.mu.Unlock()

	st := Stats{
		Held: l.total, Peak: l.peak, Sources: len(l.sources), Evictable: l.evictable.Len(),
		Refused: map[Reason]int64{}, Evicted: map[Reason]int64{},
	}

	for r, n := range l.refused {
		st.Refused[r] = n
	}

	for r, n := range l.evicted {
		st.Evicted[r] = n
	}

	return st
}

// Held returns what src holds now.
func (l *Limiter) Held(src netip.Addr) int {
	l.mu.Lock()
	defer l.mu.Unlock()

	if st := l.sources[src.Unmap()]; st != nil {
		return st.n
	}

	return 0
}

// Collector returns the Limiter's metrics for the caller to register: <name>_held (gauge),
// <name>_refused_total and <name>_evicted_total (by reason). what says what is held ("HTTP connections").
func (l *Limiter) Collector(name, what string) prometheus.Collector {
	return &collector{
		l:       l,
		held:    prometheus.NewDesc(name+"_held", what+" held now.", nil, nil),
		refused: prometheus.NewDesc(name+"_refused_total", what+" refused at a limit, by reason (per_source, total).", []string{"reason"}, nil),
		evicted: prometheus.NewDesc(name+"_evicted_total", what+" ended early to make room (never acknowledged or idle), by the limit reached.", []string{"reason"}, nil),
	}
}

type collector struct {
	l                      *Limiter
	held, refused, evicted *prometheus.Desc
}

func (c *collector) Describe(ch chan<- *prometheus.Desc) {
	ch <- c.held
	ch <- c.refused
	ch <- c.evicted
}

func (c *collector) Collect(ch chan<- prometheus.Metric) {
	st := c.l.Stats()

	ch <- prometheus.MustNewConstMetric(c.held, prometheus.GaugeValue, float64(st.Held))

	for _, r := range []Reason{PerSource, Total} {
		ch <- prometheus.MustNewConstMetric(c.refused, prometheus.CounterValue, float64(st.Refused[r]), string(r))
		ch <- prometheus.MustNewConstMetric(c.evicted, prometheus.CounterValue, float64(st.Evicted[r]), string(r))
	}
}
