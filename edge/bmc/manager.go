package bmc

import (
	"context"
	"crypto/subtle"
	"errors"
	"fmt"
	"net"
	"slices"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/zap"
	"golang.org/x/time/rate"

	"github.com/outpost-metal/outpost/edge/bmc/ipmi"
	"github.com/outpost-metal/outpost/edge/bmc/redfish"
	"github.com/outpost-metal/outpost/shared/metal"
)

// Manager runs BMC operations: one session and one queue per BMC.
type Manager struct {
	cfg      Config
	log      *zap.Logger
	now      func() time.Time
	failures *prometheus.CounterVec

	mu   sync.Mutex
	bmcs map[string]*entry
}

// entry is the per-BMC state. turn serializes operations: whoever holds its token owns the rest.
type entry struct {
	turn    chan struct{}
	limiter *rate.Limiter

	proto    Protocol
	probedAt time.Time
	session  PowerClient
	creds    Credentials // of session, memory only
	lastUsed time.Time

	// suite is the IPMI cipher suite this BMC fell back to (suiteSet), tried first until suiteAt+ProbeTTL.
	suite    uint8
	suiteSet bool
	suiteAt  time.Time
}

// New returns a Manager. now is the clock (nil: time.Now).
func New(cfg Config, log *zap.Logger, now func() time.Time) (*Manager, error) {
	if err := cfg.Validate(); err != nil {
		return nil, fmt.Errorf("bmc config: %w", err)
	}

	if now == nil {
		now = time.Now
	}

	return &Manager{
		cfg:  cfg,
		log:  log.With(zap.String("component", "bmc")),
		now:  now,
		bmcs: map[string]*entry{},
		failures: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "outpost_edge_bmc_calls_failed_total",
			Help: "BMC operations that failed, by reason.",
		}, []string{"reason"}),
	}, nil
}

// Collectors returns the Manager's prometheus counters for the caller to register.
func (m *Manager) Collectors() []prometheus.Collector { return []prometheus.Collector{m.failures} }

// Run closes idle sessions until ctx ends, then closes all sessions; it returns nil.
func (m *Manager) Run(ctx context.Context) error {
	tick := time.NewTicker(m.cfg.SessionIdle / 2)
	defer tick.Stop()

	for {
		select {
		case <-ctx.Done():
			m.closeSessions(0)

			return nil
		case <-tick.C:
			m.closeSessions(m.cfg.SessionIdle)
		}
	}
}

// Close closes all sessions (logging out of each BMC).
func (m *Manager) Close() { m.closeSessions(0) }

// closeSessions closes sessions idle for at least idle (0: all) whose BMC is not busy.
func (m *Manager) closeSessions(idle time.Duration) {
	m.mu.Lock()
	entries := make([]*entry, 0, len(m.bmcs))

	for _, e := range m.bmcs {
		entries = append(entries, e)
	}
	m.mu.Unlock()

	for _, e := range entries {
		select {
		case e.turn <- struct{}{}:
		default:
			continue // busy: it is not idle
		}

		if e.session != nil && (idle == 0 || m.now().Sub(e.lastUsed) >= idle) {
			m.dropSession(e)
		}

		<-e.turn
	}
}

func (m *Manager) dropSession(e *entry) {
	ctx, cancel := context.WithTimeout(context.Background(), m.cfg.ProbeTimeout)
	defer cancel()

	if err := e.session.Close(ctx); err != nil {
		m.log.Debug("bmc logout failed", zap.Error(err))
	}

	e.session = nil
	e.creds = Credentials{}
}

func (m *Manager) entry(t Target) *entry {
	m.mu.Lock()
	defer m.mu.Unlock()

	e, ok := m.bmcs[t.key()]
	if !ok {
		e = &entry{turn: make(chan struct{}, 1), limiter: m.cfg.limiter()}
		m.bmcs[t.key()] = e
	}

	return e
}

// PowerStatus reports whether the machine behind t is on.
func (m *Manager) PowerStatus(ctx context.Context, t Target, c Credentials) (on bool, err error) {
	err = m.do(ctx, "power status", t, c, func(pc PowerClient, ctx context.Context) error {
		on, err = pc.PowerStatus(ctx)

		return err
	})

	return on, err
}

// PowerOn powers the machine on.
func (m *Manager) PowerOn(ctx context.Context, t Target, c Credentials) error {
	return m.do(ctx, "power on", t, c, PowerClient.PowerOn)
}

// PowerOff powers the machine off.
func (m *Manager) PowerOff(ctx context.Context, t Target, c Credentials) error {
	return m.do(ctx, "power off", t, c, PowerClient.PowerOff)
}

// PowerCycle power-cycles the machine, or powers it on when it is off (a cycle does nothing to a machine that is
// off, over either protocol): the one place this rule is kept.
func (m *Manager) PowerCycle(ctx context.Context, t Target, c Credentials) error {
	return m.do(ctx, "power cycle", t, c, func(pc PowerClient, ctx context.Context) error {
		on, err := pc.PowerStatus(ctx)
		if err != nil {
			return err
		}

		if !on {
			return pc.PowerOn(ctx)
		}

		return pc.PowerCycle(ctx)
	})
}

// SetPXEOnce sets a one-time network boot in the firmware mode fw and reads it back.
func (m *Manager) SetPXEOnce(ctx context.Context, t Target, c Credentials, fw metal.Firmware) error {
	if fw != metal.BIOS && fw != metal.UEFI {
		return fmt.Errorf("set one-time pxe boot on bmc %s: %w: boot mode %q", t, ErrInvalidTarget, fw)
	}

	return m.do(ctx, "set one-time pxe boot", t, c, func(pc PowerClient, ctx context.Context) error {
		return pc.SetPXEOnce(ctx, fw)
	})
}

// ClearOverride removes any boot override.
func (m *Manager) ClearOverride(ctx context.Context, t Target, c Credentials) error {
	return m.do(ctx, "clear boot override", t, c, PowerClient.ClearOverride)
}

// BootOverride reads the current boot override and the firmware mode it boots in.
func (m *Manager) BootOverride(ctx context.Context, t Target, c Credentials) (set, pxe bool, fw metal.Firmware, err error) {
	err = m.do(ctx, "read boot override", t, c, func(pc PowerClient, ctx context.Context) error {
		set, pxe, fw, err = pc.BootOverride(ctx)

		return err
	})

	return set, pxe, fw, err
}

// Protocol returns the protocol last chosen for t (empty when none yet or expired).
func (m *Manager) Protocol(t Target) Protocol {
	e := m.entry(t)

	e.turn <- struct{}{}
	defer func() { <-e.turn }()

	if e.proto == ProtocolAuto || m.now().Sub(e.probedAt) >= m.cfg.ProbeTTL {
		return ProtocolAuto
	}

	return e.proto
}

// IPMICipherSuite returns the cipher suite t's BMC fell back to when it refused the first configured one
// (false when it did not, or the memory expired).
func (m *Manager) IPMICipherSuite(t Target) (uint8, bool) {
	e := m.entry(t)

	e.turn <- struct{}{}
	defer func() { <-e.turn }()

	if !e.suiteSet || m.now().Sub(e.suiteAt) >= m.cfg.ProbeTTL {
		return 0, false
	}

	return e.suite, true
}

// do runs op on t's BMC: in turn, rate-limited, with a session, within the call timeout.
func (m *Manager) do(ctx context.Context, what string, t Target, c Credentials, op func(PowerClient, context.Context) error) error {
	err := m.doInner(ctx, t, c, op)
	if err == nil {
		return nil
	}

	if !errors.Is(err, ErrTimeout) && noAnswer(err) {
		err = fmt.Errorf("%w: %w", ErrTimeout, err)
	}

	reason := "bmc"

	switch {
	case errors.Is(err, ErrInvalidTarget):
		reason = "invalid"
	case IsPermanent(err):
		reason = "refused"
	case errors.Is(err, ErrTimeout):
		reason = "timeout"
	}

	m.failures.WithLabelValues(reason).Inc()

	return fmt.Errorf("%s on bmc %s: %w", what, t, err)
}

func (m *Manager) doInner(ctx context.Context, t Target, c Credentials, op func(PowerClient, context.Context) error) error {
	if err := t.Validate(); err != nil {
		return err
	}

	if err := c.Validate(); err != nil {
		return err
	}

	ctx, cancel := context.WithTimeout(ctx, m.cfg.CallTimeout)
	defer cancel()

	e := m.entry(t)

	select {
	case e.turn <- struct{}{}:
	case <-ctx.Done():
		return timeoutError(ctx, "waiting for the bmc's previous operation")
	}
	defer func() { <-e.turn }()

	if err := e.limiter.Wait(ctx); err != nil {
		return timeoutError(ctx, "waiting for the bmc rate limit")
	}

	reused := e.session != nil && e.creds.equal(c)

	pc, err := m.session(ctx, e, t, c)
	if err != nil {
		return err
	}

	err = op(pc, ctx)
	if err != nil && reused && ctx.Err() == nil && !sessionAnswered(err) {
		// A reused session may have expired on the BMC: retry once on a fresh one.
		m.dropSession(e)

		if pc, err = m.session(ctx, e, t, c); err == nil {
			err = op(pc, ctx)
		}
	}

	if err != nil {
		if e.session != nil {
			m.dropSession(e)
		}

		if ctx.Err() != nil {
			return fmt.Errorf("%w: %w", timeoutError(ctx, "operation"), err)
		}

		return err
	}

	e.lastUsed = m.now()

	return nil
}

func timeoutError(ctx context.Context, doing string) error {
	if errors.Is(ctx.Err(), context.DeadlineExceeded) {
		return fmt.Errorf("%w (%s)", ErrTimeout, doing)
	}

	return fmt.Errorf("%s: %w", doing, ctx.Err())
}

// session returns e's session for c, choosing the protocol and logging in when needed. e's turn is held.
func (m *Manager) session(ctx context.Context, e *entry, t Target, c Credentials) (PowerClient, error) {
	proto := t.Protocol
	if proto == ProtocolAuto {
		proto = m.protocol(ctx, e, t)
	}

	if e.session != nil && (!e.creds.equal(c) || e.proto != proto) {
		m.dropSession(e)
	}

	e.proto = proto

	if e.session != nil {
		return e.session, nil
	}

	var (
		pc  PowerClient
		err error
	)

	switch proto {
	case ProtocolRedfish:
		pc, err = redfish.Dial(ctx, redfish.Config{
			Endpoint: t.redfishEndpoint(), Username: c.Username, Password: c.Password,
			Insecure: m.cfg.RedfishInsecure, Timeout: m.cfg.CallTimeout,
		})
	default:
		pc, err = m.dialIPMI(ctx, e, t, c)
	}

	if err != nil {
		if ctx.Err() != nil {
			return nil, fmt.Errorf("%w: %w", timeoutError(ctx, "login"), err)
		}

		return nil, err
	}

	e.session, e.creds, e.lastUsed = pc, c, m.now()

	return pc, nil
}

// dialIPMI opens an IPMI session, trying first the cipher suite e's BMC fell back to last time (so a BMC that
// refuses suite 17 is not asked for it on every session) and remembering a new fallback. e's turn is held.
func (m *Manager) dialIPMI(ctx context.Context, e *entry, t Target, c Credentials) (PowerClient, error) {
	suites := m.cfg.IPMICipherSuites
	remembered := e.suiteSet && m.now().Sub(e.suiteAt) < m.cfg.ProbeTTL

	if remembered {
		suites = append([]uint8{e.suite}, slices.DeleteFunc(slices.Clone(suites), func(s uint8) bool { return s == e.suite })...)
	}

	pc, err := ipmi.Dial(ctx, ipmi.Config{
		Host: t.Host, Port: t.ipmiPort(), Username: c.Username, Password: c.Password,
		CipherSuites: suites, Timeout: m.cfg.IPMIExchangeTimeout,
	})
	if err != nil {
		return nil, err
	}

	used := pc.CipherSuite()

	switch {
	case remembered && used == e.suite:
		// The remembered suite worked at once: nothing was refused, nothing to say.
	case used == m.cfg.IPMICipherSuites[0]:
		e.suiteSet = false // the preferred suite works: nothing to remember
	default:
		// A suite tried before used was refused. Say so when the choice is new or changed; when the memory merely
		// expired and the BMC still refuses, only at debug level.
		logf := m.log.Info
		if e.suiteSet && e.suite == used {
			logf = m.log.Debug
		}

		logf("bmc refused the preferred ipmi cipher suite; falling back and remembering it",
			zap.Stringer("bmc", t), zap.Uint8s("refused", suites[:slices.Index(suites, used)]),
			zap.Uint8("cipher_suite", used), zap.Duration("remembered_for", m.cfg.ProbeTTL))

		e.suite, e.suiteSet, e.suiteAt = used, true, m.now()
	}

	return pc, nil
}

// protocol returns the remembered choice for e, probing Redfish when there is none or it expired.
func (m *Manager) protocol(ctx context.Context, e *entry, t Target) Protocol {
	if e.proto != ProtocolAuto && m.now().Sub(e.probedAt) < m.cfg.ProbeTTL {
		return e.proto
	}

	pctx, cancel := context.WithTimeout(ctx, m.cfg.ProbeTimeout)
	defer cancel()

	hc := redfish.Config{Insecure: m.cfg.RedfishInsecure, Timeout: m.cfg.ProbeTimeout}.HTTPClient()
	defer hc.CloseIdleConnections()

	proto := ProtocolIPMI

	if err := redfish.Probe(pctx, hc, t.redfishEndpoint()); err == nil {
		proto = ProtocolRedfish
	} else {
		m.log.Debug("redfish probe failed, using ipmi", zap.Stringer("bmc", t), zap.Error(err))
	}

	e.probedAt = m.now()

	return proto
}

func (c Credentials) equal(o Credentials) bool {
	u := subtle.ConstantTimeCompare([]byte(c.Username), []byte(o.Username))
	p := subtle.ConstantTimeCompare([]byte(c.Password), []byte(o.Password))

	return u&p == 1
}

// sessionAnswered reports whether err is an answer the BMC gave within the session (an IPMI completion code), so
// the session is alive and a fresh one would get the same answer.
func sessionAnswered(err error) bool {
	var cc *ipmi.CompletionCodeError

	return errors.As(err, &cc)
}

// noAnswer reports whether err means the BMC did not answer (as opposed to answering "no").
func noAnswer(err error) bool {
	var ne net.Error

	return errors.Is(err, ipmi.ErrNoAnswer) || errors.Is(err, redfish.ErrNoAnswer) || errors.Is(err, context.DeadlineExceeded) ||
		(errors.As(err, &ne) && ne.Timeout())
}
