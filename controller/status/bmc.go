package status

import (
	"strings"

	"github.com/outpost-metal/outpost/controller/timeline"
)

// bmcLine says how a machine's BMC is reached: its address and the protocol the edge drives it over. The
// lifecycle knows the BMC by its IPMI credentials, which serve Redfish too; the protocol is the site's setting
// (Options.BMCProtocol), and under auto, where the edge picks Redfish when the BMC answers it, what the
// machine's own newest BMC error names, else the protocol the edge read the BMC's inventory over.
func (p *Pages) bmcLine(rec timeline.Record) string {
	if rec.BMCAddress == "" && rec.BMCProtocol == "" {
		return "not configured"
	}

	addr := dash(rec.BMCAddress)

	setting := "auto"
	if p.opts.BMCProtocol != nil {
		setting = p.opts.BMCProtocol(rec.Site)
	}

	switch setting {
	case "ipmi":
		return "IPMI at " + addr + " (the site's setting)"
	case "redfish":
		return "Redfish at " + addr + " (the site's setting)"
	}

	switch drivenOver(rec.Entries) {
	case "redfish":
		return "Redfish at " + addr + " (auto; its BMC's errors name Redfish)"
	case "ipmi":
		return "IPMI at " + addr + " (auto: its BMC did not answer Redfish)"
	}

	switch rec.DrivenOver {
	case "redfish":
		return "Redfish at " + addr + " (auto: the edge read its inventory over Redfish)"
	case "ipmi":
		return "IPMI at " + addr + " (auto: the edge read its inventory over IPMI; it did not answer Redfish)"
	}

	return addr + ": Redfish where the BMC answers it, else IPMI (auto)"
}

// drivenOver is the protocol the newest BMC error of a timeline names ("" none).
func drivenOver(entries []timeline.Entry) string {
	for i := len(entries) - 1; i >= 0; i-- {
		e := entries[i]
		if !e.Error || FailureReason(e) != ReasonBMC {
			continue
		}

		low := strings.ToLower(e.Text)

		switch {
		case strings.Contains(low, "redfish"):
			return "redfish"
		case strings.Contains(low, "ipmi session") || strings.Contains(low, "rmcp"):
			return "ipmi"
		}
	}

	return ""
}

// shortWaiting is why the lifecycle waits, in one line: the far end's words rather than the error chain.
func shortWaiting(w string) string {
	if i := strings.LastIndex(w, "desc = "); i >= 0 {
		head, _, _ := strings.Cut(w, ": ")
		w = head + ": " + w[i+len("desc = "):]
	}

	return oneLine(w)
}
