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
// carries one, is logged here as COSI would have, and not returned.
//
// A step's first failure in a row at a machine is retried after firstRetry when it asked for the poll interval
// or less: most failures are a busy BMC or a dropped call that the next try gets through, and a user's
// request must not wait a poll interval for that. Failing again, it waits what the step asked for.
func (e *env) requeue(logger *zap.Logger, controllerName, machineID string, err error) error {
	var rq *controller.RequeueError
	if !errors.As(err, &rq) || rq.Interval() <= 0 {
		e.failing.clear(controllerName, machineID)

		return err
	}

	interval := rq.Interval()

	if rq.Err() == nil {
		e.failing.clear(controllerName, machineID)
	} else if first := e.failing.add(controllerName, machineID); first && interval <= e.cfg.PollInterval {
		interval = min(interval, firstRetry)
	}

	e.due.after(controllerName, machineID, interval)

	if rq.Err() != nil {
		logger.Error("reconcile failed", zap.Error(rq.Err()), zap.Duration("interval", interval))
	}

	return nil
}

// firstRetry is how soon a step's first failure at a machine is tried again (requeue).
const firstRetry = 2 * time.Second

// failingSet is the (controller, machine) pairs whose last reconcile failed.
type failingSet struct {
	mu  sync.Mutex
	set map[dueKey]struct{}
}

func newFailingSet() *failingSet { return &failingSet{set: map[dueKey]struct{}{}} }

// add records a failure; first reports whether the pair's last reconcile had not failed.
func (f *failingSet) add(controller, machine string) (first bool) {
	f.mu.Lock()
	defer f.mu.Unlock()

	key := dueKey{controller, machine}
	if _, ok := f.set[key]; ok {
		return false
	}

	f.set[key] = struct{}{}

	return true
}

func (f *failingSet) clear(controller, machine string) {
	f.mu.Lock()
	defer f.mu.Unlock()

	delete(f.set, dueKey{controller, machine})
}
