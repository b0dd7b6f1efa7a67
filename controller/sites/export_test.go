package sites

import (
	"net"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
)

// Admission is the uplink's admission counts, for tests.
type Admission struct{ a *admission }

// NewAdmission returns admission counts over lim (defaults filled in) and the clock now.
func NewAdmission(lim Limits, now func() time.Time) *Admission {
	m, err := newMetrics(prometheus.NewRegistry())
	if err != nil {
		panic(err)
	}

	return &Admission{a: newAdmission(lim.withDefaults(), now, m)}
}

// Refusal is what a test sees of a rejection.
type Refusal struct {
	Metric     string
	Reason     string
	RetryAfter time.Duration
}

func refusal(r *rejection) *Refusal {
	if r == nil {
		return nil
	}

	return &Refusal{Metric: r.metric, Reason: r.reason, RetryAfter: r.retryAfter}
}

// Admit counts a new connection from source.
func (a *Admission) Admit(source string) (func(), *Refusal) {
	release, r := a.a.admit(source)

	return release, refusal(r)
}

// Penalize charges source for a connection refused after TLS.
func (a *Admission) Penalize(source string) { a.a.penalize(source) }

// EnrollLockout checks the lockouts of source and site.
func (a *Admission) EnrollLockout(source, siteID string) *Refusal {
	return refusal(a.a.enrollLockout(source, siteID))
}

// TokenFailed counts a wrong token and reports the lockouts it started.
func (a *Admission) TokenFailed(source, siteID string, countSite bool) (sourceLocked, siteLocked bool) {
	l := a.a.tokenFailed(source, siteID, countSite)

	return l.source, l.site
}

// TokenSucceeded forgets the wrong tokens counted.
func (a *Admission) TokenSucceeded(source, siteID string) { a.a.tokenSucceeded(source, siteID) }

// AcquireEnroll takes an enrolment session.
func (a *Admission) AcquireEnroll(source, siteID string) (func(), *Refusal) {
	release, r := a.a.acquireEnroll(source, siteID)

	return release, refusal(r)
}

// Sweep forgets idle sources and sites.
func (a *Admission) Sweep() { a.a.sweep() }

// Tracked returns how many sources and sites are counted.
func (a *Admission) Tracked() (int, int) {
	a.a.mu.Lock()
	defer a.a.mu.Unlock()

	return len(a.a.sources), len(a.a.sites)
}

// SourceKey is sourceKey.
func SourceKey(addr net.Addr) string { return sourceKey(addr) }

// RejectLog is the rate-limited rejection log, for tests.
type RejectLog struct{ l *rejectLog }

// NewRejectLog returns a rejection log writing to log.
func NewRejectLog(log *zap.Logger, interval time.Duration, now func() time.Time) *RejectLog {
	return &RejectLog{l: newRejectLog(log, interval, now)}
}

// Reject logs or counts one refusal at warn level.
func (l *RejectLog) Reject(reason, why, remote string) {
	l.l.reject(zapcore.WarnLevel, "uplink connection rejected", reason, why, remote, "")
}

// Flush writes the counted refusals.
func (l *RejectLog) Flush() { l.l.flush() }

// MaxHealthMessage is maxHealthMessage.
const MaxHealthMessage = maxHealthMessage
