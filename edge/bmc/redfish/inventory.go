package redfish

import (
	"context"
	"errors"
	"fmt"
	"io"
	"math"
	"net/http"
	"sync/atomic"

	"github.com/stmcginnis/gofish/schemas"
)

// Bounds of an inventory read: a BMC that answers more, or bigger, gets a clear error, not our memory.
const (
	// MaxInventoryRequests bounds the HTTP requests of one Inventory (gofish follows every collection member and
	// next-page link it is given: a hostile service could list a million drives, or page forever).
	MaxInventoryRequests = 256
	// maxInventoryBody bounds each answer read during an inventory.
	maxInventoryBody = 1 << 20
	// maxItems caps every list of an Inventory.
	maxItems = 64
)

// ErrTooMuch is returned when a service's answers exceed an inventory's bounds (requests or bytes).
var ErrTooMuch = errors.New("the redfish service answered more than an inventory reads")

// Inventory is a machine's hardware as its Redfish service reports it, unbounded strings included: the caller
// bounds and cleans them.
type Inventory struct {
	Manufacturer, Model, SerialNumber string
	CPUCount                          uint32
	CPUModel                          string
	MemoryGiB                         uint32
	DiskCount                         uint32
	DiskBytes                         []uint64
	NICSpeedsMbps                     []uint32
	BIOSVersion                       string
	BMCFirmware                       string
	Firmware                          []Firmware
	// SecureBoot is whether the firmware enforces Secure Boot from its next boot on (nil: the service has no
	// SecureBoot resource).
	SecureBoot *bool
}

// Firmware is one entry of the UpdateService's firmware inventory.
type Firmware struct{ Name, Version string }

// Inventory reads the system (vendor, model, serial, processor and memory summaries, BIOS version), its drives
// (Storage, else SimpleStorage), its Ethernet interfaces, the first manager's firmware version and the
// UpdateService's firmware inventory. Only the system is required: a part the service lacks or refuses is left
// empty. At most MaxInventoryRequests requests of at most 1 MiB each are made.
func (c *Client) Inventory(ctx context.Context) (Inventory, error) {
	c.limits.arm(MaxInventoryRequests, maxInventoryBody)
	defer c.limits.disarm()

	sys, err := c.system(ctx)
	if err != nil {
		return Inventory{}, err
	}

	inv := Inventory{
		Manufacturer: sys.Manufacturer, Model: sys.Model, SerialNumber: sys.SerialNumber,
		CPUModel: sys.ProcessorSummary.Model, BIOSVersion: sys.BiosVersion,
	}

	if n := sys.ProcessorSummary.Count; n != nil {
		inv.CPUCount = uint32(min(*n, math.MaxUint32))
	}

	if gib := sys.MemorySummary.TotalSystemMemoryGiB; gib != nil && *gib > 0 && !math.IsInf(*gib, 0) {
		inv.MemoryGiB = uint32(min(*gib, math.MaxUint32))
	}

	// The optional parts: a service without them (or refusing them) still has an inventory; running out of the
	// request budget does not.
	// (gofish does not always wrap the transport's error: the limits say themselves when they were hit)
	optional := func(err error) error {
		if tripped := c.limits.tripped(); tripped != nil {
			return tripped
		}

		if errors.Is(err, ErrTooMuch) || ctx.Err() != nil {
			return err
		}

		return nil
	}

	if err := optional(c.drives(sys, &inv)); err != nil {
		return Inventory{}, fmt.Errorf("read drives: %w", c.fail(err))
	}

	if nics, err := sys.EthernetInterfaces(); err != nil {
		if err := optional(err); err != nil {
			return Inventory{}, fmt.Errorf("read ethernet interfaces: %w", c.fail(err))
		}
	} else {
		for _, nic := range nics[:min(len(nics), maxItems)] {
			speed := uint32(0)
			if nic.SpeedMbps != nil && *nic.SpeedMbps > 0 {
				speed = uint32(min(*nic.SpeedMbps, math.MaxUint32))
			}

			inv.NICSpeedsMbps = append(inv.NICSpeedsMbps, speed)
		}
	}

	if err := optional(c.firmware(ctx, &inv)); err != nil {
		return Inventory{}, fmt.Errorf("read firmware: %w", c.fail(err))
	}

	if sb, err := sys.SecureBoot(); err != nil {
		if err := optional(err); err != nil {
			return Inventory{}, fmt.Errorf("read secure boot: %w", c.fail(err))
		}
	} else if sb != nil {
		inv.SecureBoot = new(enforcesSecureBoot(sb))
	}

	return inv, nil
}

// enforcesSecureBoot reads a SecureBoot resource for the boot a network boot would be: the next one.
// SecureBootEnable says whether Secure Boot takes effect then; a firmware in setup mode (no platform key
// enrolled) verifies nothing even when enabled.
func enforcesSecureBoot(sb *schemas.SecureBoot) bool {
	return sb.SecureBootEnable && sb.SecureBootMode != schemas.SetupModeSecureBootModeType
}

// drives fills the disk count and sizes from Storage, or SimpleStorage where the service has no Storage.
func (c *Client) drives(sys *schemas.ComputerSystem, inv *Inventory) error {
	storage, err := sys.Storage()
	if err != nil {
		return err
	}

	add := func(capacity uint64) {
		inv.DiskCount++
		if len(inv.DiskBytes) < maxItems {
			inv.DiskBytes = append(inv.DiskBytes, capacity)
		}
	}

	for _, s := range storage[:min(len(storage), maxItems)] {
		drives, err := s.Drives()
		if err != nil {
			return err
		}

		for _, d := range drives {
			var capacity uint64
			if d.CapacityBytes != nil && *d.CapacityBytes > 0 {
				capacity = uint64(*d.CapacityBytes)
			}

			add(capacity)
		}
	}

	if len(storage) > 0 {
		return nil
	}

	simple, err := sys.SimpleStorage()
	if err != nil {
		return err
	}

	for _, s := range simple[:min(len(simple), maxItems)] {
		for _, d := range s.Devices {
			var capacity uint64
			if d.CapacityBytes != nil {
				capacity = uint64(*d.CapacityBytes)
			}

			add(capacity)
		}
	}

	return nil
}

// firmware fills the BMC's firmware version (the first manager's) and the UpdateService's firmware inventory.
func (c *Client) firmware(ctx context.Context, inv *Inventory) error {
	svc := c.api.WithContext(ctx).Service

	managers, err := svc.Managers()
	if err != nil {
		return err
	}

	if len(managers) > 0 {
		inv.BMCFirmware = managers[0].FirmwareVersion
	}

	us, err := svc.UpdateService()
	if err != nil || us == nil {
		return err
	}

	items, err := us.FirmwareInventory()
	if err != nil {
		return err
	}

	for _, it := range items[:min(len(items), maxItems)] {
		inv.Firmware = append(inv.Firmware, Firmware{Name: it.Name, Version: it.Version})
	}

	return nil
}

// limits bounds the requests and answer sizes of a client while armed (an inventory); power and boot calls are
// bounded by their timeouts alone. It sits under htmlGuard.
type limits struct {
	next http.RoundTripper

	armed    atomic.Bool
	left     atomic.Int64
	maxBytes atomic.Int64
	hit      atomic.Pointer[error] // the first bound hit since armed
}

func (l *limits) arm(requests int, maxBytes int64) {
	l.left.Store(int64(requests))
	l.maxBytes.Store(maxBytes)
	l.hit.Store(nil)
	l.armed.Store(true)
}

// tripped is the first bound hit since the limits were armed (nil: none).
func (l *limits) tripped() error {
	if err := l.hit.Load(); err != nil {
		return *err
	}

	return nil
}

func (l *limits) trip(err error) error {
	l.hit.CompareAndSwap(nil, &err)

	return err
}

func (l *limits) disarm() { l.armed.Store(false) }

// RoundTrip implements http.RoundTripper.
func (l *limits) RoundTrip(req *http.Request) (*http.Response, error) {
	if !l.armed.Load() {
		return l.next.RoundTrip(req)
	}

	if l.left.Add(-1) < 0 {
		return nil, l.trip(fmt.Errorf("%w: more than %d requests", ErrTooMuch, MaxInventoryRequests))
	}

	resp, err := l.next.RoundTrip(req)
	if err != nil {
		return resp, err
	}

	resp.Body = &cappedBody{ReadCloser: resp.Body, left: l.maxBytes.Load(), limits: l}

	return resp, nil
}

// cappedBody fails a read past its bound.
type cappedBody struct {
	io.ReadCloser

	left   int64
	limits *limits
}

func (b *cappedBody) Read(p []byte) (int, error) {
	if b.left < 0 {
		return 0, b.limits.trip(fmt.Errorf("%w: an answer of more than %d bytes", ErrTooMuch, maxInventoryBody))
	}

	if int64(len(p)) > b.left {
		p = p[:b.left+1] // one byte more tells a body that ends exactly at the bound from a longer one
	}

	n, err := b.ReadCloser.Read(p)
	b.left -= int64(n)

	if b.left < 0 {
		return n, b.limits.trip(fmt.Errorf("%w: an answer of more than %d bytes", ErrTooMuch, maxInventoryBody))
	}

	return n, err
}
