package timeline

import (
	"cmp"
	"context"
	"fmt"
	"slices"
	"sync/atomic"
	"time"

	"github.com/cosi-project/runtime/pkg/safe"
	"github.com/cosi-project/runtime/pkg/state"
	"go.uber.org/zap"
	"golang.org/x/sync/errgroup"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/outpost-metal/outpost/controller/resources"
	"github.com/outpost-metal/outpost/controller/resources/specs"
	"github.com/outpost-metal/outpost/shared/metal"
)

// component names the book in logs.
const component = "machine_timelines"

// Load merges the MachineTimeline records kept in Omni into the book: a machine's stored entries come before
// the ones recorded since this process started (capped as usual), and its stored summary is taken where the
// lifecycle has not said anything newer. A record that names no valid machine or was written by a newer
// controller is left alone and logged.
func (b *Book) Load(ctx context.Context, st state.State, t resources.Types, log *zap.Logger) error {
	if err := t.RegisterTimeline(); err != nil {
		return err
	}

	list, err := safe.StateList[*resources.MachineTimeline](ctx, st, t.NewMachineTimeline("").Metadata())
	if err != nil {
		return fmt.Errorf("list machine timelines: %w", err)
	}

	log = log.With(zap.String("component", component))

	loaded := 0

	for rec := range list.All() {
		raw := rec.Metadata().ID()
		id, err := metal.ParseID(raw)

		switch spec := rec.TypedSpec().Value; {
		case err != nil || id.String() != raw: // the canonical form only, as the book writes it
			log.Warn("machine timeline record ignored: no valid machine", zap.String("record", raw))
		case spec.GetSchema() > resources.MachineTimelineSchema:
			log.Warn("machine timeline record from a newer controller left alone", zap.Stringer("machine", id),
				zap.Uint32("schema", spec.GetSchema()))
		default:
			b.merge(id, FromSpec(spec, b.cfg.MaxText))

			loaded++
		}
	}

	log.Info("machine timelines loaded from omni", zap.Int("machines", loaded))

	return nil
}

// merge puts a stored record under what this process recorded.
func (b *Book) merge(id metal.ID, stored Record) {
	b.mu.Lock()
	defer b.mu.Unlock()

	m, known := b.machines[id]
	if !known {
		m = b.getLocked(id, true, true)
		m.Machine = stored.Machine
		m.ID = id
	} else {
		// what the edges said since start stays; what only the lifecycle says comes from the record until
		// the lifecycle says it again
		m.Site = cmp.Or(m.Site, stored.Site)
		m.Phase = cmp.Or(m.Phase, stored.Phase)
		m.Power = cmp.Or(m.Power, stored.Power)
		m.BMCAddress, m.BMCProtocol = cmp.Or(m.BMCAddress, stored.BMCAddress), cmp.Or(m.BMCProtocol, stored.BMCProtocol)
		m.Waiting = cmp.Or(m.Waiting, stored.Waiting)
		m.Installed = m.Installed || stored.Installed
		m.Arch, m.Firmware = cmp.Or(m.Arch, stored.Arch), cmp.Or(m.Firmware, stored.Firmware)

		for _, mac := range stored.MACs {
			if !slices.Contains(m.MACs, mac) && len(m.MACs) < maxMACs {
				m.MACs = append(m.MACs, mac)
			}
		}
	}

	entries := append(slices.Clone(stored.Entries), m.Entries...)
	slices.SortStableFunc(entries, func(a, b Entry) int { return a.At.Compare(b.At) })

	m.Dropped += stored.Dropped
	if over := len(entries) - b.cfg.MaxEntries; over > 0 {
		entries = entries[over:]
		m.Dropped += uint64(over)
	}

	m.Entries = entries
	if len(entries) > 0 {
		m.Last = entries[len(entries)-1]
	}

	if known {
		b.touchLocked(m) // what was recorded before Load must be written with the stored entries
	}
}

// FromSpec reads a stored timeline, bounding every string to maxText bytes. Records are written by this
// controller but read back from Omni, where anyone with write access to the namespace could change them.
func FromSpec(spec *specs.MachineTimelineSpec, maxText int) Record {
	rec := Record{
		Machine: Machine{
			Site: clip(spec.GetSiteId(), maxText), Phase: clip(spec.GetPhase(), 64), Power: clip(spec.GetPower(), 16),
			BMCAddress: clip(spec.GetBmcAddress(), maxText), BMCProtocol: clip(spec.GetBmcProtocol(), 16),
			AgentConnected: spec.GetAgentConnected(), Waiting: clip(spec.GetWaiting(), maxText), Installed: spec.GetInstalled(),
			Arch: clip(spec.GetArch(), 16), Firmware: clip(spec.GetFirmware(), 16),
		},
		Dropped: spec.GetDropped(),
	}

	if ts := spec.GetUpdated(); ts.IsValid() {
		rec.Updated = ts.AsTime()
	}

	for _, mac := range spec.GetMacs() {
		if mac, ok := normalMAC(mac); ok && len(rec.MACs) < maxMACs {
			rec.MACs = append(rec.MACs, mac)
		}
	}

	for _, e := range spec.GetEntries() {
		entry := Entry{Kind: clip(e.GetKind(), 32), Text: clip(e.GetText(), maxText), Repeats: int(e.GetRepeats()), Error: e.GetError()}
		if ts := e.GetTime(); ts.IsValid() {
			entry.At = ts.AsTime()
		}

		rec.Entries = append(rec.Entries, entry)
	}

	if n := len(rec.Entries); n > 0 {
		rec.Last = rec.Entries[n-1]
	}

	return rec
}

// ToSpec is the stored form of a record.
func ToSpec(rec Record) *specs.MachineTimelineSpec {
	spec := &specs.MachineTimelineSpec{
		Schema: resources.MachineTimelineSchema, Dropped: rec.Dropped, SiteId: rec.Site, Phase: rec.Phase, Power: rec.Power,
		BmcAddress: rec.BMCAddress, BmcProtocol: rec.BMCProtocol, AgentConnected: rec.AgentConnected, Waiting: rec.Waiting,
		Installed: rec.Installed, Macs: rec.MACs, Arch: rec.Arch, Firmware: rec.Firmware,
	}

	if !rec.Updated.IsZero() {
		spec.Updated = timestamppb.New(rec.Updated)
	}

	for _, e := range rec.Entries {
		spec.Entries = append(spec.Entries, &specs.TimelineEntry{
			Time: timestamppb.New(e.At), Kind: e.Kind, Text: e.Text, Repeats: uint32(min(e.Repeats, 1<<31)), Error: e.Error, // bounded
		})
	}

	return spec
}

// Persist writes changed timelines to Omni until ctx ends: every WriteInterval, each machine changed since
// the last pass is written once (many changes in between are one write). A failed write is retried at the
// next pass; nothing is lost while the process lives.
func (b *Book) Persist(ctx context.Context, st state.State, t resources.Types, log *zap.Logger) error {
	if err := t.RegisterTimeline(); err != nil {
		return err
	}

	log = log.With(zap.String("component", component))

	tick := time.NewTicker(b.cfg.WriteInterval)
	defer tick.Stop()

	for {
		select {
		case <-ctx.Done():
			return nil
		case <-tick.C:
		}

		if failed := b.Flush(ctx, st, t); failed > 0 && ctx.Err() == nil {
			log.Warn("machine timelines not written to omni, retrying", zap.Int("failed", failed))
		}
	}
}

// flushWriters is how many timelines Flush writes at once: each write is a read and an update in Omni, and
// the ramp of 20,000 machines left tens of thousands of writes that one writer took minutes to catch up on.
const flushWriters = 8

// Flush writes every timeline changed since the last flush now, and those changed by repeats only once
// RepeatWriteInterval has passed since they were last written, and returns how many writes failed (they stay
// to be written).
func (b *Book) Flush(ctx context.Context, st state.State, t resources.Types) (failed int) {
	b.mu.Lock()
	batch := b.dirty
	b.dirty = map[metal.ID]bool{}

	if now := b.now(); now.Sub(b.repeatsWritten) >= b.cfg.RepeatWriteInterval {
		for id := range b.repeated {
			batch[id] = true
		}

		b.repeated = map[metal.ID]bool{}
		b.repeatsWritten = now
	}
	b.mu.Unlock()

	var (
		eg       errgroup.Group
		failures atomic.Int64
	)

	eg.SetLimit(flushWriters)

	for id := range batch {
		rec, ok := b.Get(id)
		if !ok {
			continue
		}

		eg.Go(func() error {
			err := safe.StateModify(ctx, st, t.NewMachineTimeline(id.String()), func(r *resources.MachineTimeline) error {
				r.TypedSpec().Value = ToSpec(rec)

				return nil
			})
			if err != nil {
				failures.Add(1)
				b.metrics.writeFailures.Inc()

				b.mu.Lock()
				b.dirty[id] = true
				b.mu.Unlock()

				return nil
			}

			b.metrics.writes.Inc()

			return nil
		})
	}

	_ = eg.Wait() // the writes return no error: a failed one is counted and stays to be written

	b.mu.Lock()
	b.metrics.pending.Set(float64(len(b.dirty) + len(b.repeated)))
	b.mu.Unlock()

	return int(failures.Load())
}
