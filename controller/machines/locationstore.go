package machines

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
	bootpb "github.com/outpost-metal/outpost/shared/api/boot"
	"github.com/outpost-metal/outpost/shared/metal"
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

	loaded, merged := 0, 0

	l.mu.Lock()

	for rec := range list.All() {
		spec := rec.TypedSpec().Value
		id, err := metal.ParseID(rec.Metadata().ID())

		switch {
		case err != nil || spec.GetSiteId() == "":
			l.logger.Warn("machine location record ignored: no valid machine or site", zap.String("record", rec.Metadata().ID()))

			continue
		case spec.GetSchema() > resources.MachineLocationSchema:
			l.logger.Warn("machine location record from a newer controller left alone", zap.Stringer("machine", id),
				zap.Uint32("schema", spec.GetSchema()))

			continue
		}

		if cur, known := l.machines[id]; known {
			// Where the machine is and its agent: what its edge said since the start wins. What the edge
			// does not say (its firmware and who said it, an operator included; its arch, MACs, last boot)
			// comes from the record unless something at least as strong was reported since.
			// (It was marked for writing when the edge reported it; Persist starts after Load and writes the
			// merged view.)
			mergeRecord(cur, spec)

			merged++

			continue
		}

		loc := &Location{
			SiteID: spec.GetSiteId(), AgentConnected: spec.GetAgentConnected(), Arch: storedArch(spec.GetArch()),
			Firmware: spec.GetFirmware(), FirmwareSource: spec.GetFirmwareSource(), MACs: slices.Clone(spec.GetMacs()),
			Alert: knownAlert(spec.GetAlert()), SecureBoot: spec.GetSecureBoot(), SecureBootOverride: spec.GetSecureBootOverride(),
		}

		if ts := spec.GetAlertAt(); loc.Alert != "" && ts.IsValid() {
			loc.AlertAt = ts.AsTime()
		}

		if ts := spec.GetLastSeen(); ts.IsValid() {
			loc.LastSeen = ts.AsTime()
		}

		l.machines[id] = loc
		loaded++
	}

	l.mu.Unlock()

	l.loadedOnce.Do(func() { close(l.loaded) })
	l.logger.Info("machine locations loaded from omni", zap.Int("machines", loaded), zap.Int("merged_with_edge_reports", merged))

	return nil
}

// storedArch is a stored record's arch, parsed ("" when it names none this controller knows).
func storedArch(s string) metal.Arch {
	a, err := metal.ParseArch(s)
	if err != nil {
		return ""
	}

	return a
}

// knownAlert is a stored alert when it is one this controller raises ("" otherwise: a hand-edited record
// cannot put an arbitrary label on a machine).
func knownAlert(a string) string {
	if a == AlertClaimedElsewhere {
		return a
	}

	for _, known := range alertOfRefusal {
		if a == known {
			return a
		}
	}

	return ""
}

// mergeRecord fills in cur, a machine an edge reported since the start, from its stored record: the firmware
// when the record's source ranks above what was reported (an operator's word above a DHCP request) or nothing
// was, the arch when none was reported, the MACs not reported, the later last boot, and the record's alert
// when none is set: a contested UUID always (only an operator clears it), another one only while the
// machine's own tunnel has not opened since (that clears it).
func mergeRecord(cur *Location, spec *specs.MachineLocationSpec) {
	if fw := spec.GetFirmware(); (fw == "bios" || fw == "uefi") &&
		(cur.Firmware == "" || firmwareRank[spec.GetFirmwareSource()] > firmwareRank[cur.FirmwareSource]) {
		cur.Firmware, cur.FirmwareSource = fw, spec.GetFirmwareSource()
	}

	if cur.Arch == "" {
		cur.Arch = storedArch(spec.GetArch())
	}

	// what the BMC and an operator said of Secure Boot only ever comes from here (an edge never says)
	if cur.SecureBoot == bootpb.SecureBoot_SECURE_BOOT_UNSPECIFIED {
		cur.SecureBoot = spec.GetSecureBoot()
	}

	if cur.SecureBootOverride == bootpb.SecureBoot_SECURE_BOOT_UNSPECIFIED {
		cur.SecureBootOverride = spec.GetSecureBootOverride()
	}

	for _, mac := range spec.GetMacs() {
		if len(cur.MACs) < maxMACsPerMachine && !slices.Contains(cur.MACs, mac) {
			cur.MACs = append(cur.MACs, mac)
		}
	}

	if ts := spec.GetLastSeen(); ts.IsValid() && ts.AsTime().After(cur.LastSeen) {
		cur.LastSeen = ts.AsTime()
	}

	if alert := knownAlert(spec.GetAlert()); cur.Alert == "" && (alert == AlertTunnelContested || (alert != "" && !cur.AgentConnected)) {
		cur.Alert = alert
		if ts := spec.GetAlertAt(); ts.IsValid() {
			cur.AlertAt = ts.AsTime()
		}
	}
}

// Persist writes every change to Omni until ctx ends: one record per machine, coalesced (many changes of a
// machine between two passes are one write). A write that fails is retried on the next pass; nothing is lost
// while the process lives.
func (l *Locations) Persist(ctx context.Context, st state.State, t resources.Types) error {
	l.mu.Lock()
	l.persisting = true
	l.mu.Unlock()

	defer func() {
		l.mu.Lock()
		l.persisting = false
		l.endPassLocked()
		l.mu.Unlock()
	}()

	for {
		select {
		case <-ctx.Done():
			return nil
		case <-l.changed:
		}

		l.mu.Lock()
		batch := l.dirty
		l.dirty = map[metal.ID]bool{}
		l.writing = batch
		l.mu.Unlock()

		failed := 0

		for id := range batch {
			if err := l.write(ctx, st, t, id); err != nil {
				l.mu.Lock()
				if ctx.Err() != nil {
					// Stopping: the rest of the pass is written by the next term (or the next process
					// from what the edges report).
					for rest := range batch {
						l.markLocked(rest)
					}

					l.mu.Unlock()

					return nil
				}

				l.markLocked(id)
				l.mu.Unlock()

				failed++
			}
		}

		l.mu.Lock()
		l.endPassLocked()
		l.mu.Unlock()

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

// endPassLocked ends a pass of Persist: its machines are written or dirty again.
func (l *Locations) endPassLocked() {
	l.writing = map[metal.ID]bool{}
	close(l.passed)
	l.passed = make(chan struct{})
}

// WaitWritten waits until what is known of machineID now is written to Omni (at once when nothing is
// pending, or when nothing persists the locations: without Omni they live in memory only). An error means
// ctx ended first: the change is kept and written when Omni answers.
func (l *Locations) WaitWritten(ctx context.Context, machineID metal.ID) error {
	for {
		l.mu.Lock()
		pending := l.persisting && (l.dirty[machineID] || l.writing[machineID])
		passed := l.passed
		l.mu.Unlock()

		if !pending {
			return nil
		}

		select {
		case <-ctx.Done():
			return fmt.Errorf("machine %s: not yet written to omni: %w", machineID, ctx.Err())
		case <-passed:
		}
	}
}

// write writes (or, for a forgotten machine, deletes) machineID's record.
func (l *Locations) write(ctx context.Context, st state.State, t resources.Types, machineID metal.ID) error {
	loc, ok := l.Locate(machineID)
	if !ok {
		if err := st.Destroy(ctx, t.NewMachineLocation(machineID.String()).Metadata()); err != nil && !state.IsNotFoundError(err) {
			return fmt.Errorf("delete location of %s: %w", machineID, err)
		}

		return nil
	}

	if err := safe.StateModify(ctx, st, t.NewMachineLocation(machineID.String()), func(r *resources.MachineLocation) error {
		r.TypedSpec().Value = &specs.MachineLocationSpec{
			SiteId: loc.SiteID, Arch: loc.Arch.String(), Firmware: loc.Firmware, FirmwareSource: loc.FirmwareSource,
			Macs: loc.MACs, AgentConnected: loc.AgentConnected, Schema: resources.MachineLocationSchema,
			Alert: loc.Alert, SecureBoot: loc.SecureBoot, SecureBootOverride: loc.SecureBootOverride,
		}

		if !loc.AlertAt.IsZero() {
			r.TypedSpec().Value.AlertAt = timestamppb.New(loc.AlertAt)
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
