package timeline_test

import (
	"testing"

	"google.golang.org/protobuf/proto"

	"github.com/outpost-metal/outpost/controller/resources/specs"
	"github.com/outpost-metal/outpost/controller/timeline"
	bootpb "github.com/outpost-metal/outpost/shared/api/boot"
)

// FuzzHandleEvent feeds arbitrary edge events (what an edge sends is untrusted): never a panic or an error,
// and every timeline stays within its bounds.
func FuzzHandleEvent(f *testing.F) {
	for _, e := range []*bootpb.Event{
		event(&bootpb.DHCPSeen{Mac: "52:54:00:12:34:56", Firmware: "uefi-x86"}),
		event(&bootpb.BootServed{Uuid: m1, Mac: "52:54:00:12:34:56", RemoteIp: "10.0.0.5", Mode: "install"}),
		event(&bootpb.PXESeen{RemoteIp: "10.0.0.5", File: "ipxe.efi", Error: "x"}),
		event(&bootpb.AssetFetch{RemoteIp: "10.0.0.5", File: "agent/x86_64/vmlinuz", Sent: 1, Size: 9, Error: "reset"}),
		event(&bootpb.AgentTunnel{MachineId: m1, Open: true}),
		event(&bootpb.PowerChanged{MachineId: m1, State: "unknown", Error: "\x1b[2J"}),
	} {
		raw, err := proto.Marshal(e)
		if err != nil {
			f.Fatal(err)
		}

		f.Add(raw, raw)
	}

	f.Fuzz(func(t *testing.T, a, b []byte) {
		cfg := timeline.DefaultConfig()
		cfg.MaxEntries, cfg.MaxText = 4, 40
		book := timeline.New(cfg, newClock().Now)

		for range 3 {
			for _, raw := range [][]byte{a, b} {
				e := &bootpb.Event{}
				if proto.Unmarshal(raw, e) != nil {
					continue
				}

				if err := book.HandleEvent(t.Context(), "site-a", e); err != nil {
					t.Fatal(err)
				}
			}
		}

		list, _ := book.List(timeline.Filter{}, 0, 0)
		for _, m := range list {
			rec, _ := book.Get(m.ID)
			if len(rec.Entries) > cfg.MaxEntries {
				t.Fatalf("%d entries", len(rec.Entries))
			}

			for _, e := range rec.Entries {
				if len(e.Text) > cfg.MaxText+len("…") {
					t.Fatalf("entry of %d bytes", len(e.Text))
				}
			}
		}
	})
}

// FuzzFromSpec reads arbitrary stored records (Omni's store is written by others too): bounded, no panic.
func FuzzFromSpec(f *testing.F) {
	raw, _ := proto.Marshal(&specs.MachineTimelineSpec{SiteId: "a", Entries: []*specs.TimelineEntry{{Kind: "dhcp", Text: "x"}}})
	f.Add(raw)

	f.Fuzz(func(t *testing.T, raw []byte) {
		spec := &specs.MachineTimelineSpec{}
		if proto.Unmarshal(raw, spec) != nil {
			return
		}

		rec := timeline.FromSpec(spec, 50)
		if len(rec.Site) > 50+len("…") || len(rec.Entries) != len(spec.GetEntries()) {
			t.Fatalf("unbounded: %d", len(rec.Site))
		}
	})
}
