package lifecycle

import (
	"context"
	"fmt"
	"slices"
	"time"

	"github.com/cosi-project/runtime/pkg/safe"
	"github.com/cosi-project/runtime/pkg/state"
	"go.uber.org/zap"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/outpost-metal/outpost/controller/resources"
	"github.com/outpost-metal/outpost/controller/resources/specs"
)

// Load merges the MachineLocation records kept in Omni into the locations: a machine the edges have not
// reported since this process started takes its record; one they have keeps what they said. A record that is
// unreadable, names no valid machine, or was written by a newer controller (a higher schema) is left alone and
// logged. The lifecycle runtime starts only after Load, so no decision is made on an empty view.
func (l *Locations) Load(ctx context.Context, st state.State, t resources.Types) error {
	list, err := safe.StateList[*resources.MachineLocation](ctx, st, t.NewMachineLocation("").Metadata())
	if err != nil {
		return fmt.Errorf("list machine locations: %w", err)
	}

	loaded := 0

	l.mu.Lock()

	for rec := range list.All() {
		id, spec := rec.Metadata().ID(), rec.TypedSpec().Value

		switch {
		case checkID(id) != nil || spec.GetSiteId() == "":
			l.logger.Warn("machine location record ignored: no valid machine or site", zap.String("record", id))

			continue
		case spec.GetSchema() > resources.MachineLocationSchema:
			l.logger.Warn("machine location record from a newer controller left alone", zap.String("machine", id),
				zap.Uint32("schema", spec.GetSchema()))

			continue
		}

		if _, known := l.machines[id]; known {
			continue
		}

		loc := &Location{
			SiteID: spec.GetSiteId(), AgentConnected: spec.GetAgentConnected(), Arch: spec.GetArch(),
			Firmware: spec.GetFirmware(), FirmwareSource: spec.GetFirmwareSource(), MACs: slices.Clone(spec.GetMacs()),
		}

		if ts := spec.GetLastSeen(); ts.IsValid() {
			loc.LastSeen = ts.AsTime()
		}

		l.machines[id] = loc
		loaded++
	}

	l.mu.Unlock()

	l.loadedOnce.Do(func() { close(l.loaded) })
	l.logger.Info("machine locations loaded from omni", zap.Int("machines", loaded))

	return nil
}

// Persist writes every change to Omni until ctx ends: one record per machine, coalesced (many changes of a
// machine between two passes are one write). A write that fails is retried on the next pass; nothing is lost
// while the process lives.
func (l *Locations) Persist(ctx context.Context, st state.State, t resources.Types) error {
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-l.changed:
		}

		l.mu.Lock()
		batch := l.dirty
		l.dirty = map[string]bool{}
		l.mu.Unlock()

		failed := 0

		for id := range batch {
			if err := l.write(ctx, st, t, id); err != nil {
				if ctx.Err() != nil {
					return nil
				}

				failed++

				l.mu.Lock()
				l.markLocked(id)
				l.mu.Unlock()
			}
		}

		if failed > 0 {
			l.logger.Warn("machine locations not written to omni, retrying", zap.Int("failed", failed))

			select {
			case <-ctx.Done():
				return nil
			case <-time.After(time.Second):
			}
		}
	}
}

// write writes (or, for a forgotten machine, deletes) machineID's record.
func (l *Locations) write(ctx context.Context, st state.State, t resources.Types, machineID string) error {
	loc, ok := l.Locate(machineID)
	if !ok {
		if err := st.Destroy(ctx, t.NewMachineLocation(machineID).Metadata()); err != nil && !state.IsNotFoundError(err) {
			return fmt.Errorf("delete location of %s: %w", machineID, err)
		}

		return nil
	}

	if err := safe.StateModify(ctx, st, t.NewMachineLocation(machineID), func(r *resources.MachineLocation) error {
		r.TypedSpec().Value = &specs.MachineLocationSpec{
			SiteId: loc.SiteID, Arch: loc.Arch, Firmware: loc.Firmware, FirmwareSource: loc.FirmwareSource,
			Macs: loc.MACs, AgentConnected: loc.AgentConnected, Schema: resources.MachineLocationSchema,
		}

		if !loc.LastSeen.IsZero() {
			r.TypedSpec().Value.LastSeen = timestamppb.New(loc.LastSeen)
		}

		return nil
	}); err != nil {
		return fmt.Errorf("write location of %s: %w", machineID, err)
	}

	return nil
}
