package sites_test

import (
	"fmt"
	"net"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.uber.org/zap"
	"go.uber.org/zap/zaptest/observer"

	"github.com/outpost-metal/outpost/controller/sites"
)

// fakeClock is a clock tests move by hand.
type fakeClock struct {
	mu  sync.Mutex
	now time.Time
}

func newFakeClock() *fakeClock { return &fakeClock{now: time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)} }

func (c *fakeClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()

	return c.now
}

func (c *fakeClock) Add(d time.Duration) {
	c.mu.Lock()
	c.now = c.now.Add(d)
	c.mu.Unlock()
}

func TestAdmissionHandshakeLimits(t *testing.T) {
	t.Parallel()

	for _, tc := range []struct {
		name string
		run  func(t *testing.T, a *sites.Admission, clock *fakeClock)
	}{
		{"per source at once", func(t *testing.T, a *sites.Admission, _ *fakeClock) {
			var held []func()

			for range 3 {
				release, r := a.Admit("192.0.2.1")
				require.Nil(t, r)

				held = append(held, release)
			}

			_, r := a.Admit("192.0.2.1")
			require.Equal(t, "source_handshakes", r.Metric)
			require.Contains(t, r.Reason, "3 connections from 192.0.2.1 are still in TLS or hello (limit 3 per address, --uplink-source-handshakes)")

			// Another address is not affected; the first gets its share back as handshakes end.
			_, r = a.Admit("192.0.2.2")
			require.Nil(t, r)

			held[0]()
			held[0]() // twice is harmless

			_, r = a.Admit("192.0.2.1")
			require.Nil(t, r)
		}},
		{"per source rate", func(t *testing.T, a *sites.Admission, clock *fakeClock) {
			for i := range 5 { // the burst
				release, r := a.Admit("192.0.2.1")
				require.Nil(t, r, "connection %d", i)
				release()
			}

			_, r := a.Admit("192.0.2.1")
			require.Equal(t, "source_rate", r.Metric)
			require.Contains(t, r.Reason, "faster than 2 a second (5 at once")

			clock.Add(time.Second) // two more

			for range 2 {
				release, r := a.Admit("192.0.2.1")
				require.Nil(t, r)
				release()
			}

			_, r = a.Admit("192.0.2.1")
			require.Equal(t, "source_rate", r.Metric)
		}},
		{"refused after TLS costs more", func(t *testing.T, a *sites.Admission, clock *fakeClock) {
			release, r := a.Admit("192.0.2.1")
			require.Nil(t, r)
			release()
			a.Penalize("192.0.2.1") // 1 + 4 of the burst of 5 spent

			_, r = a.Admit("192.0.2.1")
			require.Equal(t, "source_rate", r.Metric)
			require.Contains(t, r.Reason, "each refused after TLS counts 4 more")

			// Debt is bounded at one burst: a source refused many times gets its rate back soon.
			for range 100 {
				a.Penalize("192.0.2.1")
			}

			clock.Add(3 * time.Second) // -5 + 6

			_, r = a.Admit("192.0.2.1")
			require.Nil(t, r)
		}},
		{"over all sources", func(t *testing.T, a *sites.Admission, _ *fakeClock) {
			var held []func()

			for i := range 8 {
				release, r := a.Admit(fmt.Sprintf("192.0.2.%d", i))
				require.Nil(t, r)

				held = append(held, release)
			}

			_, r := a.Admit("198.51.100.1")
			require.Equal(t, "overload", r.Metric)
			require.Contains(t, r.Reason, "8 connections are in TLS or hello at once (limit 8, --uplink-max-handshakes)")

			held[3]()

			_, r = a.Admit("198.51.100.1")
			require.Nil(t, r)
		}},
		{"sources counted are bounded", func(t *testing.T, a *sites.Admission, clock *fakeClock) {
			for i := range 16 {
				release, r := a.Admit(fmt.Sprintf("203.0.113.%d", i))
				require.Nil(t, r)
				release()
			}

			_, r := a.Admit("198.51.100.1")
			require.Equal(t, "sources_full", r.Metric)

			// Once their buckets are full again, idle sources are forgotten to make room.
			clock.Add(3 * time.Second)

			_, r = a.Admit("198.51.100.1")
			require.Nil(t, r)

			sources, _ := a.Tracked()
			require.Equal(t, 1, sources)
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()

			clock := newFakeClock()
			a := sites.NewAdmission(sites.Limits{
				MaxHandshakes: 8, SourceHandshakes: 3, SourceRate: 2, SourceBurst: 5, RefusalCost: 4, MaxSources: 16,
			}, clock.Now)
			tc.run(t, a, clock)
		})
	}
}

func TestAdmissionTokenLockouts(t *testing.T) {
	t.Parallel()

	lim := sites.Limits{SourceTokenFailures: 3, SiteTokenFailures: 5, TokenFailureWindow: time.Minute, SourceLockout: 10 * time.Minute, SiteLockout: 2 * time.Minute}

	t.Run("source", func(t *testing.T) {
		t.Parallel()

		clock := newFakeClock()
		a := sites.NewAdmission(lim, clock.Now)

		for range 2 {
			src, site := a.TokenFailed("192.0.2.1", "s", false)
			require.False(t, src || site)
		}

		require.Nil(t, a.EnrollLockout("192.0.2.1", "s"))

		src, _ := a.TokenFailed("192.0.2.1", "s", false)
		require.True(t, src, "the third wrong token locks the source out")

		r := a.EnrollLockout("192.0.2.1", "any-site")
		require.Equal(t, "locked_source", r.Metric)
		require.Equal(t, 10*time.Minute, r.RetryAfter)
		require.Contains(t, r.Reason, "too many wrong join tokens from 192.0.2.1 (3 within 1m0s): enrolment from this address is locked until 2026-01-02T03:14:05Z")
		require.Nil(t, a.EnrollLockout("192.0.2.2", "any-site"), "other addresses may enrol")

		clock.Add(9 * time.Minute)
		require.Equal(t, time.Minute, a.EnrollLockout("192.0.2.1", "s").RetryAfter)

		clock.Add(time.Minute)
		require.Nil(t, a.EnrollLockout("192.0.2.1", "s"))
	})

	t.Run("window", func(t *testing.T) {
		t.Parallel()

		clock := newFakeClock()
		a := sites.NewAdmission(lim, clock.Now)

		// Two wrong tokens a window apart never add up to three.
		for range 6 {
			a.TokenFailed("192.0.2.1", "s", false)
			a.TokenFailed("192.0.2.1", "s", false)
			clock.Add(time.Minute)
		}

		require.Nil(t, a.EnrollLockout("192.0.2.1", "s"))

		// A success forgets the count.
		a.TokenFailed("192.0.2.1", "s", false)
		a.TokenFailed("192.0.2.1", "s", false)
		a.TokenSucceeded("192.0.2.1", "s")

		src, _ := a.TokenFailed("192.0.2.1", "s", false)
		require.False(t, src)
	})

	t.Run("site", func(t *testing.T) {
		t.Parallel()

		clock := newFakeClock()
		a := sites.NewAdmission(lim, clock.Now)

		var siteLocked bool

		for i := range 5 { // from five addresses, none of them locked out itself
			_, siteLocked = a.TokenFailed(fmt.Sprintf("192.0.2.%d", i), "target", true)
		}

		require.True(t, siteLocked)

		r := a.EnrollLockout("198.51.100.7", "target")
		require.Equal(t, "locked_site", r.Metric)
		require.Equal(t, 2*time.Minute, r.RetryAfter)
		require.Contains(t, r.Reason, `too many wrong join tokens for site "target"`)
		require.Nil(t, a.EnrollLockout("198.51.100.7", "other"))

		// Wrong tokens for sites that do not exist are counted per source only.
		a.TokenFailed("192.0.2.200", "no-such-site", false)
		require.Nil(t, a.EnrollLockout("198.51.100.7", "no-such-site"))

		clock.Add(2 * time.Minute)
		require.Nil(t, a.EnrollLockout("198.51.100.7", "target"))

		clock.Add(time.Hour)
		a.Sweep()

		sources, sitesCounted := a.Tracked()
		require.Zero(t, sources)
		require.Zero(t, sitesCounted)
	})
}

func TestAdmissionEnrollSessions(t *testing.T) {
	t.Parallel()

	clock := newFakeClock()
	a := sites.NewAdmission(sites.Limits{MaxEnrollSessions: 4, SourceEnrollSessions: 2, SiteEnrollSessions: 2, RetryAfter: 7 * time.Second}, clock.Now)

	// Enrolment is asked for by connections that hold a handshake.
	for _, src := range []string{"a", "b", "c"} {
		_, r := a.Admit(src)
		require.Nil(t, r)
	}

	var held []func()

	take := func(src, site string) *sites.Refusal {
		release, r := a.AcquireEnroll(src, site)
		if r == nil {
			held = append(held, release)
		}

		return r
	}

	require.Nil(t, take("a", "s1"))
	require.Nil(t, take("a", "s2"))

	r := take("a", "s3")
	require.Equal(t, "enroll_source", r.Metric)
	require.Equal(t, 7*time.Second, r.RetryAfter)
	require.Contains(t, r.Reason, "a already has 2 enrolment sessions open (limit 2 per address, --uplink-source-enrollments): retry in 7s")

	require.Nil(t, take("b", "s1"))

	r = take("c", "s1")
	require.Equal(t, "enroll_site", r.Metric)
	require.Contains(t, r.Reason, "its join token may have leaked")

	require.Nil(t, take("c", "s3"))

	r = take("c", "s4")
	require.Equal(t, "enroll_overload", r.Metric, "four are open in all")

	held[0]() // a, s1
	require.Nil(t, take("c", "s4"))
}

func TestSourceKey(t *testing.T) {
	t.Parallel()

	for _, tc := range []struct {
		name string
		addr net.Addr
		want string
	}{
		{"ipv4", &net.TCPAddr{IP: net.ParseIP("192.0.2.7"), Port: 5000}, "192.0.2.7"},
		{"ipv4 mapped", &net.TCPAddr{IP: net.ParseIP("::ffff:192.0.2.7"), Port: 5000}, "192.0.2.7"},
		{"ipv6 by /64", &net.TCPAddr{IP: net.ParseIP("2001:db8:1:2:aaaa:bbbb:cccc:dddd"), Port: 5000}, "2001:db8:1:2::/64"},
		{"ipv6 same /64", &net.TCPAddr{IP: net.ParseIP("2001:db8:1:2::1"), Port: 1}, "2001:db8:1:2::/64"},
		{"not ip", &net.UnixAddr{Name: "/run/x.sock", Net: "unix"}, "/run/x.sock"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()

			require.Equal(t, tc.want, sites.SourceKey(tc.addr))
		})
	}
}

func TestRejectLogOneLinePerReasonAndInterval(t *testing.T) {
	t.Parallel()

	core, logs := observer.New(zap.InfoLevel)
	clock := newFakeClock()
	l := sites.NewRejectLog(zap.New(core), 10*time.Second, clock.Now)

	for i := range 1000 {
		l.Reject("overload", "too many", fmt.Sprintf("192.0.2.%d:1", i%250))
	}

	l.Reject("revoked", `site "x" has been revoked`, "198.51.100.1:1")

	require.Equal(t, 2, logs.Len(), "the first of each reason is logged at once")
	require.Equal(t, "too many", logs.All()[0].ContextMap()["reason"])

	l.Flush()
	require.Equal(t, 3, logs.Len(), "one line counts the rest")

	summary := logs.All()[2]
	require.Equal(t, "uplink connection rejected (more of the same, counted)", summary.Message)
	require.EqualValues(t, 999, summary.ContextMap()["count"])
	require.Equal(t, "overload", summary.ContextMap()["reason_code"])
	require.Equal(t, "192.0.2.249:1", summary.ContextMap()["last_remote"])

	// A flood that goes on gives one line per interval.
	for range 10 {
		for range 500 {
			l.Reject("overload", "too many", "192.0.2.1:1")
		}

		clock.Add(10 * time.Second)
		l.Flush()
	}

	require.Equal(t, 13, logs.Len())

	// A quiet reason is logged at once again.
	clock.Add(time.Minute)
	l.Reject("revoked", `site "x" has been revoked`, "198.51.100.1:1")
	require.Equal(t, 14, logs.Len())
}

func TestLimitsValidate(t *testing.T) {
	t.Parallel()

	require.NoError(t, sites.DefaultLimits().Validate())
	require.NoError(t, sites.Limits{}.Validate(), "zero fields are defaults")

	for _, tc := range []struct {
		name string
		lim  sites.Limits
		want string
	}{
		{"negative", sites.Limits{MaxHandshakes: -1}, "max handshakes must not be negative"},
		{"tls longer than handshake", sites.Limits{TLSTimeout: 10 * time.Second}, "TLS timeout 10s is longer than the handshake timeout 5s"},
		{"source above all", sites.Limits{MaxHandshakes: 8}, "handshakes per source (16) exceed the handshakes at once (8)"},
		{"enrol above all", sites.Limits{MaxEnrollSessions: 2}, "enrolment sessions per source (4) or per site (4) exceed the sessions at once (2)"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()

			require.ErrorContains(t, tc.lim.Validate(), tc.want)
		})
	}
}
