package intents_test

import (
	"testing"

	"github.com/outpost-metal/outpost/edge/intents"
	intentspb "github.com/outpost-metal/outpost/shared/api/intents"
)

func FuzzDecodeAll(f *testing.F) {
	good, err := intents.AppendRecord(nil, &intentspb.IntentOutcome{IntentId: "a1", MachineId: "m", Op: "op", State: intentspb.State_STATE_DONE})
	if err != nil {
		f.Fatal(err)
	}

	f.Add(good)
	f.Add(append(append([]byte{}, good...), good[:5]...))
	f.Add([]byte{0, 0, 0, 1, 0, 0, 0, 0, 0})
	f.Add([]byte{})

	f.Fuzz(func(t *testing.T, b []byte) {
		outs, valid := intents.DecodeAll(b)
		if valid > len(b) {
			t.Fatalf("valid prefix %d of %d bytes", valid, len(b))
		}

		for _, o := range outs {
			if o.GetState() == intentspb.State_STATE_UNKNOWN {
				t.Fatalf("decoded an unknown state: %v", o)
			}

			if _, err := intents.AppendRecord(nil, o); err != nil {
				t.Fatalf("a decoded record does not encode: %v", err)
			}
		}
	})
}
