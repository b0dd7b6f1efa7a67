package sites

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"math"
	"net"
	"net/netip"
	"slices"
	"time"

	"github.com/cosi-project/runtime/pkg/state"
	"go.uber.org/zap"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/outpost-metal/outpost/controller/resources"
	adminpb "github.com/outpost-metal/outpost/shared/api/admin"
	bootpb "github.com/outpost-metal/outpost/shared/api/boot"
)

// MaxRegisteredMACs bounds the machines an operator may register at one site (the edge refuses more).
const MaxRegisteredMACs = 65536

// Settings are a site's own settings (controller site set, controller site machine add): the values are
// checked by the consumers' rules (SettingsCheck), not here; an empty value means the controller's default.
type Settings struct {
	// Discovery is which PXE clients the site's ProxyDHCP answers: all, known or off.
	Discovery string
	// BMCProtocol is how the site's edge reaches BMCs: auto, ipmi or redfish.
	BMCProtocol string
	// WipeMethod is how the site's machines are wiped: fast or zeroes.
	WipeMethod string
	// SecureBoot is whether the site's machines enforce Secure Boot: on or off ("": each machine's BMC says).
	SecureBoot string
	// ExtraConfig is Talos machine-config documents served with the join config at this site.
	ExtraConfig []byte
	// RegisteredMACs are machines registered before they boot, lower case and colon separated, sorted.
	RegisteredMACs []string
	// Labels are published on the site's machines (controller site label; not changed by SetSettings).
	Labels map[string]string
	// AssetPolicy is the site's boot-asset policy, an outpost.assets.Policy value, 0 for the controller's
	// default (controller site policy; not changed by SetSettings).
	AssetPolicy int32
	// Staged are the install profiles staged at the site ("<version>/<schematic>/<arch>"; controller assets
	// stage; not changed by SetSettings).
	Staged []string
	// DHCP is the site's DHCP service (controller site set --dhcp..., reservations by controller site machine
	// add --ip).
	DHCP DHCP
}

// DHCP is a site's DHCP service as stored: checked as a whole by bootpb.DHCP.Check on its Table form.
type DHCP struct {
	// Mode is proxy, full or off ("" the edge's own, proxy).
	Mode string
	// Subnet is the served network (CIDR); PoolStart and PoolEnd bound the pool (inclusive).
	Subnet, PoolStart, PoolEnd string
	// Gateway is the clients' default router ("" none).
	Gateway string
	// DNS and NTP are the servers given to clients.
	DNS, NTP []string
	// LeaseTime is the lease time (0: the edge's default).
	LeaseTime time.Duration
	// Reservations are addresses by MAC (lower case, colon separated).
	Reservations map[string]string
}

// Table is the DHCP service as the site's boot table carries it (nil when nothing is set: the edge's own).
func (d DHCP) Table() *bootpb.DHCP {
	mode, err := bootpb.ParseDHCPMode(d.Mode)
	if err != nil {
		mode = bootpb.DHCPMode(-1) // refused by Check, naming it
	}

	out := &bootpb.DHCP{
		Mode: mode, Subnet: d.Subnet, PoolStart: d.PoolStart, PoolEnd: d.PoolEnd, Gateway: d.Gateway,
		Dns: slices.Clone(d.DNS), Ntp: slices.Clone(d.NTP), LeaseSeconds: uint32(min(d.LeaseTime/time.Second, math.MaxUint32)),
	}

	for _, mac := range slices.Sorted(maps.Keys(d.Reservations)) {
		out.Reservations = append(out.Reservations, &bootpb.DHCPReservation{Mac: mac, Ip: d.Reservations[mac]})
	}

	if proto.Equal(out, &bootpb.DHCP{}) {
		return nil
	}

	return out
}

// MaxDHCPLeaseTime bounds the lease time an operator may set.
const MaxDHCPLeaseTime = 7 * 24 * time.Hour

// SetPool sets the pool from an operator's "START-END" or CIDR range; a CIDR is also the subnet unless one
// is given (subnet "" keeps the stored one for a range); "" clears pool and subnet.
func (d *DHCP) SetPool(pool string) error {
	if pool == "" {
		d.PoolStart, d.PoolEnd, d.Subnet = "", "", ""

		return nil
	}

	start, end, prefix, err := bootpb.ParseDHCPPool(pool)
	if err != nil {
		return err
	}

	d.PoolStart, d.PoolEnd = start.String(), end.String()
	if prefix.IsValid() {
		d.Subnet = prefix.String()
	}

	return nil
}

// SettingsOf returns a stored site's settings.
func SettingsOf(site *resources.Site) Settings {
	spec := site.TypedSpec().Value

	return Settings{
		Discovery: spec.GetDiscovery(), BMCProtocol: spec.GetBmcProtocol(), WipeMethod: spec.GetWipeMethod(), SecureBoot: spec.GetSecureBoot(),
		ExtraConfig: spec.GetExtraConfig(), RegisteredMACs: spec.GetRegisteredMacs(), Labels: spec.GetLabels(),
		AssetPolicy: spec.GetAssetPolicy(), Staged: spec.GetStagedProfiles(),
		DHCP: DHCP{
			Mode: spec.GetDhcpMode(), Subnet: spec.GetDhcpSubnet(), PoolStart: spec.GetDhcpPoolStart(), PoolEnd: spec.GetDhcpPoolEnd(),
			Gateway: spec.GetDhcpGateway(), DNS: spec.GetDhcpDns(), NTP: spec.GetDhcpNtp(),
			LeaseTime: time.Duration(spec.GetDhcpLeaseSeconds()) * time.Second, Reservations: spec.GetDhcpReservations(),
		},
	}
}

// SettingsCheck checks a site's settings as a whole before they are stored (the app's rules: the discovery
// names, the BMC protocols, the wipe methods, the documents machinery accepts beside the provider's own).
type SettingsCheck func(siteID string, s Settings) error

// SetSettings changes the site's settings with change, checked by check before anything is stored; it returns
// what was stored.
func (r *Registry) SetSettings(ctx context.Context, siteID string, check SettingsCheck, change func(*Settings) error) (Settings, error) {
	var stored Settings

	_, err := r.update(ctx, siteID, func(site *resources.Site) error {
		s := SettingsOf(site)
		s.RegisteredMACs = slices.Clone(s.RegisteredMACs)
		s.DHCP.Reservations = maps.Clone(s.DHCP.Reservations)

		if err := change(&s); err != nil {
			return err
		}

		if err := check(siteID, s); err != nil {
			return err
		}

		spec := site.TypedSpec().Value
		spec.Discovery, spec.BmcProtocol, spec.WipeMethod, spec.SecureBoot = s.Discovery, s.BMCProtocol, s.WipeMethod, s.SecureBoot
		spec.ExtraConfig, spec.RegisteredMacs = s.ExtraConfig, s.RegisteredMACs
		spec.DhcpMode, spec.DhcpSubnet, spec.DhcpPoolStart, spec.DhcpPoolEnd = s.DHCP.Mode, s.DHCP.Subnet, s.DHCP.PoolStart, s.DHCP.PoolEnd
		spec.DhcpGateway, spec.DhcpDns, spec.DhcpNtp, spec.DhcpReservations = s.DHCP.Gateway, s.DHCP.DNS, s.DHCP.NTP, s.DHCP.Reservations
		spec.DhcpLeaseSeconds = uint32(s.DHCP.LeaseTime / time.Second) // bounded by the check
		stored = s

		return nil
	})

	return stored, err
}

// MaxStaged bounds the profiles staged at one site.
const MaxStaged = 64

// SetStaged changes the install profiles staged at the site with change (which gets the stored list and
// returns the new one, checked by the caller) and returns what was stored.
func (r *Registry) SetStaged(ctx context.Context, siteID string, change func([]string) ([]string, error)) ([]string, error) {
	var stored []string

	_, err := r.update(ctx, siteID, func(site *resources.Site) error {
		next, err := change(slices.Clone(site.TypedSpec().Value.GetStagedProfiles()))
		if err != nil {
			return err
		}

		if len(next) > MaxStaged {
			return status.Errorf(codes.InvalidArgument, "site %s: %d staged profiles, at most %d", siteID, len(next), MaxStaged)
		}

		site.TypedSpec().Value.StagedProfiles, stored = next, next

		return nil
	})

	return stored, err
}

// NormalizeMACs parses MACs as an operator writes them (colons or dashes, any case) into the stored form;
// the first malformed one is the error, naming it.
func NormalizeMACs(macs []string) ([]string, error) {
	out := make([]string, 0, len(macs))

	for _, m := range macs {
		hw, err := net.ParseMAC(m)
		if err != nil || len(hw) != 6 {
			return nil, fmt.Errorf("%q is not a MAC address (want six bytes such as 52:54:00:12:34:56)", m)
		}

		out = append(out, hw.String())
	}

	return out, nil
}

// FollowSettings calls apply with every site's settings, at once and then on every change (a deleted site
// with the zero Settings), until ctx ends. The registry may live in Omni, written by another controller too;
// a broken watch is started again.
func (r *Registry) FollowSettings(ctx context.Context, log *zap.Logger, apply func(siteID string, s Settings)) {
	const retry = 5 * time.Second

	for ctx.Err() == nil {
		err := r.followSettings(ctx, apply)
		if ctx.Err() != nil {
			return
		}

		log.Warn("site settings watch ended; starting it again", zap.Error(err), zap.Duration("in", retry))

		select {
		case <-ctx.Done():
		case <-time.After(retry):
		}
	}
}

func (r *Registry) followSettings(ctx context.Context, apply func(siteID string, s Settings)) error {
	return r.watch(ctx, true, func(ev state.Event) {
		switch site, ok := ev.Resource.(*resources.Site); {
		case ev.Type == state.Destroyed:
			apply(ev.Resource.Metadata().ID(), Settings{})
		case ok:
			apply(site.Metadata().ID(), SettingsOf(site))
		}
	})
}

// settingsView is the operator's view of a site's settings.
func settingsView(s Settings) *adminpb.SiteSettings {
	var pool string
	if s.DHCP.PoolStart != "" {
		pool = s.DHCP.PoolStart + "-" + s.DHCP.PoolEnd
	}

	return &adminpb.SiteSettings{
		Discovery: s.Discovery, BmcProtocol: s.BMCProtocol, WipeMethod: s.WipeMethod, SecureBoot: s.SecureBoot,
		ExtraConfig: s.ExtraConfig, RegisteredMacs: s.RegisteredMACs,
		DhcpMode: s.DHCP.Mode, DhcpSubnet: s.DHCP.Subnet, DhcpGateway: s.DHCP.Gateway, DhcpDns: s.DHCP.DNS, DhcpNtp: s.DHCP.NTP,
		DhcpLeaseTime: durationpb.New(s.DHCP.LeaseTime), DhcpReservations: s.DHCP.Reservations, DhcpPool: pool,
	}
}

// badSettings is a refusal of the operator's input (the settings check, a limit), told apart from a store error.
type badSettings struct{ err error }

func (b *badSettings) Error() string { return b.err.Error() }

// SetSiteSettings implements adminpb.AdminServer: every given value replaces the site's (empty: back to the
// controller's default); the whole result is checked before any of it is stored.
func (a *Admin) SetSiteSettings(ctx context.Context, req *adminpb.SetSiteSettingsRequest) (*adminpb.SetSiteSettingsResponse, error) {
	if a.checkSettings == nil {
		return nil, status.Error(codes.Unimplemented, "this controller takes no site settings")
	}

	stored, err := a.registry.SetSettings(ctx, req.GetSiteId(), a.wrapCheck, func(s *Settings) error {
		if req.Discovery != nil {
			s.Discovery = req.GetDiscovery()
		}

		if req.BmcProtocol != nil {
			s.BMCProtocol = req.GetBmcProtocol()
		}

		if req.WipeMethod != nil {
			s.WipeMethod = req.GetWipeMethod()
		}

		if req.SecureBoot != nil {
			s.SecureBoot = req.GetSecureBoot()
		}

		if req.ExtraConfig != nil {
			s.ExtraConfig = req.GetExtraConfig()
		}

		return setDHCP(&s.DHCP, req)
	})
	if err != nil {
		return nil, settingsStatus(err)
	}

	return &adminpb.SetSiteSettingsResponse{Settings: settingsView(stored)}, nil
}

// RegisterMachines implements adminpb.AdminServer: MACs are added and removed together, or, when one is
// malformed or the site would hold too many, not at all.
func (a *Admin) RegisterMachines(ctx context.Context, req *adminpb.RegisterMachinesRequest) (*adminpb.RegisterMachinesResponse, error) {
	if a.checkSettings == nil {
		return nil, status.Error(codes.Unimplemented, "this controller takes no site settings")
	}

	add, err := NormalizeMACs(req.GetAdd())
	if err != nil {
		return nil, status.Error(codes.InvalidArgument, err.Error())
	}

	remove, err := NormalizeMACs(req.GetRemove())
	if err != nil {
		return nil, status.Error(codes.InvalidArgument, err.Error())
	}

	var reserve string

	if req.GetIp() != "" {
		ip, err := netip.ParseAddr(req.GetIp())
		if err != nil || !ip.Is4() || len(add) != 1 {
			return nil, status.Errorf(codes.InvalidArgument, "--ip %q: want one IPv4 address for one MAC added", req.GetIp())
		}

		reserve = ip.String()
	}

	stored, err := a.registry.SetSettings(ctx, req.GetSiteId(), a.wrapCheck, func(s *Settings) error {
		for _, m := range remove {
			delete(s.DHCP.Reservations, m)
		}

		if reserve != "" {
			if s.DHCP.Reservations == nil {
				s.DHCP.Reservations = map[string]string{}
			}

			s.DHCP.Reservations[add[0]] = reserve
		}

		macs := slices.DeleteFunc(s.RegisteredMACs, func(m string) bool { return slices.Contains(remove, m) })
		macs = append(macs, add...)
		slices.Sort(macs)
		s.RegisteredMACs = slices.Compact(macs)

		if len(s.RegisteredMACs) > MaxRegisteredMACs {
			return &badSettings{fmt.Errorf("%d registered machines, at most %d per site", len(s.RegisteredMACs), MaxRegisteredMACs)}
		}

		return nil
	})
	if err != nil {
		return nil, settingsStatus(err)
	}

	return &adminpb.RegisterMachinesResponse{RegisteredMacs: stored.RegisteredMACs}, nil
}

// setDHCP applies the DHCP fields a request gives; the result is checked as a whole afterwards.
func setDHCP(d *DHCP, req *adminpb.SetSiteSettingsRequest) error {
	if req.DhcpMode != nil {
		d.Mode = req.GetDhcpMode()
	}

	if req.DhcpPool != nil {
		if err := d.SetPool(req.GetDhcpPool()); err != nil {
			return &badSettings{err}
		}
	}

	if req.DhcpSubnet != nil {
		d.Subnet = req.GetDhcpSubnet()
		if p, err := netip.ParsePrefix(d.Subnet); err == nil {
			d.Subnet = p.Masked().String()
		}
	}

	if req.DhcpGateway != nil {
		d.Gateway = req.GetDhcpGateway()
	}

	if req.GetDhcpDns() != nil {
		d.DNS = req.GetDhcpDns().GetValues()
	}

	if req.GetDhcpNtp() != nil {
		d.NTP = req.GetDhcpNtp().GetValues()
	}

	if lt := req.GetDhcpLeaseTime(); lt != nil {
		if err := lt.CheckValid(); err != nil || lt.AsDuration() < 0 || lt.AsDuration() > MaxDHCPLeaseTime {
			return &badSettings{fmt.Errorf("dhcp lease time %s: want at most %s", lt.AsDuration(), MaxDHCPLeaseTime)}
		}

		d.LeaseTime = lt.AsDuration().Truncate(time.Second)
	}

	return nil
}

func (a *Admin) wrapCheck(siteID string, s Settings) error {
	if err := a.checkSettings(siteID, s); err != nil {
		return &badSettings{err}
	}

	return nil
}

func settingsStatus(err error) error {
	if bad, ok := errors.AsType[*badSettings](err); ok {
		return status.Error(codes.InvalidArgument, bad.Error())
	}

	return registryStatus(err)
}
