package lifecycle

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"time"

	"github.com/cosi-project/runtime/pkg/controller"
	"github.com/cosi-project/runtime/pkg/resource"
	"github.com/cosi-project/runtime/pkg/safe"
	"github.com/cosi-project/runtime/pkg/state"
	omniresources "github.com/siderolabs/omni/client/pkg/omni/resources"
	"github.com/siderolabs/omni/client/pkg/omni/resources/infra"
	"go.uber.org/zap"
)

// LocalNamespace holds lifecycle records that live in this process only and are never written to Omni: the
// due records below. The runtime serves it from memory (omni.Connection.NewRuntime, by LocalNamespaces).
const LocalNamespace resource.Namespace = "outpost-lifecycle-local"

const scheduleName = "lifecycle.ScheduleController"

// dueType is the type of controllerName's due records: one type per controller, so touching one wakes that
// controller only.
func dueType(controllerName string) resource.Type {
	return strings.TrimPrefix(controllerName, "lifecycle.") + "Dues.outpost.local"
}

// dueRecord is a machine's due record for one controller: touching it (touches counts up) puts the machine
// in that controller's queue. It has no meaning beyond that and is kept in memory only.
type dueRecord struct {
	md      resource.Metadata
	touches uint64
}

func newDueRecord(typ resource.Type, machineID string) *dueRecord {
	return &dueRecord{md: resource.NewMetadata(LocalNamespace, typ, machineID, resource.VersionUndefined)}
}

// Metadata implements resource.Resource.
func (d *dueRecord) Metadata() *resource.Metadata { return &d.md }

// Spec implements resource.Resource.
func (d *dueRecord) Spec() any { return d.touches }

// DeepCopy implements resource.Resource.
func (d *dueRecord) DeepCopy() resource.Resource {
	return &dueRecord{md: d.md.Copy(), touches: d.touches}
}

// scheduleController turns the lifecycle's dues (due.go) into work: its run hook waits for the next due look
// and touches that machine's due record for the controller concerned. Its reconcile drops the due records
// of a machine removed from Omni.
type scheduleController struct {
	env   *env
	types []resource.Type
}

func newScheduleController(e *env, controllers []controller.QController) *scheduleController {
	s := &scheduleController{env: e}

	for _, qc := range controllers {
		if mc, ok := qc.(*machineController); ok {
			s.types = append(s.types, dueType(mc.name))
		}
	}

	return s
}

// Name implements controller.QController.
func (s *scheduleController) Name() string { return scheduleName }

// LocalNamespaces tells the runtime's builder which namespaces to keep in memory.
func (s *scheduleController) LocalNamespaces() []resource.Namespace {
	return []resource.Namespace{LocalNamespace}
}

// Settings implements controller.QController.
func (s *scheduleController) Settings() controller.QSettings {
	outputs := make([]controller.Output, 0, len(s.types))
	for _, typ := range s.types {
		outputs = append(outputs, controller.Output{Type: typ, Kind: controller.OutputExclusive})
	}

	return controller.QSettings{
		Inputs:  []controller.Input{{Namespace: omniresources.InfraProviderNamespace, Type: infra.InfraMachineType, Kind: controller.InputQPrimary}},
		Outputs: outputs,
		RunHook: s.run,
	}
}

// MapInput implements controller.QController (no mapped inputs).
func (s *scheduleController) MapInput(context.Context, *zap.Logger, controller.QRuntime, controller.ReducedResourceMetadata) ([]resource.Pointer, error) {
	return nil, nil
}

// Reconcile implements controller.QController: a machine gone from Omni loses its due records.
func (s *scheduleController) Reconcile(ctx context.Context, _ *zap.Logger, r controller.QRuntime, ptr resource.Pointer) error {
	_, err := safe.ReaderGet[*infra.Machine](ctx, r, ptr)

	switch {
	case err == nil:
		return nil
	case !state.IsNotFoundError(err):
		return fmt.Errorf("read infra machine: %w", err)
	}

	for _, typ := range s.types {
		if err = r.Destroy(ctx, resource.NewMetadata(LocalNamespace, typ, ptr.ID(), resource.VersionUndefined)); err != nil && !state.IsNotFoundError(err) {
			return fmt.Errorf("destroy due record %s: %w", typ, err)
		}
	}

	return nil
}

// touchBatch bounds the dues touched between two looks at the clock.
const touchBatch = 256

// run touches due records as they fall due, until ctx ends.
func (s *scheduleController) run(ctx context.Context, logger *zap.Logger, r controller.QRuntime) error {
	timer := time.NewTimer(time.Hour)
	defer timer.Stop()

	for {
		due, wait := s.env.due.take(touchBatch)

		for _, k := range due {
			err := r.Modify(ctx, newDueRecord(dueType(k.controller), k.machine), func(res resource.Resource) error {
				res.(*dueRecord).touches++ //nolint:errcheck // only due records are written here

				return nil
			})

			switch {
			case ctx.Err() != nil:
				return nil
			case err != nil:
				// in memory: cannot fail but for a programming error; not lost either way
				logger.Error("touch due record", zap.String("controller", k.controller), zap.String("machine", k.machine), zap.Error(err))
				s.env.due.after(k.controller, k.machine, time.Second)
			}
		}

		if len(due) > 0 {
			continue
		}

		if wait == 0 {
			wait = time.Hour // nothing pending: a new entry wakes the loop
		}

		timer.Reset(wait)

		select {
		case <-ctx.Done():
			return nil
		case <-s.env.due.wake:
		case <-timer.C:
		}
	}
}

// requeue is what machineController does with a step's result: a requeue with an interval becomes a due look
// in the lifecycle's schedule instead of an item parked in COSI's queue (see dues). Its error, when it
// carries one, is logged here as COSI would have, and not returned. wish is the version of the InfraMachine the
// look acted on (0: it read none).
//
// A failure (a requeue carrying an error: an edge call that failed) is retried after a pause that grows with
// the failures in a row at the machine, from firstRetry doubling up to the interval the step asked for (the
// poll interval, or more for a BMC's refusal, which is never hurried): most failures are a busy BMC or a
// dropped call that the next try gets through, and a user's request must not wait a poll interval for that;
// a call broken by an uplink cut, failing again at once, must not be tried again at once either. Until the
// pause is over the step does not look at the machine again, whatever wakes it (its own records changing, a
// finished wipe), unless Omni asked something new of it (hold).
func (e *env) requeue(logger *zap.Logger, controllerName, machineID string, wish uint64, err error) error {
	var paused *pausedError
	if errors.As(err, &paused) {
		e.due.after(controllerName, machineID, paused.wait)
		logger.Debug("retry paused after a failure", zap.Duration("left", paused.wait))

		return nil
	}

	var rq *controller.RequeueError
	if !errors.As(err, &rq) || rq.Interval() <= 0 {
		e.failing.clear(controllerName, machineID)

		return err
	}

	interval := rq.Interval()

	if rq.Err() == nil {
		e.failing.clear(controllerName, machineID)
	} else {
		interval = e.failing.add(controllerName, machineID, wish, interval, e.cfg.PollInterval)
	}

	e.due.after(controllerName, machineID, interval)

	if rq.Err() != nil {
		logger.Error("reconcile failed", zap.Error(rq.Err()), zap.Duration("interval", interval))
	}

	return nil
}

// firstRetry is how soon a step's first failure at a machine is tried again (requeue); each failure in a row
// doubles it, up to the interval the step asked for.
const firstRetry = 2 * time.Second

// pausedError is a look at a machine that did not run its step: the step's last failure there is still in
// its pause (failingSet.hold), and the machine is due again in wait.
type pausedError struct{ wait time.Duration }

func (p *pausedError) Error() string {
	return fmt.Sprintf("retry paused for %s after a failure", p.wait)
}

// failingSet is the (controller, machine) pairs whose last reconcile failed: how many times in a row, until
// when the step must leave the machine alone, and the InfraMachine version it failed on.
type failingSet struct {
	now func() time.Time

	mu  sync.Mutex
	set map[dueKey]failure
}

type failure struct {
	count int
	until time.Time
	wish  uint64
}

func newFailingSet(now func() time.Time) *failingSet {
	return &failingSet{now: now, set: map[dueKey]failure{}}
}

// add records a failure of the look at wish (the InfraMachine's version) and returns the pause before the next:
// firstRetry doubled for each earlier failure in a row, at most asked; asked itself when it is above poll (a
// slow retry on purpose).
func (f *failingSet) add(controller, machine string, wish uint64, asked, poll time.Duration) time.Duration {
	f.mu.Lock()
	defer f.mu.Unlock()

	key := dueKey{controller, machine}
	fl := f.set[key]
	fl.count++
	fl.wish = wish

	pause := asked
	if asked <= poll {
		pause = firstRetry
		for i := 1; i < fl.count && pause < asked; i++ {
			pause *= 2
		}

		pause = min(pause, asked)
	}

	fl.until = f.now().Add(pause)
	f.set[key] = fl

	return pause
}

// hold returns how long the step must still leave the machine alone after its last failure there (0: not at
// all). A new wish from Omni (the InfraMachine changed since the failure) ends the pause: it gets its try at
// once, and its first failure is a first again.
func (f *failingSet) hold(controller, machine string, wish uint64) time.Duration {
	f.mu.Lock()
	defer f.mu.Unlock()

	key := dueKey{controller, machine}

	fl, ok := f.set[key]
	if !ok {
		return 0
	}

	if fl.wish != wish {
		delete(f.set, key)

		return 0
	}

	return max(0, fl.until.Sub(f.now()))
}

func (f *failingSet) clear(controller, machine string) {
	f.mu.Lock()
	defer f.mu.Unlock()

	delete(f.set, dueKey{controller, machine})
}
