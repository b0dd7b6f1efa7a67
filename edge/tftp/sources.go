package tftp

import (
	"container/list"
	"net/netip"
	"time"
)

// sourceRates bounds the requests per second of each source address with a token bucket per address. It
// remembers at most max addresses, the least recently seen forgotten first: a flood with forged sources cycles
// through the table without growing it, and a forgotten address starts again with a full bucket. Not safe for
// concurrent use (the filter's read loop owns it).
type sourceRates struct {
	rate  float64 // tokens per second
	burst float64
	max   int

	byAddr map[netip.Addr]*list.Element
	recent list.List // of *bucket, most recently seen first
}

type bucket struct {
	addr   netip.Addr
	tokens float64
	last   time.Time
}

func newSourceRates(perSecond, burst, maxSources int) *sourceRates {
	return &sourceRates{
		rate: float64(perSecond), burst: float64(burst), max: maxSources,
		byAddr: make(map[netip.Addr]*list.Element, maxSources),
	}
}

// allow takes a token from addr's bucket and reports whether there was one.
func (s *sourceRates) allow(addr netip.Addr, now time.Time) bool {
	e, ok := s.byAddr[addr]

	switch {
	case ok:
		s.recent.MoveToFront(e)
	case s.recent.Len() >= s.max:
		// Reuse the least recently seen address's bucket: no allocation while a flood cycles through.
		e = s.recent.Back()
		old := e.Value.(*bucket) // the list holds only *bucket
		delete(s.byAddr, old.addr)
		*old = bucket{addr: addr, tokens: s.burst, last: now}
		s.byAddr[addr] = e
		s.recent.MoveToFront(e)
	default:
		e = s.recent.PushFront(&bucket{addr: addr, tokens: s.burst, last: now})
		s.byAddr[addr] = e
	}

	b := e.Value.(*bucket) // the list holds only *bucket

	if d := now.Sub(b.last); d > 0 {
		b.tokens = min(s.burst, b.tokens+d.Seconds()*s.rate)
		b.last = now
	}

	if b.tokens < 1 {
		return false
	}

	b.tokens--

	return true
}
