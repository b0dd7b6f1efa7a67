package lifecycle

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/cosi-project/runtime/pkg/controller"
	"github.com/cosi-project/runtime/pkg/resource"
	"github.com/cosi-project/runtime/pkg/safe"
	"github.com/cosi-project/runtime/pkg/state"
	"github.com/siderolabs/gen/optional"
	omniresources "github.com/siderolabs/omni/client/pkg/omni/resources"
	"github.com/siderolabs/omni/client/pkg/omni/resources/infra"
	"go.uber.org/zap"

	"github.com/outpost-metal/outpost/controller/resources"
)

// step is one lifecycle controller's logic; machineController runs it for every InfraMachine of the provider.
type step interface {
	// reconcile acts on a live machine and writes the step's output.
	reconcile(ctx context.Context, logger *zap.Logger, r controller.QRuntime, v *view) error
	// teardown runs once the InfraMachine is being deleted, before the step's output is destroyed (best effort).
	teardown(ctx context.Context, logger *zap.Logger, r controller.QRuntime, v *view) error
}

// records is a set of the records a step reads beside the InfraMachine. Each step declares the ones its
// decisions use: only a change to one of those (or to the InfraMachine, or to the step's due record) puts the
// machine in the step's queue, and only those are loaded into its view (the others are nil there). At 20,000
// machines every wake-up costs: COSI's queue scans its waiting items on each one.
type records uint8

// The records a step can read.
const (
	omniBMCRecord     records = 1 << iota // Omni's BMCConfig (the credentials an operator gave Omni)
	bmcRecord                             // BMCConfiguration
	wipeRecord                            // WipeStatus
	powerRecord                           // PowerOperation
	rebootRecord                          // RebootStatus
	observationRecord                     // MachineObservation
	inventoryRecord                       // MachineInventory

	// ownRecords are all the controller's own records (not Omni's BMCConfig).
	ownRecords = bmcRecord | wipeRecord | powerRecord | rebootRecord | observationRecord
)

func (rs records) has(r records) bool { return rs&r != 0 }

// recordTypes maps the controller's own records to their resource types.
func recordTypes(t resources.Types) []struct {
	record records
	typ    resource.Type
} {
	return []struct {
		record records
		typ    resource.Type
	}{
		{bmcRecord, t.BMCConfiguration},
		{wipeRecord, t.WipeStatus},
		{powerRecord, t.PowerOperation},
		{rebootRecord, t.RebootStatus},
		{observationRecord, t.MachineObservation},
		{inventoryRecord, t.MachineInventory},
	}
}

// machineController is a QController with the InfraMachine as primary input, the records its step reads as
// mapped inputs (same machine ID), one output type (optional) and a finalizer on the InfraMachine that
// holds it until the output is gone.
type machineController struct {
	env    *env
	name   string
	output resource.Type // "" for none
	outNS  resource.Namespace
	reads  records // its own output included, when it reads that
	step   step
	// concurrency overrides the configured Concurrency (0: none).
	concurrency uint
}

func newMachineController(e *env, name string, output resource.Type, outNS resource.Namespace, reads records, s step) *machineController {
	return &machineController{env: e, name: name, output: output, outNS: outNS, reads: reads, step: s}
}

// Name implements controller.QController.
func (c *machineController) Name() string { return c.name }

// Settings implements controller.QController.
func (c *machineController) Settings() controller.QSettings {
	t := c.env.types

	inputs := []controller.Input{
		{Namespace: omniresources.InfraProviderNamespace, Type: infra.InfraMachineType, Kind: controller.InputQPrimary},
	}

	if c.reads.has(omniBMCRecord) {
		inputs = append(inputs, controller.Input{Namespace: omniresources.InfraProviderNamespace, Type: infra.BMCConfigType, Kind: controller.InputQMapped})
	}

	for _, rt := range recordTypes(t) {
		if c.reads.has(rt.record) && rt.typ != c.output {
			inputs = append(inputs, controller.Input{Namespace: t.Namespace, Type: rt.typ, Kind: controller.InputQMapped})
		}
	}

	// its due records: the schedule touches one when the machine is due here again (schedule.go)
	inputs = append(inputs, controller.Input{Namespace: LocalNamespace, Type: dueType(c.name), Kind: controller.InputQMapped})

	var outputs []controller.Output
	if c.output != "" {
		outputs = []controller.Output{{Type: c.output, Kind: controller.OutputExclusive}}
	}

	return controller.QSettings{
		Inputs:      inputs,
		Outputs:     outputs,
		Concurrency: optional.Some(max(c.concurrency, c.env.cfg.Concurrency)),
	}
}

// LocalNamespaces tells the runtime's builder which namespaces to keep in memory.
func (c *machineController) LocalNamespaces() []resource.Namespace {
	return []resource.Namespace{LocalNamespace}
}

// CachedReads tells the runtime's builder to serve reads of the controller's own output from the cache: the
// step compares with it and writes only what changed.
func (c *machineController) CachedReads() []resource.Kind {
	if c.output == "" {
		return nil
	}

	md := resource.NewMetadata(c.outNS, c.output, "", resource.VersionUndefined)

	return []resource.Kind{md}
}

// MapInput implements controller.QController: every record maps to the InfraMachine with the same ID.
func (c *machineController) MapInput(_ context.Context, _ *zap.Logger, _ controller.QRuntime, md controller.ReducedResourceMetadata) ([]resource.Pointer, error) {
	return []resource.Pointer{infra.NewMachine(md.ID()).Metadata()}, nil
}

// Reconcile implements controller.QController. A requeue with an interval that the step (or teardown)
// returns is kept in the lifecycle's schedule, not in COSI's queue (see dues).
func (c *machineController) Reconcile(ctx context.Context, logger *zap.Logger, r controller.QRuntime, ptr resource.Pointer) error {
	logger = logger.With(zap.String("machine", ptr.ID()))

	// this look replaces any pending one; what it returns sets the next
	c.env.due.cancel(c.name, ptr.ID())

	var wish uint64 // the InfraMachine's version this look acts on

	start := time.Now()
	err := c.reconcile(ctx, logger, r, ptr, &wish)
	c.env.metrics.reconciled(c.name, time.Since(start))

	return c.env.requeue(logger, c.name, ptr.ID(), wish, err)
}

// reconcile looks at the machine ptr names; wish is set to the version of its InfraMachine once read.
func (c *machineController) reconcile(ctx context.Context, logger *zap.Logger, r controller.QRuntime, ptr resource.Pointer, wish *uint64) error {
	m, err := safe.ReaderGet[*infra.Machine](ctx, r, ptr)
	if err != nil {
		if state.IsNotFoundError(err) {
			return c.destroyOutput(ctx, r, ptr.ID())
		}

		return fmt.Errorf("read infra machine: %w", err)
	}

	if !c.env.ours(m) {
		return nil
	}

	// After a failed call the step leaves the machine alone for a pause, whatever woke it (see requeue): a
	// call broken by an uplink cut fails again at once, and was tried thousands of times a second.
	*wish = m.Metadata().Version().Value()
	if wait := c.env.failing.hold(c.name, ptr.ID(), *wish); wait > 0 {
		return &pausedError{wait: wait}
	}

	if m.Metadata().Phase() == resource.PhaseTearingDown {
		return c.tearDown(ctx, logger, r, m)
	}

	if missing := c.env.missingFinalizers(m); len(missing) > 0 {
		// every lifecycle controller's at once: each write of the InfraMachine wakes all of them
		if err = r.AddFinalizer(ctx, m.Metadata(), missing...); err != nil {
			return fmt.Errorf("add finalizers: %w", err)
		}
	}

	v, err := c.env.loadView(ctx, r, m, c.reads)
	if err != nil {
		return err
	}

	err = c.step.reconcile(ctx, logger, r, v)
	c.env.noteError(v.id, c.name, err)

	return err
}

func (c *machineController) tearDown(ctx context.Context, logger *zap.Logger, r controller.QRuntime, m *infra.Machine) error {
	if !m.Metadata().Finalizers().Has(c.name) {
		return nil
	}

	v, err := c.env.loadView(ctx, r, m, c.reads)
	if err != nil {
		return err
	}

	v.finalizers = *m.Metadata().Finalizers()

	if err = c.step.teardown(ctx, logger, r, v); err != nil {
		if errors.As(err, new(*controller.RequeueError)) {
			return err
		}

		logger.Warn("teardown step failed, continuing", zap.Error(err))
	}

	if err = c.destroyOutput(ctx, r, m.Metadata().ID()); err != nil {
		return err
	}

	if err = r.RemoveFinalizer(ctx, m.Metadata(), c.name); err != nil && !state.IsNotFoundError(err) {
		return fmt.Errorf("remove finalizer: %w", err)
	}

	return nil
}

func (c *machineController) destroyOutput(ctx context.Context, r controller.QRuntime, id string) error {
	if c.output == "" {
		return nil
	}

	md := resource.NewMetadata(c.outNS, c.output, id, resource.VersionUndefined)

	if err := r.Destroy(ctx, md); err != nil && !state.IsNotFoundError(err) {
		return fmt.Errorf("destroy %s: %w", c.output, err)
	}

	c.env.written.forget(c.output, id)

	return nil
}

// missingFinalizers are the lifecycle controllers' finalizers m does not carry yet. Any of the controllers adds
// them all; each removes its own once its teardown is done.
func (e *env) missingFinalizers(m *infra.Machine) []resource.Finalizer {
	var missing []resource.Finalizer

	for _, f := range e.finalizers {
		if !m.Metadata().Finalizers().Has(f) {
			missing = append(missing, f)
		}
	}

	return missing
}

// noTeardown is embedded by steps with nothing to do on deletion beyond destroying their output.
type noTeardown struct{}

func (noTeardown) teardown(context.Context, *zap.Logger, controller.QRuntime, *view) error {
	return nil
}
