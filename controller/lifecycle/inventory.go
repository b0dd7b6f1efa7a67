package lifecycle

import (
	"context"
	"errors"
	"fmt"
	"net"
	"strconv"
	"strings"
	"time"

	"github.com/cosi-project/runtime/pkg/controller"
	"go.uber.org/zap"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/outpost-metal/outpost/controller/labels"
	"github.com/outpost-metal/outpost/controller/machines"
	"github.com/outpost-metal/outpost/controller/resources"
	"github.com/outpost-metal/outpost/controller/resources/specs"
	bmcpb "github.com/outpost-metal/outpost/shared/api/bmc"
	bootpb "github.com/outpost-metal/outpost/shared/api/boot"
	"github.com/outpost-metal/outpost/shared/metal"
)

// InventoryClient reads a machine's hardware inventory from its BMC through its site's edge.
type InventoryClient interface {
	Inventory(ctx context.Context, siteID, machineID string, bmc *specs.BMCConfigurationSpec) (*bmcpb.InventoryResponse, error)
}

// SecureBootReports takes what machines' BMCs say of their firmware's Secure Boot, for their boot plans
// (machines.Locations).
type SecureBootReports interface {
	SetSecureBoot(machineID metal.ID, s bootpb.SecureBoot)
}

// defaultInventoryInterval is how long an inventory is kept when Config.InventoryInterval is 0.
const defaultInventoryInterval = 24 * time.Hour

// maxInventoryError bounds the error kept in a MachineInventory.
const maxInventoryError = 256

// machineInventory keeps MachineInventory: the machine's hardware as its BMC reports it, which the
// InfraMachineStatus publishes as labels. It reads the inventory when the machine's BMC configuration first
// appears or names another BMC or user, and again once it is InventoryInterval old (a day): hardware changes
// rarely, and a BMC's inventory costs it dozens of Redfish requests, so never on every poll. A failed read is
// recorded (the labels of an earlier read stay) and tried again after a twenty-fourth of the interval (an hour);
// while the site is offline nothing is asked.
type machineInventory struct {
	noTeardown

	types     resources.Types
	written   *written
	sites     SiteLocator
	inventory InventoryClient
	// secureBoot takes the Secure Boot state each read found (nil: nobody wants it).
	secureBoot SecureBootReports
	now        func() time.Time
	// interval is how long an inventory is kept; callTimeout bounds the read; pollInterval is the wait for a
	// machine not located or a site offline.
	interval, callTimeout, pollInterval time.Duration
}

func newMachineInventoryController(e *env, d Deps) *machineController {
	s := &machineInventory{
		types: d.Types, written: e.written, sites: d.Sites, inventory: d.Inventory, secureBoot: d.SecureBoot, now: d.Now,
		interval: defaultInventoryInterval, callTimeout: e.cfg.CallTimeout, pollInterval: e.cfg.PollInterval,
	}
	if e.cfg.InventoryInterval > 0 {
		s.interval = e.cfg.InventoryInterval
	}

	return callsEdge(newMachineController(e, "lifecycle.MachineInventoryController", d.Types.MachineInventory, d.Types.Namespace,
		bmcRecord|inventoryRecord, s))
}

// bmcKey names the BMC and user an inventory was read from.
func bmcKey(bmc *specs.BMCConfigurationSpec) string {
	ipmi := bmc.GetIpmi()

	return ipmi.GetUsername() + "@" + net.JoinHostPort(ipmi.GetAddress(), strconv.FormatUint(uint64(ipmi.GetPort()), 10))
}

func (s *machineInventory) reconcile(ctx context.Context, logger *zap.Logger, r controller.QRuntime, v *view) error {
	if !v.managed() || v.bmc.GetIpmi() == nil {
		return nil // a BMC configuration appearing wakes the step
	}

	loc, ok := s.sites.Locate(v.id)
	if !ok {
		return waitFor(logger, "machine not located", s.pollInterval)
	}

	key := bmcKey(v.bmc)
	now := s.now()

	if v.inv != nil && v.inv.GetBmc() == key && v.inv.GetReadAt() != nil {
		s.reportSecureBoot(v.id, v.inv) // the record's answer, once more (the locations may have been restarted)

		wait := s.interval
		if v.inv.GetError() != "" {
			wait /= 24
		}

		if left := v.inv.GetReadAt().AsTime().Add(wait).Sub(now); left > 0 {
			return controller.NewRequeueInterval(left)
		}
	}

	callCtx, cancel := context.WithTimeout(ctx, s.callTimeout)
	resp, err := s.inventory.Inventory(callCtx, loc.SiteID, v.id, v.bmc)

	cancel()

	var rec *specs.MachineInventorySpec

	switch {
	case errors.Is(err, machines.ErrSiteOffline) || ctx.Err() != nil:
		return waitFor(logger, "site offline", s.pollInterval)
	case err != nil:
		logger.Info("hardware inventory not read", zap.String("site", loc.SiteID), zap.Error(err))

		// the facts of an earlier read stay published; the error says why they are not fresher
		rec = &specs.MachineInventorySpec{}
		if v.inv != nil && v.inv.GetBmc() == key {
			rec = fromInventory(v.inv)
		}

		msg := err.Error()
		if len(msg) > maxInventoryError {
			msg = strings.ToValidUTF8(msg[:maxInventoryError], "")
		}

		rec.Error = msg
	default:
		rec = inventoryRecordOf(resp)
	}

	rec.Bmc, rec.ReadAt = key, timestamppb.New(now)

	if err := writeOwn(ctx, s.written, r, s.types.NewMachineInventory(v.id), v.inv, rec, func(o *resources.MachineInventory) {
		o.TypedSpec().Value = rec
	}); err != nil {
		return fmt.Errorf("write machine inventory: %w", err)
	}

	s.reportSecureBoot(v.id, rec)

	if rec.GetError() != "" {
		return controller.NewRequeueInterval(s.interval / 24)
	}

	return controller.NewRequeueInterval(s.interval)
}

// reportSecureBoot hands what the machine's BMC said of Secure Boot to the machine's plans.
func (s *machineInventory) reportSecureBoot(id string, inv *specs.MachineInventorySpec) {
	if s.secureBoot == nil {
		return
	}

	sb := bootpb.SecureBoot_SECURE_BOOT_UNSPECIFIED

	switch {
	case inv.SecureBoot == nil:
	case inv.GetSecureBoot():
		sb = bootpb.SecureBoot_SECURE_BOOT_ON
	default:
		sb = bootpb.SecureBoot_SECURE_BOOT_OFF
	}

	s.secureBoot.SetSecureBoot(metal.ID(id), sb) // v.id is the normalized ID
}

// fromInventory copies the facts of a record (not its error).
func fromInventory(inv *specs.MachineInventorySpec) *specs.MachineInventorySpec {
	return &specs.MachineInventorySpec{
		Protocol: inv.GetProtocol(), Manufacturer: inv.GetManufacturer(), Model: inv.GetModel(), SerialNumber: inv.GetSerialNumber(),
		CpuCount: inv.GetCpuCount(), CpuModel: inv.GetCpuModel(), MemoryGib: inv.GetMemoryGib(), DiskCount: inv.GetDiskCount(),
		DiskBytes: inv.GetDiskBytes(), NicSpeedsMbps: inv.GetNicSpeedsMbps(), BiosVersion: inv.GetBiosVersion(),
		BmcFirmware: inv.GetBmcFirmware(), SecureBoot: inv.SecureBoot,
	}
}

// inventoryRecordOf is what the edge answered, as the record keeps it (the edge bounds every field).
func inventoryRecordOf(resp *bmcpb.InventoryResponse) *specs.MachineInventorySpec {
	proto := "ipmi"
	if resp.GetProtocol() == bmcpb.Protocol_PROTOCOL_REDFISH {
		proto = "redfish"
	}

	return &specs.MachineInventorySpec{
		Protocol: proto, Manufacturer: resp.GetManufacturer(), Model: resp.GetModel(), SerialNumber: resp.GetSerialNumber(),
		CpuCount: resp.GetCpuCount(), CpuModel: resp.GetCpuModel(), MemoryGib: resp.GetMemoryGib(), DiskCount: resp.GetDiskCount(),
		DiskBytes: resp.GetDiskBytes(), NicSpeedsMbps: resp.GetNicSpeedsMbps(), BiosVersion: resp.GetBiosVersion(),
		BmcFirmware: resp.GetBmcFirmware(), SecureBoot: resp.SecureBoot,
	}
}

// inventoryLabels are the labels of a machine's inventory record (none without one).
func inventoryLabels(inv *specs.MachineInventorySpec) map[string]string {
	if inv == nil || inv.GetProtocol() == "" {
		return nil
	}

	return labels.Inventory(labels.Hardware{
		Source: inv.GetProtocol(), Vendor: inv.GetManufacturer(), Model: inv.GetModel(), Serial: inv.GetSerialNumber(),
		CPUCount: inv.GetCpuCount(), CPUModel: inv.GetCpuModel(), MemoryGiB: inv.GetMemoryGib(), DiskCount: inv.GetDiskCount(),
		DiskBytes: inv.GetDiskBytes(), NICSpeedsMbps: inv.GetNicSpeedsMbps(), BIOSVersion: inv.GetBiosVersion(),
		BMCFirmware: inv.GetBmcFirmware(), SecureBoot: inv.SecureBoot,
	})
}
