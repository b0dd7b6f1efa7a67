package timeline

import (
	"fmt"
	"strings"
	"time"
)

// Graces: how long a step of a network boot may take after the one before it before Diagnose calls it the
// step where the boot stopped. Servers take minutes from power-on to their first DHCP request.
const (
	firstDHCPGrace = 5 * time.Minute
	stepGrace      = 3 * time.Minute
	installGrace   = 15 * time.Minute
	// dhcpLoop is how many DHCP requests in a row with nothing after them make a boot that goes round in
	// circles (a normal one asks twice: the firmware, then iPXE).
	dhcpLoop = 4
	// fetchLoop is how many failed downloads in a row (iPXE's retries) make a boot that will not get its kernel.
	fetchLoop = 2
)

// Diagnose says in one sentence where the machine's current network boot stopped, read from its timeline:
// the first step after its last power-on or reboot (a DHCP request, the firmware's boot file, iPXE's boot
// script, the agent's tunnel, the install) that did not come within its grace, or what held it (assets the
// site lacks, a refused tunnel). It is "" when nothing is amiss: nothing since the last boot that went as far
// as it goes, the boot got as far as it should, or a step is still within its grace. Without a power-on by
// the controller (a machine powered on by hand) the missing first DHCP request cannot be timed and is not
// diagnosed.
func Diagnose(rec Record, now time.Time) string {
	start, powered := currentBoot(rec.Entries)
	if start == len(rec.Entries)-1 && !powered {
		return "" // nothing since a boot that went as far as it goes
	}

	var (
		dhcp, pxe, served, plan  *Entry
		pxeFailed, wait, refused *Entry
		// notOffered is the last DHCP request of this boot its edge offered nothing to, for a reason of the
		// machine's own (an answered one since clears it).
		notOffered *Entry
		// fetchFailed is the last asset download stopped early in this boot, fetchFailures counts them since
		// the last whole one (iPXE retries a download, then the whole script: failures add up across both).
		fetchFailed   *Entry
		fetchFailures int
	)

	for i := start + 1; i < len(rec.Entries); i++ {
		e := &rec.Entries[i]

		switch {
		case e.Kind == KindAgentUp, e.Kind == KindDiskBoot, e.Kind == KindInstalled:
			return "" // as far as a boot goes
		case e.Kind == KindDHCP && e.Error:
			dhcp, notOffered = e, e
		case e.Kind == KindDHCP:
			dhcp, notOffered = e, nil
		case e.Kind == KindPXE && e.Error:
			pxeFailed = e
		case e.Kind == KindPXE:
			pxe, pxeFailed = e, nil
		case e.Kind == KindAssetWait:
			wait = e
		case e.Kind == KindBootServed:
			served, wait = e, nil
		case e.Kind == KindInstallPlan:
			plan, wait = e, nil
		case e.Kind == KindAssetFetch && e.Error:
			fetchFailed, fetchFailures = e, fetchFailures+1+e.Repeats
		case e.Kind == KindAssetFetch:
			fetchFailed, fetchFailures = nil, 0
		case e.Kind == KindError && strings.Contains(e.Text, "tunnel") && strings.Contains(e.Text, "refused"):
			refused = e
		}
	}

	at := func(e *Entry) string { return e.At.UTC().Format("15:04:05") }
	late := func(since time.Time, grace time.Duration) bool { return now.Sub(since) > grace }

	switch {
	case refused != nil:
		return fmt.Sprintf("its agent's tunnel was refused at %s: %s", at(refused), refused.Text)
	case notOffered != nil:
		return fmt.Sprintf("its edge offered its DHCP request at %s nothing: %s", at(notOffered), notOffered.Text)
	case wait != nil:
		return fmt.Sprintf("its boot has waited since %s for boot assets this site does not hold: stage them (controller assets stage) or let the site fetch them (controller site policy)", at(wait))
	case plan != nil && fetchFailed != nil:
		if fetchFailures >= fetchLoop || late(plan.At, stepGrace) {
			return fmt.Sprintf("its install plan was served at %s, then %s (the last at %s): %s", at(plan), times("an asset download failed", fetchFailures), at(fetchFailed), fetchFailed.Text)
		}
	case plan != nil:
		if late(plan.At, installGrace) {
			return fmt.Sprintf("its install plan was served at %s and no install was reported since: the installer did not finish or cannot reach Omni", at(plan))
		}
	case served != nil && fetchFailed != nil:
		if fetchFailures >= fetchLoop || late(served.At, stepGrace) {
			return fmt.Sprintf("iPXE fetched its agent-mode boot script at %s, then %s (the last at %s): %s", at(served), times("a download failed", fetchFailures), at(fetchFailed), fetchFailed.Text)
		}
	case served != nil:
		if late(served.At, stepGrace) {
			return fmt.Sprintf("its agent-mode boot script was served at %s but no agent tunnel opened since: the kernel or initramfs download, or the agent's way to the edge, failed", at(served))
		}
	case pxeFailed != nil:
		return fmt.Sprintf("the firmware's boot file download failed at %s: %s", at(pxeFailed), pxeFailed.Text)
	case pxe != nil:
		if late(pxe.At, stepGrace) {
			return fmt.Sprintf("the firmware fetched its boot file at %s but iPXE never asked for its boot script: iPXE's own DHCP, or HTTP to the edge, failed", at(pxe))
		}
	case dhcp != nil && dhcp.Repeats >= dhcpLoop-1:
		return fmt.Sprintf("its DHCP requests keep coming (%d in a row, the last at %s) and no boot file was fetched: the firmware does not take the edge's offer or cannot reach the edge (TFTP/HTTP blocked?)", dhcp.Repeats+1, at(dhcp))
	case dhcp != nil:
		if late(dhcp.At, stepGrace) {
			return fmt.Sprintf("its DHCP request was seen at %s but no boot file was fetched: the firmware did not take the edge's offer (network boot off in the firmware, or TFTP/HTTP to the edge blocked)", at(dhcp))
		}
	case powered:
		if late(rec.Entries[start].At, firstDHCPGrace) {
			return fmt.Sprintf("powered on at %s and no DHCP request from its interfaces since: check its boot order, its NIC and VLAN, and that the edge serves that segment", at(&rec.Entries[start]))
		}
	}

	return ""
}

// CurrentBoot returns the index of the first entry of the machine's current network boot, the one Diagnose
// reads: its last power-on or reboot by the controller, or the first entry after the last boot that went as
// far as it goes (len(rec.Entries) when nothing came since).
func CurrentBoot(rec Record) int {
	start, powered := currentBoot(rec.Entries)
	if powered {
		return start
	}

	return start + 1
}

// currentBoot finds where the current boot begins: at the last power-on or reboot the controller made
// (powered), or, when a boot got as far as it goes after that (or there is no power entry: a machine powered
// on by hand), right after that boot (start is then that boot's last entry, -1 when there is none).
func currentBoot(entries []Entry) (start int, powered bool) {
	start = -1

	for i, e := range entries {
		switch {
		case e.Kind == KindPower && (strings.HasPrefix(e.Text, "powered on") || strings.HasPrefix(e.Text, "rebooted")):
			start, powered = i, true
		case e.Kind == KindAgentUp, e.Kind == KindAgentDown, e.Kind == KindDiskBoot, e.Kind == KindInstalled:
			start, powered = i, false
		}
	}

	return start, powered
}

// times says how often something happened: "a download failed", "a download failed twice", "... 3 times".
func times(what string, n int) string {
	switch {
	case n <= 1:
		return what
	case n == 2:
		return what + " twice"
	default:
		return fmt.Sprintf("%s %d times", what, n)
	}
}
