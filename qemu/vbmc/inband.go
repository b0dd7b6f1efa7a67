package vbmc

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"

	"github.com/bougou/go-ipmi/pkg/hal"
	"github.com/bougou/go-ipmi/pkg/handlers"
	"github.com/bougou/go-ipmi/pkg/types"
	"github.com/bougou/go-ipmi/pkg/vmproto"
)

// SetLANAddress sets the address and RMCP port the BMC reports for its LAN channel (Get LAN Configuration
// Parameters #3 and #8, IPMI v2.0 table 23-4): what a host reads in-band to tell its provider where the BMC
// answers (the metal agent's GetPowerManagement).
func (i *IPMI) SetLANAddress(ctx context.Context, addr netip.Addr, port uint16) error {
	if !addr.Is4() {
		return fmt.Errorf("bmc lan address %s: not IPv4", addr)
	}

	network := i.bmc.HAL().Network()
	if network == nil {
		return errors.New("bmc has no network configuration")
	}

	cfg, err := network.GetConfig(ctx)
	if err != nil {
		return fmt.Errorf("read bmc lan configuration: %w", err)
	}

	cfg.IP, cfg.Port = addr.As4(), port
	cfg.Mask = [4]byte{255, 255, 255, 0}

	if err := network.SetConfig(ctx, &hal.IPConfig{IP: cfg.IP, Mask: cfg.Mask, Gateway: cfg.Gateway, MAC: cfg.MAC, Port: cfg.Port}); err != nil {
		return fmt.Errorf("set bmc lan configuration: %w", err)
	}

	return nil
}

// ServeInBand serves the BMC's in-band system interface on ln: QEMU's external-BMC ("VM") protocol, which
// QEMU's ipmi-bmc-extern speaks over its chardev for a guest's KCS interface (isa-ipmi-kcs), so the guest's
// /dev/ipmi0 reaches the same BMC as the LAN front end: a user created in-band is the one LAN sessions
// authenticate. One QEMU connection is served at a time (each power-on is a new QEMU process that connects
// again). It returns nil when ctx ends or ln is closed.
func (i *IPMI) ServeInBand(ctx context.Context, ln net.Listener) error {
	reg := handlers.NewRegistry()
	reg.Use(i.refuseInBandUsers) // before the handlers: middleware wraps what is registered after it
	handlers.RegisterAllHandlers(reg)

	if err := vmproto.NewVMServer(i.bmc, vmproto.WithVMHandlerRegistry(reg)).Serve(ctx, ln); err != nil {
		return fmt.Errorf("serve in-band ipmi: %w", err)
	}

	return nil
}

// RefuseInBandUsers makes the BMC refuse the next n in-band password sets (Set User Password with the "set
// password" operation, IPMI v2.0 section 22.30) with "insufficient privilege", as a BMC whose in-band user
// management is locked down does: the host cannot create its user.
func (i *IPMI) RefuseInBandUsers(n int) { i.refuse.Store(int64(n)) }

// InBandUsersRefused returns how many in-band password sets the BMC refused.
func (i *IPMI) InBandUsersRefused() int64 { return i.refused.Load() }

// setPasswordOp is the Set User Password operation that sets a password (request byte 2, bits 1:0).
const setPasswordOp = 0x02

func (i *IPMI) refuseInBandUsers(next handlers.Handler) handlers.Handler {
	return handlers.HandlerFunc(func(ctx context.Context, hctx *handlers.HandlerContext, data []byte) ([]byte, types.CompletionCode, error) {
		isSet := hctx != nil && hctx.Command.NetFn == types.CommandSetUserPassword.NetFn &&
			hctx.Command.ID == types.CommandSetUserPassword.ID && len(data) >= 2 && data[1]&0x03 == setPasswordOp

		if isSet && i.refuse.Add(-1) >= 0 {
			i.refused.Add(1)

			return nil, types.CodeInsufficientPrivilege, nil
		}

		return next.Handle(ctx, hctx, data)
	})
}

// LANUser reports whether the BMC holds an enabled user of that name allowed on its LAN channel (1): one a
// LAN session can authenticate as, however it was created.
func (i *IPMI) LANUser(name string) bool {
	_, err := i.bmc.Users.FindEnabledByNameOnChannel(name, lanChannel)

	return err == nil
}

// lanChannel is the BMC's LAN channel number (go-ipmi's default channel store).
const lanChannel = 1
