package bmc_test

import (
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
	"go.uber.org/zap/zaptest/observer"

	"github.com/outpost-metal/outpost/edge/bmc"
	"github.com/outpost-metal/outpost/edge/bmc/internal/fakebmc"
)

// fakeClock is an injectable clock that only moves when told.
type fakeClock struct{ offset atomic.Int64 }

func (c *fakeClock) now() time.Time          { return time.Now().Add(time.Duration(c.offset.Load())) }
func (c *fakeClock) advance(d time.Duration) { c.offset.Add(int64(d)) }

const fallbackMsg = "bmc refused the preferred ipmi cipher suite; falling back and remembering it"

// TestCipherSuiteFallbackRemembered: a BMC that refuses suite 17 is asked for it once, the fallback to 3 is logged
// once (info), and later sessions go straight to 3 until the memory expires; then 17 is asked once more and the
// unchanged answer is logged at debug level only.
func TestCipherSuiteFallbackRemembered(t *testing.T) {
	t.Parallel()

	b := fakebmc.Start(t, fakebmc.Options{User: creds.Username, Password: creds.Password, CipherSuites: []uint8{3}})
	tgt := bmc.Target{Host: "127.0.0.1", IPMIPort: b.Port, Protocol: bmc.ProtocolIPMI}

	clock := &fakeClock{}
	core, logs := observer.New(zapcore.DebugLevel)
	cfg := bmc.Default()
	cfg.ProbeTTL = 10 * time.Minute
	cfg.RatePerSecond, cfg.Burst = 100, 10

	m, err := bmc.New(cfg, zap.New(core), clock.now)
	require.NoError(t, err)
	t.Cleanup(m.Close)

	session := func() {
		t.Helper()

		_, err := m.PowerStatus(t.Context(), tgt, creds)
		require.NoError(t, err)
		m.Close() // the next call opens a new session
	}

	fallbacks := func(level zapcore.Level) int {
		n := 0

		for _, e := range logs.FilterMessage(fallbackMsg).All() {
			if e.Level == level {
				n++
			}
		}

		return n
	}

	_, ok := m.IPMICipherSuite(tgt)
	require.False(t, ok)

	session()
	require.Equal(t, 1, b.OpenSessions(fakebmc.AuthHMACSHA256), "17 asked")
	require.Equal(t, 1, b.OpenSessions(fakebmc.AuthHMACSHA1), "then 3")
	require.Equal(t, 1, fallbacks(zapcore.InfoLevel))

	suite, ok := m.IPMICipherSuite(tgt)
	require.True(t, ok)
	require.Equal(t, uint8(3), suite)

	entry := logs.FilterMessage(fallbackMsg).All()[0].ContextMap()
	require.EqualValues(t, 3, entry["cipher_suite"])
	require.Equal(t, "127.0.0.1", entry["bmc"])

	for range 3 {
		session()
	}

	require.Equal(t, 1, b.OpenSessions(fakebmc.AuthHMACSHA256), "17 not asked again while remembered")
	require.Equal(t, 4, b.OpenSessions(fakebmc.AuthHMACSHA1))
	require.Equal(t, 1, fallbacks(zapcore.InfoLevel), "logged once")
	require.Zero(t, logs.FilterLevelExact(zapcore.WarnLevel).Len())

	// The memory expires: 17 is asked once more, still refused, remembered again, at debug level.
	clock.advance(11 * time.Minute)

	_, ok = m.IPMICipherSuite(tgt)
	require.False(t, ok, "expired")

	session()
	require.Equal(t, 2, b.OpenSessions(fakebmc.AuthHMACSHA256))
	require.Equal(t, 1, fallbacks(zapcore.InfoLevel))
	require.Equal(t, 1, fallbacks(zapcore.DebugLevel))

	session()
	require.Equal(t, 2, b.OpenSessions(fakebmc.AuthHMACSHA256), "remembered again")
}

// TestCipherSuiteNothingToRemember: a BMC that accepts 17 is never asked for 3 and nothing is logged.
func TestCipherSuiteNothingToRemember(t *testing.T) {
	t.Parallel()

	b := fakebmc.Start(t, fakebmc.Options{User: creds.Username, Password: creds.Password})
	tgt := bmc.Target{Host: "127.0.0.1", IPMIPort: b.Port, Protocol: bmc.ProtocolIPMI}

	core, logs := observer.New(zapcore.DebugLevel)

	m, err := bmc.New(bmc.Default(), zap.New(core), nil)
	require.NoError(t, err)
	t.Cleanup(m.Close)

	for range 2 {
		_, err := m.PowerStatus(t.Context(), tgt, creds)
		require.NoError(t, err)
		m.Close()
	}

	require.Equal(t, 2, b.OpenSessions(fakebmc.AuthHMACSHA256))
	require.Zero(t, b.OpenSessions(fakebmc.AuthHMACSHA1))
	require.Zero(t, logs.FilterMessage(fallbackMsg).Len())

	_, ok := m.IPMICipherSuite(tgt)
	require.False(t, ok)
}
