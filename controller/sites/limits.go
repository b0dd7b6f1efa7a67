package sites

import (
	"errors"
	"fmt"
	"time"
)

// Limits bound what clients that have not proven who they are can hold on the uplink port, and how often
// join tokens may be wrong. They are sized for a fleet: hundreds of edges reconnecting at once after a
// controller restart get in within seconds, while an idle or hostile source holds only its own share.
// A zero field means its default (DefaultLimits).
type Limits struct {
	// TLSTimeout is how long a new connection has, from accept, to complete the TLS handshake; it is closed after.
	TLSTimeout time.Duration
	// HandshakeTimeout is how long a new connection has, from accept, to complete TLS and send its hello.
	HandshakeTimeout time.Duration
	// MaxHandshakes bounds connections in TLS or hello at once, over all sources; more are closed at accept.
	MaxHandshakes int
	// SourceHandshakes bounds connections in TLS or hello at once from one source (an IPv4 address or an IPv6 /64).
	SourceHandshakes int
	// SourceRate is how many connections per second one source may open on average, SourceBurst at once.
	SourceRate  int
	SourceBurst int
	// RefusalCost is how many connections of its source's rate a connection refused after TLS costs besides its
	// own (a TLS handshake spent on nothing): an address that is only refused gets about SourceRate/(1+RefusalCost)
	// handshakes a second, an edge refused once in a while does not notice.
	RefusalCost int

	// MaxEnrollSessions bounds enrolment sessions at once; SourceEnrollSessions and SiteEnrollSessions bound
	// them per source and per site. Enrolment sessions are given only to a hello with a valid join token.
	MaxEnrollSessions    int
	SourceEnrollSessions int
	SiteEnrollSessions   int
	// EnrollTimeout is the lifetime of an enrolment session (one Enroll call).
	EnrollTimeout time.Duration

	// SourceTokenFailures wrong join tokens from one source within TokenFailureWindow lock that source out of
	// enrolment for SourceLockout; SiteTokenFailures wrong tokens for one site lock that site's enrolment for SiteLockout.
	SourceTokenFailures int
	SiteTokenFailures   int
	TokenFailureWindow  time.Duration
	SourceLockout       time.Duration
	SiteLockout         time.Duration

	// RetryAfter is the wait an OVERLOADED reply asks of the edge (the edge adds jitter).
	RetryAfter time.Duration
	// RejectLogInterval is how often each reason of refusal is logged at most; the others are counted in one line.
	RejectLogInterval time.Duration
	// MaxSources bounds the sources whose counts are kept at once (connections from new sources are refused beyond it).
	MaxSources int
}

// DefaultLimits returns the default limits.
//
// Why these values: a TLS 1.3 handshake needs one round trip after accept, so 3 s leaves a slow satellite link
// room for a lost packet while an idle connection is gone before it matters. 1024 handshakes at once admit a
// 500-site fleet reconnecting in the same instant twice over; 16 per source and 20 new connections a second
// (40 at once) let a NAT with dozens of edges through while one attacking address holds 16 slots for 3 s at most;
// an address that is only ever refused after TLS is charged ten connections for each, so it makes the controller
// do about two handshakes a second, not twenty.
// An enrolment is one call that takes milliseconds, so 64 sessions of at most 15 s (4 per source, 4 per site)
// never turn a real edge away for long. Join tokens hold 256 random bits: guessing is hopeless, so the lockouts
// (5 wrong tokens from one address in 10 minutes lock it out for 5 minutes; 20 for one site pause that site's
// enrolment for a minute) bound the cost of trying, not the odds.
func DefaultLimits() Limits {
	return Limits{
		TLSTimeout:           3 * time.Second,
		HandshakeTimeout:     5 * time.Second,
		MaxHandshakes:        1024,
		SourceHandshakes:     16,
		SourceRate:           20,
		SourceBurst:          40,
		RefusalCost:          10,
		MaxEnrollSessions:    64,
		SourceEnrollSessions: 4,
		SiteEnrollSessions:   4,
		EnrollTimeout:        15 * time.Second,
		SourceTokenFailures:  5,
		SiteTokenFailures:    20,
		TokenFailureWindow:   10 * time.Minute,
		SourceLockout:        5 * time.Minute,
		SiteLockout:          time.Minute,
		RetryAfter:           5 * time.Second,
		RejectLogInterval:    10 * time.Second,
		MaxSources:           1 << 16,
	}
}

// withDefaults returns l with every zero field set to its default.
func (l Limits) withDefaults() Limits {
	d := DefaultLimits()

	setDuration := func(v *time.Duration, def time.Duration) {
		if *v == 0 {
			*v = def
		}
	}

	setInt := func(v *int, def int) {
		if *v == 0 {
			*v = def
		}
	}

	setDuration(&l.TLSTimeout, d.TLSTimeout)
	setDuration(&l.HandshakeTimeout, d.HandshakeTimeout)
	setInt(&l.MaxHandshakes, d.MaxHandshakes)
	setInt(&l.SourceHandshakes, d.SourceHandshakes)
	setInt(&l.SourceRate, d.SourceRate)
	setInt(&l.SourceBurst, d.SourceBurst)
	setInt(&l.RefusalCost, d.RefusalCost)
	setInt(&l.MaxEnrollSessions, d.MaxEnrollSessions)
	setInt(&l.SourceEnrollSessions, d.SourceEnrollSessions)
	setInt(&l.SiteEnrollSessions, d.SiteEnrollSessions)
	setDuration(&l.EnrollTimeout, d.EnrollTimeout)
	setInt(&l.SourceTokenFailures, d.SourceTokenFailures)
	setInt(&l.SiteTokenFailures, d.SiteTokenFailures)
	setDuration(&l.TokenFailureWindow, d.TokenFailureWindow)
	setDuration(&l.SourceLockout, d.SourceLockout)
	setDuration(&l.SiteLockout, d.SiteLockout)
	setDuration(&l.RetryAfter, d.RetryAfter)
	setDuration(&l.RejectLogInterval, d.RejectLogInterval)
	setInt(&l.MaxSources, d.MaxSources)

	return l
}

// Validate checks the limits (zero fields count as their defaults) and says what is wrong with them.
func (l Limits) Validate() error {
	var errs []error

	for _, v := range []struct {
		name string
		val  int64
	}{
		{"TLS timeout", int64(l.TLSTimeout)},
		{"handshake timeout", int64(l.HandshakeTimeout)},
		{"max handshakes", int64(l.MaxHandshakes)},
		{"handshakes per source", int64(l.SourceHandshakes)},
		{"connection rate per source", int64(l.SourceRate)},
		{"connection burst per source", int64(l.SourceBurst)},
		{"refusal cost", int64(l.RefusalCost)},
		{"max enrolment sessions", int64(l.MaxEnrollSessions)},
		{"enrolment sessions per source", int64(l.SourceEnrollSessions)},
		{"enrolment sessions per site", int64(l.SiteEnrollSessions)},
		{"enrolment timeout", int64(l.EnrollTimeout)},
		{"wrong tokens per source", int64(l.SourceTokenFailures)},
		{"wrong tokens per site", int64(l.SiteTokenFailures)},
		{"wrong token window", int64(l.TokenFailureWindow)},
		{"source lockout", int64(l.SourceLockout)},
		{"site lockout", int64(l.SiteLockout)},
		{"retry after", int64(l.RetryAfter)},
		{"reject log interval", int64(l.RejectLogInterval)},
		{"max sources", int64(l.MaxSources)},
	} {
		if v.val < 0 {
			errs = append(errs, fmt.Errorf("uplink %s must not be negative", v.name))
		}
	}

	if err := errors.Join(errs...); err != nil {
		return err
	}

	l = l.withDefaults()

	if l.TLSTimeout > l.HandshakeTimeout {
		errs = append(errs, fmt.Errorf("uplink TLS timeout %s is longer than the handshake timeout %s, which includes it", l.TLSTimeout, l.HandshakeTimeout))
	}

	if l.SourceHandshakes > l.MaxHandshakes {
		errs = append(errs, fmt.Errorf("uplink handshakes per source (%d) exceed the handshakes at once (%d)", l.SourceHandshakes, l.MaxHandshakes))
	}

	if l.SourceEnrollSessions > l.MaxEnrollSessions || l.SiteEnrollSessions > l.MaxEnrollSessions {
		errs = append(errs, fmt.Errorf("uplink enrolment sessions per source (%d) or per site (%d) exceed the sessions at once (%d)",
			l.SourceEnrollSessions, l.SiteEnrollSessions, l.MaxEnrollSessions))
	}

	return errors.Join(errs...)
}
