package status

import (
	"strings"
	"time"
	"unicode/utf8"

	"github.com/outpost-metal/outpost/controller/timeline"
)

// Failure reasons: what a failed timeline entry was about, as the fleet view counts failures and a machine's
// summary names its cause. The set is fixed (no per-machine values).
const (
	ReasonSiteOffline = "site offline"
	ReasonBMC         = "bmc"
	ReasonDownload    = "download"
	ReasonAssets      = "assets missing"
	ReasonAgent       = "agent"
	ReasonWipe        = "wipe"
	ReasonAlert       = "alert"
	ReasonOther       = "other"
)

// FailureReasons lists the failure reasons in the order the fleet view stacks them.
func FailureReasons() []string {
	return []string{ReasonSiteOffline, ReasonBMC, ReasonDownload, ReasonAssets, ReasonAgent, ReasonWipe, ReasonAlert, ReasonOther}
}

// FailureReason says what a failed entry was about.
func FailureReason(e timeline.Entry) string {
	low := strings.ToLower(e.Text)

	switch {
	case strings.Contains(low, "site offline"):
		return ReasonSiteOffline
	case e.Kind == timeline.KindPower || strings.Contains(low, "bmc") || strings.Contains(low, "ipmi") || strings.Contains(low, "redfish"):
		return ReasonBMC
	case e.Kind == timeline.KindAssetFetch || e.Kind == timeline.KindPXE:
		return ReasonDownload
	case e.Kind == timeline.KindAssetWait:
		return ReasonAssets
	case e.Kind == timeline.KindIntent:
		return ReasonAlert
	case strings.Contains(low, "agent"):
		return ReasonAgent
	case strings.Contains(low, "wipe"):
		return ReasonWipe
	}

	return ReasonOther
}

// Now is a machine's summary as the list pages show it: its current problem in one line, or its last event.
type Now struct {
	// Text is the one line (never the error chain: that is on the machine's page).
	Text string
	// Problem is set when Text is a problem that still holds.
	Problem bool
	// Since is when the problem began, or when the last event happened.
	Since time.Time
	// Cleared is the problem the machine had last, when the thing it was about recovered since ("" none).
	Cleared string
}

// maxLine bounds a summary line in bytes.
const maxLine = 140

// Summarize says where a machine is now: the newest entry of its timeline, unless that is an error about a site
// that is back online (site is its site's link state now) or a BMC that answers again (the lifecycle reads the
// machine's power once more); then the newest entry that is not such an error, and what was cleared. A problem
// is one line (what, which BMC or site) with the time its run of failures of the same kind began.
func Summarize(rec timeline.Record, siteState string) Now {
	entries := rec.Entries
	if len(entries) == 0 && rec.Last.Kind != "" {
		entries = []timeline.Entry{rec.Last}
	}

	if len(entries) == 0 {
		return Now{}
	}

	last := entries[len(entries)-1]
	if !last.Error {
		return Now{Text: oneLine(last.Kind + ": " + last.Text), Since: last.At}
	}

	reason := FailureReason(last)
	line := cause(rec.Machine, last, reason)

	if recovered(rec.Machine, reason, siteState) {
		out := Now{Cleared: line}

		for i := len(entries) - 1; i >= 0; i-- {
			if e := entries[i]; !e.Error {
				out.Text, out.Since = oneLine(e.Kind+": "+e.Text), e.At

				break
			}
		}

		return out
	}

	// the run of failures of this kind the newest belongs to (a silent BMC fails the edge's watch and the
	// lifecycle's calls in turn) began with its oldest entry
	since := last.Since()

	for i := len(entries) - 2; i >= 0; i-- {
		e := entries[i]
		if !e.Error || FailureReason(e) != reason {
			break
		}

		since = e.Since()
	}

	return Now{Text: line, Problem: true, Since: since}
}

// recovered reports whether the thing a failure of reason was about works again.
func recovered(m timeline.Machine, reason, siteState string) bool {
	switch reason {
	case ReasonSiteOffline:
		return siteState == "connected"
	case ReasonBMC:
		return m.Power == "on" || m.Power == "off"
	}

	return false
}

// cause is a failed entry in one line: what failed, and which BMC or site.
func cause(m timeline.Machine, e timeline.Entry, reason string) string {
	switch reason {
	case ReasonSiteOffline:
		if m.Site != "" {
			return "site " + m.Site + " offline"
		}

		return "site offline"
	case ReasonBMC:
		bmc := "BMC"
		if m.BMCAddress != "" {
			bmc += " " + m.BMCAddress
		}

		if e.Kind == timeline.KindPower || silent(e.Text) {
			return bmc + " not answering"
		}

		return bmc + ": " + oneLine(e.Text)
	}

	return oneLine(e.Text)
}

// silent reports whether an error chain says the far end did not answer (the gRPC codes the edge gives a BMC
// that timed out or could not be reached).
func silent(chain string) bool {
	return strings.Contains(chain, "code = DeadlineExceeded") || strings.Contains(chain, "code = Unavailable") ||
		strings.Contains(chain, "not answering") || strings.Contains(chain, "i/o timeout")
}

// oneLine is an entry's text without the error chain the timeline keeps after its cause ("Step: cause (chain)"),
// on one line, bounded on a word boundary.
func oneLine(text string) string {
	if i := strings.Index(text, " ("); i > 0 && strings.Contains(text[i:], "rpc error") {
		text = text[:i]
	}

	text = strings.Join(strings.Fields(text), " ")
	if len(text) <= maxLine {
		return text
	}

	cut := maxLine
	for cut > 0 && !utf8.RuneStart(text[cut]) {
		cut--
	}

	if sp := strings.LastIndexByte(text[:cut], ' '); sp > maxLine/2 {
		cut = sp
	}

	return text[:cut] + "…"
}
