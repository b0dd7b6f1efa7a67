// Package lease decides which of a provider's controllers acts when more than one runs against one Omni (an
// active one and a standby): a ControllerLease record in the provider's namespace names the holder.
//
// The holder renews the record every Renew; a standby takes it over only once it has seen the record's version
// unchanged for a whole Duration on its own clock, or when the holder gave it up on its way out. The holder
// stops acting when it has not renewed for Duration-Margin, on its own clock, so it has stopped before any
// standby can take over: neither side compares its clock with the other's, only how much time passed, which
// clocks agree on closely. Omni's version check on update makes a takeover race between two standbys end with
// one winner.
package lease

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"
	"time"

	"github.com/cosi-project/runtime/pkg/resource"
	"github.com/cosi-project/runtime/pkg/safe"
	"github.com/cosi-project/runtime/pkg/state"
	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/zap"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/outpost-metal/outpost/controller/resources"
	"github.com/outpost-metal/outpost/controller/resources/specs"
)

// Config says how long a lease lasts and who asks for it.
type Config struct {
	// Holder names this controller in the record (unique among the provider's controllers: host and a random
	// suffix is what the app uses).
	Holder string
	// UplinkAddress is where this controller accepts edges, written in the record for operators.
	UplinkAddress string
	// Duration is how long a standby waits on a record that does not change before it takes over.
	Duration time.Duration
	// Renew is how often the holder renews (and a standby looks).
	Renew time.Duration
	// Margin is how much earlier than Duration the holder stops acting without a renewal.
	Margin time.Duration
}

// Default returns a 10 s lease renewed every 2 s, given up by its holder 2 s before a standby may take it: a
// controller killed and started again elsewhere acts about 10 s later.
func Default() Config { return ForDuration(10 * time.Second) }

// ForDuration returns a lease of d renewed every d/5, given up by its holder d/5 before a standby may take it.
func ForDuration(d time.Duration) Config {
	return Config{Duration: d, Renew: d / 5, Margin: d / 5}
}

// Validate reports a configuration under which two controllers could act at once.
func (c Config) Validate() error {
	switch {
	case c.Holder == "":
		return errors.New("lease: no holder name")
	case c.Duration <= 0 || c.Renew <= 0 || c.Margin <= 0:
		return errors.New("lease: duration, renew interval and margin must be positive")
	case c.Renew+c.Margin >= c.Duration:
		return fmt.Errorf("lease: renew interval %s plus margin %s must be shorter than the duration %s", c.Renew, c.Margin, c.Duration)
	}

	return nil
}

// Elector campaigns for the lease and runs what only the holder does.
type Elector struct {
	cfg    Config
	st     state.State
	md     resource.Pointer
	types  resources.Types
	log    *zap.Logger
	now    func() time.Time
	leader prometheus.Gauge
	terms  prometheus.Counter
	acting atomic.Bool
}

// Acting reports whether this controller holds the lease now.
func (e *Elector) Acting() bool { return e.acting.Load() }

// ActingElsewhere reports whether another controller acts now (this one stands by) and, when it does, its name
// and where it accepts edges, as the lease record says; the name reads "unknown (...)" when the record cannot be
// read, and is empty when nobody holds the lease yet.
func (e *Elector) ActingElsewhere(ctx context.Context) (holder, uplink string, elsewhere bool) {
	if e.Acting() {
		return "", "", false
	}

	rec, err := safe.StateGet[*resources.ControllerLease](ctx, e.st, e.md)

	switch {
	case state.IsNotFoundError(err):
		return "", "", true
	case err != nil:
		return "unknown (" + err.Error() + ")", "", true
	}

	spec := rec.TypedSpec().Value

	return spec.GetHolder(), spec.GetUplinkAddress(), true
}

// New returns an elector for the lease of types' provider in st. now is the clock (time.Now); reg may be nil.
func New(cfg Config, st state.State, types resources.Types, log *zap.Logger, now func() time.Time, reg prometheus.Registerer) (*Elector, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}

	e := &Elector{
		cfg: cfg, st: st, types: types, md: types.NewControllerLease(resources.ControllerLeaseID).Metadata(),
		log: log.With(zap.String("component", "lease"), zap.String("holder", cfg.Holder)), now: now,
		leader: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "outpost_controller_leader", Help: "1 while this controller holds the lease and acts, 0 while it stands by.",
		}),
		terms: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "outpost_controller_lease_acquired_total", Help: "How many times this controller took the lease.",
		}),
	}

	if reg != nil {
		if err := reg.Register(e.leader); err != nil {
			return nil, fmt.Errorf("register lease metrics: %w", err)
		}

		if err := reg.Register(e.terms); err != nil {
			return nil, fmt.Errorf("register lease metrics: %w", err)
		}
	}

	return e, nil
}

// Run campaigns until ctx ends. Each time this controller takes the lease it calls lead with a context that ends
// when the lease is lost (no renewal for Duration-Margin) or ctx ends, and waits for lead to return before it
// campaigns again. When lead returns by itself, the lease is given up and Run returns lead's error: the
// controller is done (a standby takes over). On the way out the lease is given up so a standby need not wait.
func (e *Elector) Run(ctx context.Context, lead func(ctx context.Context) error) error {
	var w watch

	for {
		won, err := e.campaign(ctx, &w)
		if err != nil {
			return err
		}

		if !won {
			select {
			case <-ctx.Done():
				return nil
			case <-time.After(e.cfg.Renew):
			}

			continue
		}

		done, err := e.hold(ctx, lead)
		if done {
			return err
		}

		w = watch{}
	}
}

// watch is what a standby saw of the record: its version, and since when (on the standby's clock).
type watch struct {
	version resource.Version
	since   time.Time
	seen    bool
}

// campaign looks at the record once and takes the lease when it is free, given up, or unchanged for Duration.
func (e *Elector) campaign(ctx context.Context, w *watch) (bool, error) {
	rec, err := safe.StateGet[*resources.ControllerLease](ctx, e.st, e.md)

	switch {
	case state.IsNotFoundError(err):
		fresh := e.types.NewControllerLease(resources.ControllerLeaseID)
		e.fill(fresh.TypedSpec().Value, 1)

		if err := e.st.Create(ctx, fresh); err != nil {
			if state.IsConflictError(err) {
				return false, nil // another controller created it first
			}

			return false, e.transient("create the lease", err)
		}

		e.log.Info("lease taken: no controller held it")

		return true, nil
	case err != nil:
		return false, e.transient("read the lease", err)
	}

	spec := rec.TypedSpec().Value
	now := e.now()

	if !w.seen || !rec.Metadata().Version().Equal(w.version) {
		if w.seen && spec.GetHolder() != "" {
			e.log.Debug("lease renewed by its holder", zap.String("holder_now", spec.GetHolder()))
		}

		*w = watch{version: rec.Metadata().Version(), since: now, seen: true}
	}

	switch {
	case spec.GetHolder() == e.cfg.Holder:
		// This controller's own record, from before a restart or a lost lease: it was not acting on it.
	case spec.GetHolder() == "":
	case now.Sub(w.since) >= max(e.cfg.Duration, spec.GetDuration().AsDuration()):
		// The holder's own duration counts when it is longer: a standby configured with a shorter one must not
		// take over while the holder still acts.
		e.log.Warn("lease taken over: its holder did not renew it for a whole lease duration",
			zap.String("previous_holder", spec.GetHolder()), zap.Duration("unchanged_for", now.Sub(w.since)))
	default:
		return false, nil
	}

	e.fill(spec, spec.GetTerms()+1)

	if err := e.st.Update(ctx, rec); err != nil {
		if state.IsConflictError(err) {
			// Renewed, or taken by another standby, since it was read.
			return false, nil
		}

		return false, e.transient("take the lease", err)
	}

	if spec.GetHolder() != "" {
		e.log.Info("lease taken")
	}

	return true, nil
}

// transient logs an error of Omni's (unreachable, restarting) and carries on: a standby keeps trying, and a
// context that ended is no error.
func (e *Elector) transient(what string, err error) error {
	if errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded) {
		return nil
	}

	e.log.Warn("lease: cannot "+what+" (retrying)", zap.Error(err))

	return nil
}

func (e *Elector) fill(spec *specs.ControllerLeaseSpec, terms uint64) {
	spec.Holder = e.cfg.Holder
	spec.Renewed = timestamppb.New(e.now())
	spec.Duration = durationpb.New(e.cfg.Duration)
	spec.UplinkAddress = e.cfg.UplinkAddress
	spec.Terms = terms
}

// hold runs lead while the lease is renewed. It returns done when lead returned by itself or ctx ended (the
// lease is then given up), or not done when the lease was lost and lead stopped: the caller campaigns again.
func (e *Elector) hold(ctx context.Context, lead func(ctx context.Context) error) (bool, error) {
	e.leader.Set(1)
	e.terms.Inc()
	e.acting.Store(true)

	defer func() {
		e.acting.Store(false)
		e.leader.Set(0)
	}()

	e.log.Info("acting: this controller holds the lease")

	lctx, cancel := context.WithCancel(ctx)
	defer cancel()

	result := make(chan error, 1)

	go func() { result <- lead(lctx) }()

	// The record was written just now; acting stops Duration-Margin after the last write that is known to
	// have been made, counted from before it was sent. A renewal never runs past that moment: one that hangs
	// on an unreachable Omni would otherwise hold the loop past it, into the margin a standby relies on.
	stopBy := time.Now().Add(e.cfg.Duration - e.cfg.Margin)
	stopAt := time.NewTimer(time.Until(stopBy))
	defer stopAt.Stop()

	ticker := time.NewTicker(e.cfg.Renew)
	defer ticker.Stop()

	const notRenewed = "not renewed for the lease duration less the margin (Omni unreachable or slow)"

	var why string

loop:
	for {
		select {
		case err := <-result:
			cancel()
			e.release()

			return true, err
		case <-stopAt.C:
			why = notRenewed

			break loop
		case <-ticker.C:
			sent := time.Now()

			rctx, rcancel := context.WithDeadline(lctx, stopBy)
			lost, err := e.renew(rctx)

			rcancel()

			switch {
			case lost != "":
				why = "taken over by " + lost

				break loop
			case err != nil && lctx.Err() != nil:
				continue // stopping: the result is next
			case err != nil && !time.Now().Before(stopBy):
				why = notRenewed

				break loop
			case err != nil:
				e.log.Warn("lease: renewal failed (retrying until the lease runs out)", zap.Error(err))

				continue
			}

			stopBy = sent.Add(e.cfg.Duration - e.cfg.Margin)
			stopAt.Reset(time.Until(stopBy))
		}
	}

	e.log.Warn("lease lost: stopping", zap.String("reason", why))
	cancel()

	stopping := time.Now()
	err := <-result

	if took := time.Since(stopping); took > e.cfg.Margin {
		e.log.Warn("stopping took longer than the lease margin: a standby may have acted meanwhile", zap.Duration("took", took))
	}

	if err != nil && !errors.Is(err, context.Canceled) {
		e.log.Warn("stopped after losing the lease", zap.Error(err))
	}

	e.log.Info("stopped acting: a standby may take the lease", zap.Duration("took", time.Since(stopping)))

	return false, nil
}

// renew writes the record again. lost names the controller that holds it now when it is not this one.
func (e *Elector) renew(ctx context.Context) (string, error) {
	ctx, cancel := context.WithTimeout(ctx, e.cfg.Renew)
	defer cancel()

	rec, err := safe.StateGet[*resources.ControllerLease](ctx, e.st, e.md)
	if err != nil {
		if state.IsNotFoundError(err) {
			return "nobody (the record was deleted)", nil
		}

		return "", err
	}

	spec := rec.TypedSpec().Value
	if spec.GetHolder() != e.cfg.Holder {
		return spec.GetHolder(), nil
	}

	e.fill(spec, spec.GetTerms())

	return "", e.st.Update(ctx, rec)
}

// release gives the lease up, so a standby takes over at its next look instead of after a whole Duration.
func (e *Elector) release() {
	ctx, cancel := context.WithTimeout(context.Background(), e.cfg.Renew)
	defer cancel()

	rec, err := safe.StateGet[*resources.ControllerLease](ctx, e.st, e.md)
	if err != nil || rec.TypedSpec().Value.GetHolder() != e.cfg.Holder {
		return
	}

	rec.TypedSpec().Value.Holder = ""
	rec.TypedSpec().Value.Renewed = timestamppb.New(e.now())

	if err := e.st.Update(ctx, rec); err != nil {
		e.log.Warn("lease: could not give it up; a standby takes over after a lease duration", zap.Error(err))

		return
	}

	e.log.Info("lease given up")
}
