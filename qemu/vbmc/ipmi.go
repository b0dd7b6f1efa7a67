package vbmc

import (
	"context"
	"errors"
	"fmt"
	"net"
	"sync/atomic"
	"time"

	"github.com/bougou/go-ipmi/pkg/bmc"
	"github.com/bougou/go-ipmi/pkg/clock"
	"github.com/bougou/go-ipmi/pkg/hal"
	"github.com/bougou/go-ipmi/pkg/hal/mock"
	"github.com/bougou/go-ipmi/pkg/server"
	"github.com/bougou/go-ipmi/pkg/transport/udp"
	"github.com/bougou/go-ipmi/pkg/types"

	"github.com/outpost-metal/outpost/shared/metal"
)

// IPMI is the IPMI v2 (lanplus) front end of a Chassis.
type IPMI struct {
	bmc     *bmc.BMC
	hal     *ipmiHAL
	actions *atomic.Int64

	// refuse is how many more in-band password sets to refuse; refused counts those refused.
	refuse, refused atomic.Int64
}

// Actions returns how many chassis controls (power on, off, cycle, reset) and boot flag sets this front end
// did: what shows that a lifecycle ran over IPMI.
func (i *IPMI) Actions() int64 { return i.actions.Load() }

// NewIPMI returns an IPMI BMC for ch with one administrator (user ID 2). cipherSuites limits the
// RMCP+ cipher suites it accepts (none: the library's defaults); each must be one go-ipmi implements.
func NewIPMI(ch *Chassis, user, password string, cipherSuites ...uint8) (*IPMI, error) {
	actions := &atomic.Int64{}
	h := &ipmiHAL{HAL: mock.New(), chassis: ipmiChassis{ch: ch, actions: actions}}

	opts := []bmc.Option{bmc.WithClock(clock.Real)}

	if len(cipherSuites) > 0 {
		ids := make([]types.CipherSuiteID, 0, len(cipherSuites))

		for _, id := range cipherSuites {
			if !bmc.SupportedCipherSuite(types.CipherSuiteID(id)) {
				return nil, fmt.Errorf("cipher suite %d is not implemented by go-ipmi", id)
			}

			ids = append(ids, types.CipherSuiteID(id))
		}

		opts = append(opts, bmc.WithCipherSuites(ids))
	}

	b := bmc.New(bmc.DeviceInfo{IPMIVersion: 0x20}, [16]byte{0x0b, 0x3c}, h, opts...)

	admin, err := b.Users.Add(2, user)
	if err != nil {
		return nil, fmt.Errorf("add ipmi user: %w", err)
	}

	admin.SetPassword([]byte(password))
	admin.Enabled = true
	admin.ChannelAccess[1] = bmc.UserChannelAccess{MaxPrivilege: bmc.PrivilegeLevelAdministrator, Enabled: true}

	if err := b.Users.Update(2, func(u *bmc.User) error { *u = *admin; return nil }); err != nil {
		return nil, fmt.Errorf("store ipmi user: %w", err)
	}

	return &IPMI{bmc: b, hal: h, actions: actions}, nil
}

// Serve answers RMCP/RMCP+ on conn until ctx ends; it closes conn.
func (i *IPMI) Serve(ctx context.Context, conn *net.UDPConn) error {
	srv := server.NewServer(i.bmc, udp.Wrap(conn, udp.WithReadTimeout(200*time.Millisecond)))

	err := srv.Serve(ctx)

	srv.Close() //nolint:errcheck

	if ctx.Err() != nil || errors.Is(err, net.ErrClosed) {
		return nil
	}

	if err != nil {
		return fmt.Errorf("serve ipmi: %w", err)
	}

	return nil
}

type ipmiHAL struct {
	*mock.HAL

	chassis ipmiChassis
	console consoleSlot // sol.go
}

func (h *ipmiHAL) Chassis() hal.ChassisHAL { return h.chassis }

// ipmiChassis maps IPMI chassis commands onto a Chassis.
type ipmiChassis struct {
	*mock.Chassis

	ch      *Chassis
	actions *atomic.Int64
}

func (c ipmiChassis) PowerState(context.Context) (bool, error) { return c.ch.PowerState(), nil }

func (c ipmiChassis) SetPower(ctx context.Context, on bool) error {
	c.actions.Add(1)

	return c.ch.SetPower(ctx, on)
}

func (c ipmiChassis) PowerCycle(ctx context.Context) error { return c.reset(ctx) }

func (c ipmiChassis) ColdReset(ctx context.Context) error { return c.reset(ctx) }

func (c ipmiChassis) WarmReset(ctx context.Context) error { return c.reset(ctx) }

func (c ipmiChassis) reset(ctx context.Context) error {
	c.actions.Add(1)

	return c.ch.Reset(ctx)
}

func (c ipmiChassis) Identify(context.Context, uint8) error { return nil }

func (c ipmiChassis) IntrusionState(context.Context) (bool, error) { return false, nil }

func (c ipmiChassis) SetBootFlags(_ context.Context, f *types.BootOptionParam_BootFlags) error {
	if f == nil {
		return hal.ErrNotSupported
	}

	o := Override{Mode: metal.BIOS, Persistent: f.Persist}
	if f.BIOSBootType == types.BIOSBootTypeEFI {
		o.Mode = metal.UEFI
	}

	if f.BootFlagsValid {
		switch f.BootDeviceSelector {
		case types.BootDeviceSelectorForcePXE:
			o.Device = BootPXE
		case types.BootDeviceSelectorForceHardDrive:
			o.Device = BootDisk
		}
	}

	c.ch.SetOverride(o)
	c.actions.Add(1)

	return nil
}

func (c ipmiChassis) GetBootFlags(context.Context) (*types.BootOptionParam_BootFlags, error) {
	o := c.ch.Override()

	f := &types.BootOptionParam_BootFlags{
		BootFlagsValid: o.Device != BootNone,
		Persist:        o.Persistent,
		BIOSBootType:   types.BIOSBootType(o.Mode == metal.UEFI),
	}

	switch o.Device {
	case BootPXE:
		f.BootDeviceSelector = types.BootDeviceSelectorForcePXE
	case BootDisk:
		f.BootDeviceSelector = types.BootDeviceSelectorForceHardDrive
	case BootNone:
		f.BootDeviceSelector = types.BootDeviceSelectorNoOverride
	}

	return f, nil
}

func (c ipmiChassis) SetBootInfoAcknowledge(context.Context, *types.BootOptionParam_BootInfoAcknowledge) error {
	return nil
}

func (c ipmiChassis) GetBootInfoAcknowledge(context.Context) (*types.BootOptionParam_BootInfoAcknowledge, error) {
	return &types.BootOptionParam_BootInfoAcknowledge{}, nil
}
