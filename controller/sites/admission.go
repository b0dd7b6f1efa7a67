package sites

import (
	"fmt"
	"net"
	"net/netip"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	uplinkpb "github.com/outpost-metal/outpost/shared/api/uplink"
)

// admission keeps the counts the uplink's limits are checked against: connections in TLS or hello (in all and
// per source), the connection rate per source, enrolment sessions (in all, per source and per site) and wrong
// join tokens (per source and per site) with the lockouts they cause. Every method is safe for concurrent use.
type admission struct {
	lim Limits
	now func() time.Time

	handshakesGauge prometheus.Gauge
	enrollsGauge    prometheus.Gauge

	mu         sync.Mutex
	handshakes int
	enrolls    int
	sources    map[string]*sourceState
	sites      map[string]*siteState
}

// sourceState is what is counted for one source. An entry with handshakes or enrolments in progress is never swept.
type sourceState struct {
	handshakes int
	enrolls    int
	// tokens is the connection-rate bucket, refilled at Limits.SourceRate per second up to Limits.SourceBurst.
	tokens   float64
	refilled time.Time
	failures strikes
}

type siteState struct {
	enrolls  int
	failures strikes
}

// strikes counts wrong join tokens within a window and the lockout they caused.
type strikes struct {
	count       int
	since       time.Time
	lockedUntil time.Time
}

// lockout reports whether the strikes lock enrolment out at now, and until when.
func (s *strikes) lockout(now time.Time) (time.Time, bool) {
	return s.lockedUntil, now.Before(s.lockedUntil)
}

// add counts a wrong token and reports whether it started a lockout.
func (s *strikes) add(now time.Time, limit int, window, lockout time.Duration) bool {
	if s.count == 0 || now.Sub(s.since) >= window {
		s.count, s.since = 0, now
	}

	s.count++

	if s.count < limit {
		return false
	}

	s.count = 0
	s.lockedUntil = now.Add(lockout)

	return true
}

func (s *strikes) idle(now time.Time, window time.Duration) bool {
	return !now.Before(s.lockedUntil) && (s.count == 0 || now.Sub(s.since) >= window)
}

func newAdmission(lim Limits, now func() time.Time, m *metrics) *admission {
	return &admission{
		lim:             lim,
		now:             now,
		handshakesGauge: m.handshakes,
		enrollsGauge:    m.enrollSessions,
		sources:         map[string]*sourceState{},
		sites:           map[string]*siteState{},
	}
}

// sourceKey names the source of a connection for the per-source limits: its IPv4 address, or its IPv6 /64
// (one customer's network: an attacker on IPv6 has a whole /64 to choose addresses from).
func sourceKey(addr net.Addr) string {
	if addr == nil {
		return ""
	}

	ap, err := netip.ParseAddrPort(addr.String())
	if err != nil {
		return addr.String()
	}

	ip := ap.Addr().Unmap()
	if ip.Is4() {
		return ip.String()
	}

	prefix, err := ip.WithZone("").Prefix(64)
	if err != nil {
		return ip.String()
	}

	return prefix.String()
}

// admit counts a new connection from source into the handshake limits, or says why it is refused.
// The returned release ends the connection's handshake; it may be called more than once.
func (a *admission) admit(source string) (func(), *rejection) {
	now := a.now()

	a.mu.Lock()
	defer a.mu.Unlock()

	src := a.sources[source]
	if src == nil {
		if len(a.sources) >= a.lim.MaxSources {
			a.sweepLocked(now)
		}

		if len(a.sources) >= a.lim.MaxSources {
			return nil, &rejection{
				metric: reasonSourcesFull,
				reason: fmt.Sprintf("connections from %d different addresses are being counted (limit %d, --uplink-max-sources): "+
					"a connection from a new address was closed; this is a distributed flood or the limit is too low for the fleet",
					len(a.sources), a.lim.MaxSources),
			}
		}

		src = &sourceState{tokens: float64(a.lim.SourceBurst), refilled: now}
		a.sources[source] = src
	}

	src.refill(now, a.lim)

	switch {
	case src.handshakes >= a.lim.SourceHandshakes:
		return nil, &rejection{
			metric: reasonSourceHandshakes,
			reason: fmt.Sprintf("%d connections from %s are still in TLS or hello (limit %d per address, --uplink-source-handshakes): "+
				"connection closed; if many edges share this address (NAT), raise the limit", src.handshakes, source, a.lim.SourceHandshakes),
		}
	case src.tokens < 1:
		return nil, &rejection{
			metric: reasonSourceRate,
			reason: fmt.Sprintf("%s opens connections faster than %d a second (%d at once, --uplink-source-rate, --uplink-source-burst; "+
				"each refused after TLS counts %d more): connection closed; if many edges share this address (NAT), raise the limits",
				source, a.lim.SourceRate, a.lim.SourceBurst, a.lim.RefusalCost),
		}
	case a.handshakes >= a.lim.MaxHandshakes:
		return nil, &rejection{
			metric: reasonOverload,
			reason: fmt.Sprintf("%d connections are in TLS or hello at once (limit %d, --uplink-max-handshakes): connection from %s closed; "+
				"edges retry with backoff; raise the limit if this is a fleet reconnecting rather than a flood", a.handshakes, a.lim.MaxHandshakes, source),
		}
	}

	src.tokens--
	src.handshakes++
	a.handshakes++
	a.handshakesGauge.Set(float64(a.handshakes))

	var once sync.Once

	return func() {
		once.Do(func() {
			a.mu.Lock()
			defer a.mu.Unlock()

			src.handshakes--
			a.handshakes--
			a.handshakesGauge.Set(float64(a.handshakes))
		})
	}, nil
}

func (s *sourceState) refill(now time.Time, lim Limits) {
	if elapsed := now.Sub(s.refilled); elapsed > 0 {
		s.tokens = min(float64(lim.SourceBurst), s.tokens+elapsed.Seconds()*float64(lim.SourceRate))
	}

	s.refilled = now
}

// penalize charges source's rate for a connection refused after TLS: a handshake spent on nothing. The debt is
// bounded, so a source that stops being refused gets its rate back within SourceBurst/SourceRate seconds.
func (a *admission) penalize(source string) {
	now := a.now()

	a.mu.Lock()
	defer a.mu.Unlock()

	if src := a.sources[source]; src != nil {
		src.refill(now, a.lim)
		src.tokens = max(src.tokens-float64(a.lim.RefusalCost), -float64(a.lim.SourceBurst))
	}
}

// enrollLockout says whether wrong join tokens have locked enrolment out for the source or the site.
func (a *admission) enrollLockout(source, siteID string) *rejection {
	now := a.now()

	a.mu.Lock()
	defer a.mu.Unlock()

	if src := a.sources[source]; src != nil {
		if until, locked := src.failures.lockout(now); locked {
			return &rejection{
				code:   uplinkpb.HelloReply_CODE_LOCKED_OUT,
				metric: reasonLockedSource,
				reason: fmt.Sprintf("too many wrong join tokens from %s (%d within %s): enrolment from this address is locked until %s; "+
					"check the edge's join token (`controller site token %s` makes a new one)",
					source, a.lim.SourceTokenFailures, a.lim.TokenFailureWindow, until.UTC().Format(time.RFC3339), siteID),
				reply:      true,
				retryAfter: until.Sub(now),
			}
		}
	}

	if st := a.sites[siteID]; st != nil {
		if until, locked := st.failures.lockout(now); locked {
			return &rejection{
				code:   uplinkpb.HelloReply_CODE_LOCKED_OUT,
				metric: reasonLockedSite,
				reason: fmt.Sprintf("too many wrong join tokens for site %q (%d within %s; someone may be guessing): its enrolment is paused until %s "+
					"and the edge retries by itself", siteID, a.lim.SiteTokenFailures, a.lim.TokenFailureWindow, until.UTC().Format(time.RFC3339)),
				reply:      true,
				retryAfter: until.Sub(now),
			}
		}
	}

	return nil
}

// lockouts are the lockouts a wrong join token started.
type lockouts struct {
	source, site bool
}

// tokenFailed counts a wrong join token from source, and for the site when countSite (the site exists: wrong
// tokens for sites that do not exist are counted per source only, so that they cannot grow the table).
func (a *admission) tokenFailed(source, siteID string, countSite bool) lockouts {
	now := a.now()

	a.mu.Lock()
	defer a.mu.Unlock()

	var started lockouts

	src := a.sources[source]
	if src == nil { // swept between the hello and the Enroll call; count afresh
		src = &sourceState{tokens: float64(a.lim.SourceBurst), refilled: now}
		a.sources[source] = src
	}

	started.source = src.failures.add(now, a.lim.SourceTokenFailures, a.lim.TokenFailureWindow, a.lim.SourceLockout)

	if countSite {
		st := a.site(siteID)
		started.site = st.failures.add(now, a.lim.SiteTokenFailures, a.lim.TokenFailureWindow, a.lim.SiteLockout)
	}

	return started
}

// tokenSucceeded forgets the wrong tokens counted for source and site (not a lockout in force).
func (a *admission) tokenSucceeded(source, siteID string) {
	a.mu.Lock()
	defer a.mu.Unlock()

	if src := a.sources[source]; src != nil {
		src.failures.count = 0
	}

	if st := a.sites[siteID]; st != nil {
		st.failures.count = 0
	}
}

func (a *admission) site(siteID string) *siteState {
	st := a.sites[siteID]
	if st == nil {
		st = &siteState{}
		a.sites[siteID] = st
	}

	return st
}

// acquireEnroll takes an enrolment session for source and site, or says why there is no room. The caller has
// checked the site's join token, so sites here exist.
func (a *admission) acquireEnroll(source, siteID string) (func(), *rejection) {
	a.mu.Lock()
	defer a.mu.Unlock()

	src := a.sources[source]
	if src == nil { // cannot happen while the connection holds its handshake; refuse rather than count nowhere
		return nil, &rejection{code: uplinkpb.HelloReply_CODE_OVERLOADED, metric: reasonInternal, reason: "internal: no count for " + source, reply: true, retryAfter: a.lim.RetryAfter}
	}

	st := a.site(siteID)

	overloaded := func(metric, reason string) (func(), *rejection) {
		return nil, &rejection{code: uplinkpb.HelloReply_CODE_OVERLOADED, metric: metric, reason: reason, reply: true, retryAfter: a.lim.RetryAfter}
	}

	switch {
	case a.enrolls >= a.lim.MaxEnrollSessions:
		return overloaded(reasonEnrollOverload, fmt.Sprintf("%d enrolment sessions are open (limit %d, --uplink-max-enrollments): retry in %s",
			a.enrolls, a.lim.MaxEnrollSessions, a.lim.RetryAfter))
	case src.enrolls >= a.lim.SourceEnrollSessions:
		return overloaded(reasonEnrollSource, fmt.Sprintf("%s already has %d enrolment sessions open (limit %d per address, --uplink-source-enrollments): retry in %s",
			source, src.enrolls, a.lim.SourceEnrollSessions, a.lim.RetryAfter))
	case st.enrolls >= a.lim.SiteEnrollSessions:
		return overloaded(reasonEnrollSite, fmt.Sprintf("site %q already has %d enrolment sessions open (limit %d per site): retry in %s; "+
			"if no edge of this site is enrolling, its join token may have leaked: make a new one with `controller site token %s`",
			siteID, st.enrolls, a.lim.SiteEnrollSessions, a.lim.RetryAfter, siteID))
	}

	a.enrolls++
	src.enrolls++
	st.enrolls++
	a.enrollsGauge.Set(float64(a.enrolls))

	var once sync.Once

	return func() {
		once.Do(func() {
			a.mu.Lock()
			defer a.mu.Unlock()

			a.enrolls--
			src.enrolls--
			st.enrolls--
			a.enrollsGauge.Set(float64(a.enrolls))
		})
	}, nil
}

// sweep forgets sources and sites with nothing in progress, a full rate bucket and no wrong tokens that count.
func (a *admission) sweep() {
	now := a.now()

	a.mu.Lock()
	defer a.mu.Unlock()

	a.sweepLocked(now)
}

func (a *admission) sweepLocked(now time.Time) {
	for key, src := range a.sources {
		if src.handshakes > 0 || src.enrolls > 0 || !src.failures.idle(now, a.lim.TokenFailureWindow) {
			continue
		}

		src.refill(now, a.lim)

		if src.tokens >= float64(a.lim.SourceBurst) {
			delete(a.sources, key)
		}
	}

	for id, st := range a.sites {
		if st.enrolls == 0 && st.failures.idle(now, a.lim.TokenFailureWindow) {
			delete(a.sites, id)
		}
	}
}
