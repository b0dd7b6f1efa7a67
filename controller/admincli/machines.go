package admincli

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"slices"
	"strings"
	"text/tabwriter"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/timestamppb"

	adminpb "github.com/outpost-metal/outpost/shared/api/admin"
	"github.com/outpost-metal/outpost/shared/printable"
)

// Output is how a list or show command prints: a table for people or JSON for programs.
type Output string

// Outputs.
const (
	OutputTable Output = "table"
	OutputJSON  Output = "json"
)

// ParseOutput checks an --output value.
// maxDiagnosis bounds a diagnosis as printed (the controller bounds it too; this is the terminal's guard).
const maxDiagnosis = 400

func ParseOutput(s string) (Output, error) {
	switch Output(s) {
	case OutputTable, "":
		return OutputTable, nil
	case OutputJSON:
		return OutputJSON, nil
	default:
		return "", fmt.Errorf("output %q: want table or json", s)
	}
}

// maxMachinesListed bounds what a list fetches in all (the API pages by at most 5000).
const maxMachinesListed = 1 << 20

// MachineFilter selects machines to list; empty fields select all.
type MachineFilter struct {
	Site, Phase string
}

// machines fetches every machine f selects, page by page.
func (c *Client) machines(ctx context.Context, f MachineFilter) (*adminpb.ListMachinesResponse, error) {
	all := &adminpb.ListMachinesResponse{}

	for {
		resp, err := c.machinesAPI.ListMachines(ctx, &adminpb.ListMachinesRequest{
			SiteId: f.Site, Phase: f.Phase, Offset: uint32(len(all.GetMachines())), // bounded by maxMachinesListed
		})
		if err != nil {
			return nil, describe("list machines", err)
		}

		all.Machines = append(all.Machines, resp.GetMachines()...)
		all.Total = resp.GetTotal()

		if len(resp.GetMachines()) == 0 || len(all.GetMachines()) >= int(resp.GetTotal()) || len(all.GetMachines()) >= maxMachinesListed {
			return all, nil
		}
	}
}

// ListMachines prints the machines f selects, ordered by site then ID.
func (c *Client) ListMachines(ctx context.Context, f MachineFilter, out io.Writer, now time.Time) error {
	resp, err := c.machines(ctx, f)
	if err != nil {
		return err
	}

	if c.Output == OutputJSON {
		return writeJSON(out, resp)
	}

	return writeMachines(out, resp.GetMachines(), now)
}

func writeMachines(out io.Writer, list []*adminpb.Machine, now time.Time) error {
	tw := tabwriter.NewWriter(out, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "MACHINE\tSITE\tPHASE\tPOWER\tAGENT\tBMC\tLAST EVENT")

	for _, m := range list {
		agent := "-"
		if m.GetAgentConnected() {
			agent = "connected"
		}

		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\t%s\n", peer(m.GetMachineId()), dash(peer(m.GetSiteId())), dash(peer(m.GetPhase())),
			dash(peer(m.GetPower())), agent, dash(bmc(m)), lastEvent(m.GetLast(), now))
	}

	return tw.Flush()
}

func bmc(m *adminpb.Machine) string {
	if m.GetBmcProtocol() == "" {
		return ""
	}

	return peer(m.GetBmcProtocol() + " " + m.GetBmcAddress())
}

func lastEvent(e *adminpb.TimelineEntry, now time.Time) string {
	if e == nil {
		return "-"
	}

	return peer(e.GetKind()+": "+e.GetText()) + " (" + ago(e.GetTime(), now) + ")"
}

// ShowMachine prints one machine with its timeline.
func (c *Client) ShowMachine(ctx context.Context, machineID string, out io.Writer, now time.Time) error {
	resp, err := c.machinesAPI.ShowMachine(ctx, &adminpb.ShowMachineRequest{MachineId: machineID})
	if err != nil {
		return describe("show machine", err)
	}

	if c.Output == OutputJSON {
		return writeJSON(out, resp)
	}

	m := resp.GetMachine()
	tw := tabwriter.NewWriter(out, 0, 4, 2, ' ', 0)
	fmt.Fprintf(tw, "machine:\t%s\n", who(m))
	fmt.Fprintf(tw, "booted as:\t%s\n", peer(strings.Join(slices.DeleteFunc([]string{m.GetArch(), m.GetFirmware(), strings.Join(m.GetMacs(), " ")},
		func(s string) bool { return s == "" }), ", ")))
	fmt.Fprintf(tw, "site:\t%s\n", dash(peer(m.GetSiteId())))
	fmt.Fprintf(tw, "phase:\t%s\n", dash(peer(m.GetPhase())))

	if m.GetWaiting() != "" {
		fmt.Fprintf(tw, "waiting:\t%s\n", peer(m.GetWaiting()))
	}

	fmt.Fprintf(tw, "power:\t%s\n", dash(peer(m.GetPower())))
	fmt.Fprintf(tw, "bmc:\t%s\n", dash(bmc(m)))
	fmt.Fprintf(tw, "agent:\t%s\n", map[bool]string{true: "connected", false: "not connected"}[m.GetAgentConnected()])
	fmt.Fprintf(tw, "installed:\t%s\n", map[bool]string{true: "yes", false: "no"}[m.GetInstalled()])

	if sb := m.GetSecureBoot(); sb != "" {
		fmt.Fprintf(tw, "secure boot:\t%s (%s)\n", peer(sb), dash(peer(m.GetSecureBootSource())))
	}

	if d := m.GetDiagnosis(); d != "" {
		fmt.Fprintf(tw, "diagnosis:\t%s\n", printable.String(d, maxDiagnosis)) // a sentence: not cut at a column
	}

	if err := tw.Flush(); err != nil {
		return err
	}

	fmt.Fprintln(out, "\ntimeline:")

	if n := resp.GetDropped(); n > 0 {
		fmt.Fprintf(out, "  (%d earlier entries dropped)\n", n)
	}

	tw = tabwriter.NewWriter(out, 0, 4, 2, ' ', 0)

	for _, e := range resp.GetTimeline() {
		mark := ""
		if e.GetError() {
			mark = "ERROR "
		}

		text := peer(e.GetText())
		if r := e.GetRepeats(); r > 0 {
			text += fmt.Sprintf(" (x%d)", r+1)
		}

		fmt.Fprintf(tw, "  %s\t%s\t%s%s\n", stamp(e.GetTime()), peer(e.GetKind()), mark, text)
	}

	return tw.Flush()
}

// WhyMachine prints where the machine's current network boot stopped (its diagnosis, or that nothing is
// amiss) and the timeline entries of that boot, the evidence.
func (c *Client) WhyMachine(ctx context.Context, machineID string, out io.Writer) error {
	resp, err := c.machinesAPI.ShowMachine(ctx, &adminpb.ShowMachineRequest{MachineId: machineID})
	if err != nil {
		return describe("show machine", err)
	}

	entries := resp.GetTimeline()
	from := min(int(resp.GetCurrentBoot()), len(entries))

	if c.Output == OutputJSON {
		return writeJSON(out, &adminpb.ShowMachineResponse{Machine: resp.GetMachine(), Timeline: entries[from:], CurrentBoot: 0})
	}

	m := resp.GetMachine()

	switch d := m.GetDiagnosis(); {
	case d != "":
		fmt.Fprintf(out, "%s: %s\n", who(m), printable.String(d, maxDiagnosis))
	case from == len(entries) && from > 0:
		fmt.Fprintf(out, "%s: nothing amiss: its last boot went as far as it goes (%s)\n", who(m), peer(entries[from-1].GetText()))
	case len(entries) == 0:
		fmt.Fprintf(out, "%s: nothing known of its boots yet\n", who(m))
	default:
		fmt.Fprintf(out, "%s: nothing amiss: no step of a network boot is overdue\n", who(m))
	}

	if from == len(entries) {
		return nil
	}

	fmt.Fprintln(out, "\nthis boot:")

	tw := tabwriter.NewWriter(out, 0, 4, 2, ' ', 0)

	for _, e := range entries[from:] {
		mark := ""
		if e.GetError() {
			mark = "ERROR "
		}

		fmt.Fprintf(tw, "  %s\t%s\t%s%s\n", stamp(e.GetTime()), peer(e.GetKind()), mark, peer(e.GetText()))
	}

	return tw.Flush()
}

// who names a machine: its ID, or for one only its edge has seen (a MAC no boot script tied yet) the MAC.
func who(m *adminpb.Machine) string {
	if id := m.GetMachineId(); id != "" {
		return peer(id)
	}

	if macs := m.GetMacs(); len(macs) > 0 {
		return peer(macs[0]) + " (no machine ID seen yet)"
	}

	return "-"
}

func stamp(ts *timestamppb.Timestamp) string {
	if !ts.IsValid() {
		return "-"
	}

	return ts.AsTime().Local().Format(time.DateTime)
}

// WatchMachines redraws the machine list every interval until ctx ends (a clear screen, then the table).
func (c *Client) WatchMachines(ctx context.Context, f MachineFilter, out io.Writer, every time.Duration, now func() time.Time) error {
	tick := time.NewTicker(every)
	defer tick.Stop()

	for {
		var frame strings.Builder

		frame.WriteString("\x1b[H\x1b[2J") // home, clear

		fmt.Fprintf(&frame, "machines%s, every %s (Ctrl-C ends)  %s\n\n", describeFilter(f), every, now().Format(time.TimeOnly))

		callCtx, cancel := context.WithTimeout(ctx, every+10*time.Second)
		resp, err := c.machines(callCtx, f)

		cancel()

		switch {
		case ctx.Err() != nil:
			return nil
		case err != nil:
			fmt.Fprintf(&frame, "%v\n", err)
		default:
			if err := writeMachines(&frame, resp.GetMachines(), now()); err != nil {
				return err
			}
		}

		if _, err := io.WriteString(out, frame.String()); err != nil {
			return err
		}

		select {
		case <-ctx.Done():
			return nil
		case <-tick.C:
		}
	}
}

func describeFilter(f MachineFilter) string {
	var s string
	if f.Site != "" {
		s += " at " + peer(f.Site)
	}

	if f.Phase != "" {
		s += ", " + peer(f.Phase)
	}

	return s
}

// writeJSON prints messages as one JSON document (protobuf field names, every field present).
func writeJSON(out io.Writer, m proto.Message) error {
	raw, err := protojson.MarshalOptions{Multiline: true, Indent: "  ", EmitUnpopulated: true}.Marshal(m)
	if err != nil {
		return err
	}

	_, err = fmt.Fprintf(out, "%s\n", raw)

	return err
}

// writeJSONObject prints named messages as one JSON object.
func writeJSONObject(out io.Writer, parts map[string]proto.Message) error {
	obj := map[string]json.RawMessage{}

	for k, m := range parts {
		raw, err := protojson.MarshalOptions{EmitUnpopulated: true}.Marshal(m)
		if err != nil {
			return err
		}

		obj[k] = raw
	}

	enc := json.NewEncoder(out)
	enc.SetIndent("", "  ")

	return enc.Encode(obj)
}

// siteMachines returns a site's machines, or nil when the controller has no Machines API (an older one).
func (c *Client) siteMachines(ctx context.Context, siteID string) (*adminpb.ListMachinesResponse, error) {
	resp, err := c.machines(ctx, MachineFilter{Site: siteID})
	if status.Code(err) == codes.Unimplemented {
		return nil, nil // nothing to show is not an error
	}

	return resp, err
}

// SetBootMode sets (bios, uefi) or hands back (auto) a machine's boot mode and prints what is assumed now.
func (c *Client) SetBootMode(ctx context.Context, machineID, firmware string, out io.Writer) error {
	resp, err := c.machinesAPI.SetBootMode(ctx, &adminpb.SetBootModeRequest{MachineId: machineID, Firmware: firmware})
	if err != nil {
		return describe("set boot mode", err)
	}

	if c.Output == OutputJSON {
		return writeJSON(out, resp)
	}

	source := resp.GetSource()
	switch source {
	case "operator":
		source = "set by an operator"
	case "":
		source = "until the machine reports one"
	default:
		source = "as the machine reported it (" + source + ")"
	}

	_, err = fmt.Fprintf(out, "machine %s boots as %s, %s\n", peer(machineID), dash(resp.GetFirmware()), source)

	return err
}

// SetSecureBoot sets (on, off) or hands back (auto) an operator's word on a machine's Secure Boot and prints
// what its plans say now.
func (c *Client) SetSecureBoot(ctx context.Context, machineID, secureBoot string, out io.Writer) error {
	resp, err := c.machinesAPI.SetSecureBoot(ctx, &adminpb.SetSecureBootRequest{MachineId: machineID, SecureBoot: secureBoot})
	if err != nil {
		return describe("set secure boot", err)
	}

	if c.Output == OutputJSON {
		return writeJSON(out, resp)
	}

	var said string

	switch resp.GetSource() {
	case "operator":
		said = "set by an operator"
	case "site":
		said = "as its site's setting says"
	case "bmc":
		said = "as its BMC reports"
	default:
		said = "nobody says: the edge's own setting decides"
	}

	_, err = fmt.Fprintf(out, "machine %s: secure boot %s, %s\n", peer(machineID), peer(resp.GetSecureBoot()), said)

	return err
}

// ClearAlert clears a machine's identity alert and says which one it was.
func (c *Client) ClearAlert(ctx context.Context, machineID string, out io.Writer) error {
	resp, err := c.machinesAPI.ClearAlert(ctx, &adminpb.ClearAlertRequest{MachineId: machineID})
	if err != nil {
		return describe("clear alert", err)
	}

	if c.Output == OutputJSON {
		return writeJSON(out, resp)
	}

	if resp.GetCleared() == "" {
		_, err = fmt.Fprintf(out, "machine %s had no alert\n", peer(machineID))

		return err
	}

	_, err = fmt.Fprintf(out, "machine %s: alert %s cleared\n", peer(machineID), resp.GetCleared())

	return err
}
