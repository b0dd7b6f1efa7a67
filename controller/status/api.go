package status

import (
	"context"
	"errors"
	"fmt"
	"net"
	"strings"
	"time"

	"google.golang.org/grpc/codes"
	grpcstatus "google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/outpost-metal/outpost/controller/machines"
	"github.com/outpost-metal/outpost/controller/timeline"
	adminpb "github.com/outpost-metal/outpost/shared/api/admin"
	bootpb "github.com/outpost-metal/outpost/shared/api/boot"
	"github.com/outpost-metal/outpost/shared/metal"
)

// MaxPage is the most machines one ListMachines call returns.
const MaxPage = 5000

// API serves the Machines admin API.
type API struct {
	adminpb.UnimplementedMachinesServer

	machines  Machines
	locations Locations
	role      Role
	// sites tells what sites' operators set for their machines' Secure Boot (nil: nothing).
	sites SiteSecureBoot
}

// Locations is what an operator may change in the controller's machine knowledge (the lifecycle's
// locations, kept in Omni).
type Locations interface {
	// OverrideFirmware sets the operator's firmware for the machine ("": hand it back to the machine's
	// reports) and returns what is assumed now and its source.
	OverrideFirmware(machineID metal.ID, fw metal.Firmware) (now, source string, err error)
	// OverrideSecureBoot sets the operator's word on the machine's Secure Boot (unspecified: hand it back to its
	// site and its BMC) and returns the machine's location as it is now.
	OverrideSecureBoot(machineID metal.ID, s bootpb.SecureBoot) (machines.Location, error)
	// ClearAlert clears the machine's identity alert and returns the one that was set.
	ClearAlert(machineID metal.ID) (string, error)
	// Locate returns where the machine is known to be, with what is known of it.
	Locate(machineID metal.ID) (machines.Location, bool)
	// WaitWritten waits until what is known of the machine is kept in Omni.
	WaitWritten(ctx context.Context, machineID metal.ID) error
}

// writeTimeout bounds how long a change waits to be kept in Omni.
const writeTimeout = 15 * time.Second

// Role tells, when this controller stands by, which one acts and where it accepts edges.
type Role interface {
	ActingElsewhere(ctx context.Context) (holder, uplink string, elsewhere bool)
}

// APIOption changes what NewAPI builds.
type APIOption func(*API)

// WithLocations serves the changes (SetBootMode, ClearAlert) over l; refused as unimplemented without it.
func WithLocations(l Locations) APIOption { return func(a *API) { a.locations = l } }

// SiteSecureBoot tells what a site's operator set for its machines' Secure Boot (machines.SitePolicies).
type SiteSecureBoot interface {
	SecureBoot(site string) bootpb.SecureBoot
}

// WithSitePolicies tells SetSecureBoot's answer the sites' own Secure Boot settings.
func WithSitePolicies(s SiteSecureBoot) APIOption { return func(a *API) { a.sites = s } }

// WithRole refuses changes while this controller stands by: they belong to the acting one, whose machine
// knowledge is the one that is kept.
func WithRole(r Role) APIOption { return func(a *API) { a.role = r } }

// NewAPI returns the Machines admin API over the machines' timelines.
func NewAPI(machines Machines, opts ...APIOption) *API {
	a := &API{machines: machines}
	for _, o := range opts {
		o(a)
	}

	return a
}

// ListMachines implements adminpb.MachinesServer.
func (a *API) ListMachines(_ context.Context, req *adminpb.ListMachinesRequest) (*adminpb.ListMachinesResponse, error) {
	f, err := ParseFilter(req.GetSiteId(), req.GetPhase())
	if err != nil {
		return nil, grpcstatus.Error(codes.InvalidArgument, err.Error())
	}

	limit := int(req.GetLimit())
	if limit <= 0 || limit > MaxPage {
		limit = MaxPage
	}

	list, total := a.machines.List(f, int(min(req.GetOffset(), 1<<30)), limit)

	out := &adminpb.ListMachinesResponse{Total: uint32(total), Machines: make([]*adminpb.Machine, 0, len(list))} // bounded by the book
	for _, m := range list {
		out.Machines = append(out.Machines, machineProto(m))
	}

	return out, nil
}

// ShowMachine implements adminpb.MachinesServer.
func (a *API) ShowMachine(_ context.Context, req *adminpb.ShowMachineRequest) (*adminpb.ShowMachineResponse, error) {
	var (
		rec timeline.Record
		ok  bool
	)

	// A MAC names the machine it belongs to, or a machine only its edge has seen (no boot script yet).
	if hw, err := net.ParseMAC(req.GetMachineId()); err == nil && len(hw) == 6 {
		rec, ok = a.machines.GetByMAC(hw.String())
	} else if id, err := metal.ParsePeerID(req.GetMachineId()); err == nil {
		rec, ok = a.machines.Get(id)
	}

	if !ok {
		return nil, grpcstatus.Errorf(codes.NotFound, "no machine %q is known", clipID(req.GetMachineId()))
	}

	out := &adminpb.ShowMachineResponse{Machine: machineProto(rec.Machine), Dropped: rec.Dropped}
	out.Machine.Diagnosis = timeline.Diagnose(rec, time.Now())
	if sb, source := a.secureBoot(rec.ID); source != "" {
		out.Machine.SecureBoot, out.Machine.SecureBootSource = sb, source
	}
	out.CurrentBoot = uint32(min(timeline.CurrentBoot(rec), len(rec.Entries))) // the timeline holds at most MaxEntries

	for _, e := range rec.Entries {
		out.Timeline = append(out.Timeline, entryProto(e))
	}

	return out, nil
}

// secureBoot is what the machine's plans say of its Secure Boot ("auto" when nobody does) and who said it.
func (a *API) secureBoot(id metal.ID) (string, string) {
	if a.locations == nil {
		return "", ""
	}

	loc, ok := a.locations.Locate(id)
	if !ok {
		return "", ""
	}

	site := bootpb.SecureBoot_SECURE_BOOT_UNSPECIFIED
	if a.sites != nil {
		site = a.sites.SecureBoot(loc.SiteID)
	}

	sb, source := loc.EnforcesSecureBoot(site)

	return machines.SecureBootName(sb), source
}

// SetBootMode implements adminpb.MachinesServer.
func (a *API) SetBootMode(ctx context.Context, req *adminpb.SetBootModeRequest) (*adminpb.SetBootModeResponse, error) {
	out := &adminpb.SetBootModeResponse{}

	err := a.change(ctx, "set the boot mode", req.GetMachineId(), func(id metal.ID) (err error) {
		fw, err := parseBootMode(req.GetFirmware())
		if err != nil {
			return err
		}

		out.Firmware, out.Source, err = a.locations.OverrideFirmware(id, fw)

		return err
	})
	if err != nil {
		return nil, err
	}

	return out, nil
}

// SetSecureBoot implements adminpb.MachinesServer.
func (a *API) SetSecureBoot(ctx context.Context, req *adminpb.SetSecureBootRequest) (*adminpb.SetSecureBootResponse, error) {
	out := &adminpb.SetSecureBootResponse{}

	err := a.change(ctx, "set secure boot", req.GetMachineId(), func(id metal.ID) error {
		if req.GetSecureBoot() == "" {
			return fmt.Errorf("%w: none given", machines.ErrBadSecureBoot)
		}

		sb, err := machines.ParseSecureBoot(strings.ToLower(req.GetSecureBoot()))
		if err != nil {
			return err
		}

		if _, err := a.locations.OverrideSecureBoot(id, sb); err != nil {
			return err
		}

		out.SecureBoot, out.Source = a.secureBoot(id)

		return nil
	})
	if err != nil {
		return nil, err
	}

	return out, nil
}

// parseBootMode parses an operator's boot mode: bios or uefi (any case), or auto, which is "" (the machine's
// own reports decide).
func parseBootMode(s string) (metal.Firmware, error) {
	if strings.EqualFold(s, "auto") {
		return "", nil
	}

	fw, err := metal.ParseFirmware(s)
	if err != nil {
		return "", fmt.Errorf("%w: %q", machines.ErrBadFirmware, s)
	}

	return fw, nil
}

// ClearAlert implements adminpb.MachinesServer.
func (a *API) ClearAlert(ctx context.Context, req *adminpb.ClearAlertRequest) (*adminpb.ClearAlertResponse, error) {
	out := &adminpb.ClearAlertResponse{}

	err := a.change(ctx, "clear the alert", req.GetMachineId(), func(id metal.ID) (err error) {
		out.Cleared, err = a.locations.ClearAlert(id)

		return err
	})
	if err != nil {
		return nil, err
	}

	return out, nil
}

// change makes an operator's change (what) to a machine's knowledge on the acting controller and returns once
// Omni keeps it: refused on a standby (naming the acting one), for a machine never seen at a site, or for bad
// input; Unavailable when Omni does not store it in time (the change is kept and stored when Omni answers).
func (a *API) change(ctx context.Context, what, machineID string, apply func(id metal.ID) error) error {
	if a.locations == nil {
		return grpcstatus.Error(codes.Unimplemented, "this controller keeps no machine locations")
	}

	if a.role != nil {
		if holder, uplink, elsewhere := a.role.ActingElsewhere(ctx); elsewhere {
			return grpcstatus.Errorf(codes.FailedPrecondition, "this controller stands by: %s on the acting one, %s (uplink %s)", what, holder, uplink)
		}
	}

	// A malformed ID names no machine seen at a site.
	id, err := metal.ParsePeerID(machineID)
	if err == nil {
		err = apply(id)
	} else {
		err = machines.ErrNotLocated
	}

	switch {
	case errors.Is(err, machines.ErrBadFirmware), errors.Is(err, machines.ErrBadSecureBoot):
		return grpcstatus.Error(codes.InvalidArgument, err.Error())
	case errors.Is(err, machines.ErrNotLocated):
		return grpcstatus.Errorf(codes.NotFound,
			"machine %q was never seen at a site: it must boot through an edge once, or be in an edge's inventory, before its knowledge can be changed",
			clipID(machineID))
	case err != nil:
		return grpcstatus.Error(codes.Internal, err.Error())
	}

	wctx, cancel := context.WithTimeout(ctx, writeTimeout)
	defer cancel()

	if err := a.locations.WaitWritten(wctx, id); err != nil {
		return grpcstatus.Errorf(codes.Unavailable,
			"%s: done, but Omni has not stored it yet (%v): it is kept and stored when Omni answers; a restart before then loses it", what, err)
	}

	return nil
}

func clipID(s string) string {
	if len(s) > 64 {
		return s[:64] + "…"
	}

	return s
}

func machineProto(m timeline.Machine) *adminpb.Machine {
	out := &adminpb.Machine{
		MachineId: m.ID.String(), SiteId: m.Site, Phase: m.Phase, Power: m.Power, BmcAddress: m.BMCAddress, BmcProtocol: m.BMCProtocol,
		AgentConnected: m.AgentConnected, Waiting: m.Waiting, Installed: m.Installed,
		Macs: m.MACs, Arch: m.Arch, Firmware: m.Firmware,
	}

	if !m.Updated.IsZero() {
		out.Updated = timestamppb.New(m.Updated)
	}

	if m.Last.Kind != "" {
		out.Last = entryProto(m.Last)
	}

	return out
}

func entryProto(e timeline.Entry) *adminpb.TimelineEntry {
	return &adminpb.TimelineEntry{
		Time: timestamppb.New(e.At), Kind: e.Kind, Text: e.Text, Repeats: uint32(min(e.Repeats, 1<<30)), Error: e.Error, // bounded
	}
}
