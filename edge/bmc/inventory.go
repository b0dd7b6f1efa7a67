package bmc

import (
	"cmp"
	"context"
	"fmt"
	"slices"
	"strings"
	"unicode"

	"github.com/outpost-metal/outpost/edge/bmc/ipmi"
	"github.com/outpost-metal/outpost/edge/bmc/redfish"
	bmcpb "github.com/outpost-metal/outpost/shared/api/bmc"
)

// Bounds of an Inventory: whatever a BMC answers, what leaves the edge is at most this.
const (
	// MaxInventoryString is the most characters of any inventory string (longer ones are cut).
	MaxInventoryString = 128
	// MaxInventoryItems is the most entries of any inventory list.
	MaxInventoryItems = 64
)

// Inventory is a machine's hardware as its BMC reports it: Redfish gives all of it, IPMI what its FRU data has
// (vendor, model, serial). Strings are printable and at most MaxInventoryString characters; lists hold at most
// MaxInventoryItems entries (DiskCount counts all drives).
type Inventory struct {
	// Protocol is what it was read over.
	Protocol     Protocol
	Manufacturer string
	Model        string
	SerialNumber string
	CPUCount     uint32
	CPUModel     string
	// MemoryGiB is the total system memory in GiB.
	MemoryGiB     uint32
	DiskCount     uint32
	DiskBytes     []uint64
	NICSpeedsMbps []uint32
	BIOSVersion   string
	BMCFirmware   string
	Firmware      []FirmwareVersion
	// SecureBoot is whether the machine's firmware enforces Secure Boot from its next boot on (nil: the BMC
	// does not say; IPMI never does).
	SecureBoot *bool
}

// FirmwareVersion is one entry of a firmware inventory.
type FirmwareVersion struct{ Name, Version string }

// Inventory reads the hardware inventory of the machine behind t (see Inventory).
func (m *Manager) Inventory(ctx context.Context, t Target, c Credentials) (inv Inventory, err error) {
	err = m.do(ctx, "read inventory", t, c, func(pc PowerClient, ctx context.Context) error {
		switch client := pc.(type) {
		case *redfish.Client:
			rf, err := client.Inventory(ctx)
			if err != nil {
				return err
			}

			inv = fromRedfish(rf)
		case *ipmi.Client:
			fru, err := client.FRU(ctx)
			if err != nil {
				return err
			}

			inv = fromFRU(fru)
		default:
			return fmt.Errorf("%w: this bmc session cannot read an inventory", ErrInvalidTarget)
		}

		return nil
	})

	return inv, err
}

func fromRedfish(rf redfish.Inventory) Inventory {
	inv := Inventory{
		Protocol: ProtocolRedfish, Manufacturer: clean(rf.Manufacturer), Model: clean(rf.Model), SerialNumber: clean(rf.SerialNumber),
		CPUCount: rf.CPUCount, CPUModel: clean(rf.CPUModel), MemoryGiB: rf.MemoryGiB, DiskCount: rf.DiskCount,
		DiskBytes: capped(rf.DiskBytes), NICSpeedsMbps: capped(rf.NICSpeedsMbps),
		BIOSVersion: clean(rf.BIOSVersion), BMCFirmware: clean(rf.BMCFirmware), SecureBoot: rf.SecureBoot,
	}

	for _, f := range capped(rf.Firmware) {
		inv.Firmware = append(inv.Firmware, FirmwareVersion{Name: clean(f.Name), Version: clean(f.Version)})
	}

	// gofish reads collection members side by side: put them in an order of their own (largest first, by name)
	slices.SortFunc(inv.DiskBytes, func(a, b uint64) int { return cmp.Compare(b, a) })
	slices.SortFunc(inv.NICSpeedsMbps, func(a, b uint32) int { return cmp.Compare(b, a) })
	slices.SortFunc(inv.Firmware, func(a, b FirmwareVersion) int {
		return cmp.Or(cmp.Compare(a.Name, b.Name), cmp.Compare(a.Version, b.Version))
	})

	return inv
}

// fromFRU takes the product area first (it names what was sold), the board area where the product has nothing.
func fromFRU(fru ipmi.FRU) Inventory {
	return Inventory{
		Protocol:     ProtocolIPMI,
		Manufacturer: clean(first(fru.ProductManufacturer, fru.BoardManufacturer)),
		Model:        clean(first(fru.ProductName, fru.ProductPartNumber, fru.BoardProduct)),
		SerialNumber: clean(first(fru.ProductSerial, fru.BoardSerial)),
	}
}

func first(vals ...string) string {
	for _, v := range vals {
		if strings.TrimSpace(v) != "" {
			return v
		}
	}

	return ""
}

func capped[T any](s []T) []T {
	if len(s) > MaxInventoryItems {
		return s[:MaxInventoryItems]
	}

	return s
}

// clean makes a BMC's string printable, single-spaced and at most MaxInventoryString characters: control and
// other unprintable characters become spaces, invalid UTF-8 is dropped.
func clean(s string) string {
	if len(s) > 4*MaxInventoryString {
		s = s[:4*MaxInventoryString] // never look at more than needed
	}

	s = strings.Map(func(r rune) rune {
		if r == unicode.ReplacementChar || !unicode.IsPrint(r) {
			return ' '
		}

		return r
	}, strings.ToValidUTF8(s, ""))

	s = strings.Join(strings.Fields(s), " ")

	if r := []rune(s); len(r) > MaxInventoryString {
		s = strings.TrimSpace(string(r[:MaxInventoryString]))
	}

	return s
}

// Inventory implements bmcpb.BMCServer.
func (s *Service) Inventory(ctx context.Context, req *bmcpb.PowerRequest) (*bmcpb.InventoryResponse, error) {
	t, c := fromProto(req.GetTarget())

	inv, err := s.m.Inventory(ctx, t, c)
	if err != nil {
		return nil, s.statusError(req.GetTarget(), err)
	}

	resp := &bmcpb.InventoryResponse{
		Protocol: bmcpb.Protocol_PROTOCOL_IPMI, Manufacturer: inv.Manufacturer, Model: inv.Model, SerialNumber: inv.SerialNumber,
		CpuCount: inv.CPUCount, CpuModel: inv.CPUModel, MemoryGib: inv.MemoryGiB, DiskCount: inv.DiskCount, DiskBytes: inv.DiskBytes,
		NicSpeedsMbps: inv.NICSpeedsMbps, BiosVersion: inv.BIOSVersion, BmcFirmware: inv.BMCFirmware, SecureBoot: inv.SecureBoot,
	}

	if inv.Protocol == ProtocolRedfish {
		resp.Protocol = bmcpb.Protocol_PROTOCOL_REDFISH
	}

	for _, f := range inv.Firmware {
		resp.Firmware = append(resp.Firmware, &bmcpb.FirmwareVersion{Name: f.Name, Version: f.Version})
	}

	return resp, nil
}
