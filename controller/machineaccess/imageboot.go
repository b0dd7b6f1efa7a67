package machineaccess

import (
	"context"
	"fmt"
	"net"
	"net/url"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	adminpb "github.com/outpost-metal/outpost/shared/api/admin"
	bmcpb "github.com/outpost-metal/outpost/shared/api/bmc"
)

// ImageBoots serves adminpb.SiteMachinesServer: an operator's first boot of a machine at a site without DHCP,
// from virtual media through its BMC. The credentials travel to the edge with the call and are kept nowhere.
type ImageBoots struct {
	adminpb.UnimplementedSiteMachinesServer

	access *Client
	record func(machineID, kind, text string, failed bool)
}

// NewImageBoots returns the service over the controller's edge connections; record notes each boot in the
// machine's timeline (nil: nowhere).
func NewImageBoots(access *Client, record func(machineID, kind, text string, failed bool)) *ImageBoots {
	if record == nil {
		record = func(string, string, string, bool) {}
	}

	return &ImageBoots{access: access, record: record}
}

// BootFromImage implements adminpb.SiteMachinesServer.
func (s *ImageBoots) BootFromImage(ctx context.Context, req *adminpb.BootFromImageRequest) (*adminpb.BootFromImageResponse, error) {
	if req.GetSiteId() == "" {
		return nil, status.Error(codes.InvalidArgument, "boot from image: a site is required")
	}

	if hw, err := net.ParseMAC(req.GetMac()); err != nil || len(hw) != 6 {
		return nil, status.Errorf(codes.InvalidArgument, "boot from image: %q is not a MAC address", req.GetMac())
	}

	u, err := url.Parse(req.GetBmcEndpoint())
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Hostname() == "" || u.User != nil {
		return nil, status.Errorf(codes.InvalidArgument, "boot from image: bmc endpoint %q is not an http(s) url of a host", req.GetBmcEndpoint())
	}

	if req.GetBmcUsername() == "" {
		return nil, status.Error(codes.InvalidArgument, "boot from image: a bmc user is required")
	}

	if !s.access.Online(req.GetSiteId()) {
		return nil, status.Errorf(codes.Unavailable, "boot from image: site %s is offline", req.GetSiteId())
	}

	b := s.access.BMC(req.GetSiteId(), "", &bmcpb.Target{
		Host: u.Hostname(), RedfishEndpoint: req.GetBmcEndpoint(), Protocol: bmcpb.Protocol_PROTOCOL_REDFISH,
		Username: req.GetBmcUsername(), Password: req.GetBmcPassword(),
	})

	img, err := b.BootFromImage(ctx, req.GetMac())
	if err != nil {
		return nil, err
	}

	// On, or cycled when it runs: the one-time CD boot takes effect either way.
	if err := b.Power(ctx, PowerCycle); err != nil {
		return nil, err
	}

	if id := img.GetSystemUuid(); id != "" {
		s.record(id, "power", fmt.Sprintf("powered on into %s mode from virtual media (static address %s) by the operator, at site %s",
			img.GetMode(), img.GetAddress(), req.GetSiteId()), false)
	}

	return &adminpb.BootFromImageResponse{Url: img.GetUrl(), SystemUuid: img.GetSystemUuid(), Mode: img.GetMode(), Address: img.GetAddress()}, nil
}
