package timeline

import (
	"fmt"
	"time"

	bootpb "github.com/outpost-metal/outpost/shared/api/boot"
)

// consoleEntry is a machine's timeline entry of a serial console session its edge journaled. The operator's
// name is the edge's (letters, digits and "@._-" only); the page escapes it anyway.
func consoleEntry(at time.Time, c *bootpb.ConsoleSession) Entry {
	mode := "read-only"
	if c.GetWrite() {
		mode = "read-write"
	}

	who := orUnknown(c.GetOperator())

	switch c.ReportedResult() {
	case bootpb.ConsoleResult_CONSOLE_RESULT_REFUSED:
		return Entry{At: at, Kind: KindBMC, Text: fmt.Sprintf("serial console writer %s refused: another held it", who)}
	case bootpb.ConsoleResult_CONSOLE_RESULT_FAILED:
		return Entry{At: at, Kind: KindBMC, Text: fmt.Sprintf("serial console (%s) of %s failed after %s", mode, who, dur(c.GetDurationMs()))}
	default:
		text := fmt.Sprintf("serial console (%s) by %s: %s, %d bytes out, %d typed", mode, who, dur(c.GetDurationMs()), c.GetBytesOut(), c.GetBytesIn())
		if d := c.GetDroppedBytes(); d > 0 {
			text += fmt.Sprintf(", %d dropped for a slow reader", d)
		}

		return Entry{At: at, Kind: KindBMC, Text: text}
	}
}

func dur(ms uint64) time.Duration {
	return (time.Duration(min(ms, uint64(1<<62)/uint64(time.Millisecond))) * time.Millisecond).Round(time.Second)
}
