package status

import (
	"context"
	"errors"
	"strings"
	"time"

	"google.golang.org/grpc/codes"
	grpcstatus "google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/outpost-metal/outpost/controller/lifecycle"
	"github.com/outpost-metal/outpost/controller/timeline"
	adminpb "github.com/outpost-metal/outpost/shared/api/admin"
)

// MaxPage is the most machines one ListMachines call returns.
const MaxPage = 5000

// API serves the Machines admin API.
type API struct {
	adminpb.UnimplementedMachinesServer

	machines  Machines
	bootModes BootModes
	role      Role
}

// BootModes keeps the operator's boot mode per machine (the lifecycle's locations).
type BootModes interface {
	OverrideFirmware(machineID, firmware string) (now, source string, err error)
	// ClearAlert clears the machine's identity alert and returns the one that was set.
	ClearAlert(machineID string) (string, error)
	// WaitWritten waits until what is known of the machine is kept in Omni.
	WaitWritten(ctx context.Context, machineID string) error
}

// writeTimeout bounds how long SetBootMode waits for the change to be kept in Omni.
const writeTimeout = 15 * time.Second

// Role tells whether this controller acts now and, when it stands by, which one does.
type Role interface {
	Acting() bool
	Holder(ctx context.Context) (holder, uplink string, err error)
}

// APIOption changes what NewAPI builds.
type APIOption func(*API)

// WithBootModes serves SetBootMode over b; refused as unavailable without it.
func WithBootModes(b BootModes) APIOption { return func(a *API) { a.bootModes = b } }

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

// SetBootMode implements adminpb.MachinesServer.
func (a *API) SetBootMode(ctx context.Context, req *adminpb.SetBootModeRequest) (*adminpb.SetBootModeResponse, error) {
	if a.bootModes == nil {
		return nil, grpcstatus.Error(codes.Unimplemented, "this controller keeps no machine locations")
	}

	if err := a.acting(ctx, "set the boot mode"); err != nil {
		return nil, err
	}

	id := strings.ToLower(req.GetMachineId())

	fw, source, err := a.bootModes.OverrideFirmware(id, strings.ToLower(req.GetFirmware()))

	switch {
	case errors.Is(err, lifecycle.ErrBadFirmware):
		return nil, grpcstatus.Error(codes.InvalidArgument, err.Error())
	case errors.Is(err, lifecycle.ErrNotLocated):
		return nil, grpcstatus.Errorf(codes.NotFound,
			"machine %q was never seen at a site: it must boot through an edge once, or be in an edge's inventory, before its boot mode can be set",
			clipID(req.GetMachineId()))
	case err != nil:
		return nil, grpcstatus.Error(codes.Internal, err.Error())
	}

	wctx, cancel := context.WithTimeout(ctx, writeTimeout)
	defer cancel()

	if err := a.bootModes.WaitWritten(wctx, id); err != nil {
		return nil, grpcstatus.Errorf(codes.Unavailable,
			"boot mode %s set, but Omni has not stored it yet (%v): it is kept and stored when Omni answers; a restart before then loses it",
			fw, err)
	}

	return &adminpb.SetBootModeResponse{Firmware: fw, Source: source}, nil
}

// ClearAlert implements adminpb.MachinesServer.
func (a *API) ClearAlert(ctx context.Context, req *adminpb.ClearAlertRequest) (*adminpb.ClearAlertResponse, error) {
	if a.bootModes == nil {
		return nil, grpcstatus.Error(codes.Unimplemented, "this controller keeps no machine locations")
	}

	if err := a.acting(ctx, "clear the alert"); err != nil {
		return nil, err
	}

	id := strings.ToLower(req.GetMachineId())

	was, err := a.bootModes.ClearAlert(id)

	switch {
	case errors.Is(err, lifecycle.ErrNotLocated):
		return nil, grpcstatus.Errorf(codes.NotFound, "machine %q was never seen at a site", clipID(req.GetMachineId()))
	case err != nil:
		return nil, grpcstatus.Error(codes.Internal, err.Error())
	}

	wctx, cancel := context.WithTimeout(ctx, writeTimeout)
	defer cancel()

	if err := a.bootModes.WaitWritten(wctx, id); err != nil {
		return nil, grpcstatus.Errorf(codes.Unavailable, "alert cleared, but Omni has not stored it yet (%v): it is stored when Omni answers", err)
	}

	return &adminpb.ClearAlertResponse{Cleared: was}, nil
}

// acting refuses a change (what) while this controller stands by, naming the acting one.
func (a *API) acting(ctx context.Context, what string) error {
	if a.role == nil || a.role.Acting() {
		return nil
	}

	holder, uplink, err := a.role.Holder(ctx)
	if err != nil {
		holder = "unknown (" + err.Error() + ")"
	}

	return grpcstatus.Errorf(codes.FailedPrecondition, "this controller stands by: %s on the acting one, %s (uplink %s)", what, holder, uplink)
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
	rec, ok := a.machines.Get(strings.ToLower(req.GetMachineId()))
	if !ok {
		return nil, grpcstatus.Errorf(codes.NotFound, "no machine %q is known", clipID(req.GetMachineId()))
	}

	out := &adminpb.ShowMachineResponse{Machine: machineProto(rec.Machine), Dropped: rec.Dropped}
	for _, e := range rec.Entries {
		out.Timeline = append(out.Timeline, entryProto(e))
	}

	return out, nil
}

func clipID(s string) string {
	if len(s) > 64 {
		return s[:64] + "…"
	}

	return s
}

func machineProto(m timeline.Machine) *adminpb.Machine {
	out := &adminpb.Machine{
		MachineId: m.ID, SiteId: m.Site, Phase: m.Phase, Power: m.Power, BmcAddress: m.BMCAddress, BmcProtocol: m.BMCProtocol,
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
