package timeline_test

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/outpost-metal/outpost/controller/timeline"
	bootpb "github.com/outpost-metal/outpost/shared/api/boot"
)

// An edge's journaled console sessions join the machine's timeline: who, read or write, how long, bytes.
func TestConsoleSessionsInTimeline(t *testing.T) {
	t.Parallel()

	b := timeline.New(timeline.DefaultConfig(), newClock().Now)
	bootOnce(t, b, m1)

	for _, c := range []*bootpb.ConsoleSession{
		{MachineId: m1, Operator: "alice@noc", Write: true, Result: "ok", DurationMs: 12_400, BytesOut: 3456, BytesIn: 12, DroppedBytes: 100},
		{MachineId: m1, Operator: "bob@noc", Write: true, Result: "refused"},
		// a newer edge's event: the enum (and the name, which a changed name must not override)
		{MachineId: m1, Operator: "carol@noc", ConsoleResult: bootpb.ConsoleResult_CONSOLE_RESULT_FAILED, Result: "ok", DurationMs: 2_000},
	} {
		require.NoError(t, b.HandleEvent(t.Context(), "site-a", &bootpb.Event{Kind: &bootpb.Event_ConsoleSession{ConsoleSession: c}}))
	}

	rec, ok := b.Get(m1)
	require.True(t, ok)

	n := len(rec.Entries)
	require.Equal(t, timeline.KindBMC, rec.Entries[n-3].Kind)
	require.Equal(t, "serial console (read-write) by alice@noc: 12s, 3456 bytes out, 12 typed, 100 dropped for a slow reader", rec.Entries[n-3].Text)
	require.Equal(t, "serial console writer bob@noc refused: another held it", rec.Entries[n-2].Text)
	require.Equal(t, "serial console (read-only) of carol@noc failed after 2s", rec.Entries[n-1].Text, "the enum first")
}
