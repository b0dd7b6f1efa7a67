package bmc

import (
	"context"
	"fmt"
	"net"
	"net/netip"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/outpost-metal/outpost/edge/bmc/redfish"
	bmcpb "github.com/outpost-metal/outpost/shared/api/bmc"
	"github.com/outpost-metal/outpost/shared/metal"
)

// ErrNoVirtualMedia means the BMC is driven over a protocol without virtual media (IPMI): a machine booted from
// an image needs a Redfish BMC. It is permanent (it wraps ErrInvalidTarget).
var ErrNoVirtualMedia = fmt.Errorf("%w: virtual media needs a redfish bmc", ErrInvalidTarget)

// BootFromMedia mounts the CD image at image in the BMC's virtual CD and sets a one-time UEFI boot from it
// (Redfish only). It returns the system UUID the BMC reports.
func (m *Manager) BootFromMedia(ctx context.Context, t Target, c Credentials, image string) (uuid string, err error) {
	err = m.do(ctx, "boot from virtual media", t, c, func(pc PowerClient, ctx context.Context) error {
		client, ok := pc.(*redfish.Client)
		if !ok {
			return fmt.Errorf("%w: %s is driven over ipmi", ErrNoVirtualMedia, t)
		}

		uuid, err = client.BootFromMedia(ctx, image)

		return err
	})

	return uuid, err
}

// EjectMedia empties the BMC's virtual CD (Redfish only; an empty CD is no error).
func (m *Manager) EjectMedia(ctx context.Context, t Target, c Credentials) error {
	return m.do(ctx, "eject virtual media", t, c, func(pc PowerClient, ctx context.Context) error {
		client, ok := pc.(*redfish.Client)
		if !ok {
			return fmt.Errorf("%w: %s is driven over ipmi", ErrNoVirtualMedia, t)
		}

		return client.EjectMedia(ctx)
	})
}

// BootImage is a built virtual-media image (edge/vmedia).
type BootImage struct {
	// URL is where the BMC fetches it.
	URL string
	// Mode is what it boots: agent or install.
	Mode string
	// MAC and Address are the interface and the static address it brings up.
	MAC     net.HardwareAddr
	Address netip.Prefix
}

// Images builds the images machines at a site without DHCP boot from (edge/vmedia.Store).
type Images interface {
	// Image builds the image of machine uuid (empty: a machine never booted, found by mac) with the address
	// reserved for mac (nil: the MAC it booted an image with before).
	Image(ctx context.Context, uuid string, mac net.HardwareAddr) (BootImage, error)
	// Remember records that machine uuid booted img (the MAC it boots images with, the address it comes up at).
	Remember(uuid string, img BootImage) error
}

// WithImages lets the service boot machines from virtual media (BootFromImage).
func (s *Service) WithImages(i Images) *Service {
	s.images = i

	return s
}

// BootFromImage implements bmcpb.BMCServer.
func (s *Service) BootFromImage(ctx context.Context, req *bmcpb.BootFromImageRequest) (*bmcpb.BootFromImageResponse, error) {
	if s.images == nil {
		return nil, status.Error(codes.Unimplemented, "boot from image: this edge builds no virtual-media images")
	}

	var mac net.HardwareAddr

	if v := req.GetMac(); v != "" {
		hw, err := net.ParseMAC(v)
		if err != nil || len(hw) != 6 {
			return nil, status.Errorf(codes.InvalidArgument, "boot from image: %q is not a MAC address", v)
		}

		mac = hw
	}

	id := metal.NormalizeID(req.GetTarget().GetMachineId())

	img, err := s.images.Image(ctx, id, mac)
	if err != nil {
		return nil, status.Errorf(codes.FailedPrecondition, "boot from image: %v", err)
	}

	t, c := fromProto(req.GetTarget())

	uuid, err := s.m.BootFromMedia(ctx, t, c, img.URL)
	if err != nil {
		return nil, s.statusError(req.GetTarget(), err)
	}

	uuid = metal.NormalizeID(uuid)

	if id != "" && uuid != "" && uuid != id {
		s.m.EjectMedia(ctx, t, c) //nolint:errcheck // the refusal below is the news

		return nil, status.Errorf(codes.FailedPrecondition, "boot from image: the bmc at %s reports system %s, not machine %s", t, uuid, id)
	}

	if uuid != "" {
		if err := s.images.Remember(uuid, img); err != nil {
			return nil, status.Errorf(codes.Internal, "boot from image: %v", err)
		}
	}

	return &bmcpb.BootFromImageResponse{
		Url: img.URL, SystemUuid: uuid, Mode: img.Mode, Mac: img.MAC.String(), Address: img.Address.String(),
	}, nil
}

// EjectImage implements bmcpb.BMCServer.
func (s *Service) EjectImage(ctx context.Context, req *bmcpb.PowerRequest) (*bmcpb.PowerResponse, error) {
	return s.power(ctx, req, (*Manager).EjectMedia)
}
