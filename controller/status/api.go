package status

import (
	"context"
	"strings"

	"google.golang.org/grpc/codes"
	grpcstatus "google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/outpost-metal/outpost/controller/timeline"
	adminpb "github.com/outpost-metal/outpost/shared/api/admin"
)

// MaxPage is the most machines one ListMachines call returns.
const MaxPage = 5000

// API serves the Machines admin API.
type API struct {
	adminpb.UnimplementedMachinesServer

	machines Machines
}

// NewAPI returns the Machines admin API over the machines' timelines.
func NewAPI(machines Machines) *API { return &API{machines: machines} }

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

	out := &adminpb.ListMachinesResponse{Total: uint32(total), Machines: make([]*adminpb.Machine, 0, len(list))} //nolint:gosec // bounded by the book
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
		Time: timestamppb.New(e.At), Kind: e.Kind, Text: e.Text, Repeats: uint32(min(e.Repeats, 1<<30)), Error: e.Error, //nolint:gosec // bounded
	}
}
