package machines

import (
	"errors"
	"fmt"
	"maps"
	"slices"
	"sync"

	"github.com/siderolabs/gen/optional"
	"github.com/spf13/pflag"

	bmcpb "github.com/outpost-metal/outpost/shared/api/bmc"
	bootpb "github.com/outpost-metal/outpost/shared/api/boot"
	"github.com/outpost-metal/outpost/shared/envflag"
)

// SitePolicy is what an operator set for one site (controller site set) that the lifecycle applies, parsed
// (ParseSitePolicy); an empty field means the controller's own setting.
type SitePolicy struct {
	// BMCProtocol is how the site's edge reaches its BMCs (none: the controller's).
	BMCProtocol optional.Optional[bmcpb.Protocol]
	// WipeMethod is how the site's machines are wiped ("": the controller's).
	WipeMethod WipeMethod
	// BootFromImage is set for a site without DHCP (controller site set --dhcp off): its machines boot from
	// virtual media their BMCs mount, never from the network.
	BootFromImage bool
	// SecureBoot says whether the site's machines enforce Secure Boot (unspecified: each machine's BMC says).
	SecureBoot bootpb.SecureBoot
}

// ParseSitePolicy reads a site's settings as an operator gave them: a BMC protocol (auto, ipmi or redfish),
// a wipe method (fast or zeroes) and Secure Boot (on, off or auto), each "" for the controller's own.
func ParseSitePolicy(bmcProtocol, wipeMethod, secureBoot string, bootFromImage bool) (SitePolicy, error) {
	sp := SitePolicy{BootFromImage: bootFromImage}

	var errs []error

	if sb, err := ParseSecureBoot(secureBoot); err != nil {
		errs = append(errs, err)
	} else {
		sp.SecureBoot = sb
	}

	if bmcProtocol != "" {
		p, err := ParseBMCProtocol(bmcProtocol)
		if err != nil {
			errs = append(errs, err)
		}

		sp.BMCProtocol = optional.Some(p)
	}

	if wipeMethod != "" {
		m, err := ParseWipeMethod(wipeMethod)
		if err != nil {
			errs = append(errs, err)
		}

		sp.WipeMethod = m
	}

	return sp, errors.Join(errs...)
}

// Validate checks the policy's values.
func (p SitePolicy) Validate() error {
	if proto, ok := p.BMCProtocol.Get(); ok && BMCProtocolName(proto) == "" {
		return fmt.Errorf("bmc protocol %d: want auto, ipmi or redfish", proto)
	}

	if p.WipeMethod != "" {
		if _, err := ParseWipeMethod(string(p.WipeMethod)); err != nil {
			return err
		}
	}

	return nil
}

// SitePolicies holds every site's SitePolicy and the labels an operator set on it. The BMC clients, the edges'
// watch lists and the wipe read the policies, the observation the labels (from memory: they are read for every
// machine at every poll); a change of a site's BMC protocol is passed on to the watch lists at once. Safe for
// concurrent use; a nil *SitePolicies holds no site's policy.
type SitePolicies struct {
	mu       sync.RWMutex
	sites    map[string]SitePolicy
	labels   map[string]map[string]string
	onChange []func(site string)
}

// NewSitePolicies returns policies holding no site's.
func NewSitePolicies() *SitePolicies {
	return &SitePolicies{sites: map[string]SitePolicy{}, labels: map[string]map[string]string{}}
}

// SetLabels replaces the labels published on site's machines (none: no labels).
func (p *SitePolicies) SetLabels(site string, labels map[string]string) {
	p.mu.Lock()
	defer p.mu.Unlock()

	if len(labels) == 0 {
		delete(p.labels, site)
	} else {
		p.labels[site] = maps.Clone(labels)
	}
}

// SiteLabels implements SiteLabels. The map returned is shared: callers do not change it.
func (p *SitePolicies) SiteLabels(site string) map[string]string {
	if p == nil {
		return nil
	}

	p.mu.RLock()
	defer p.mu.RUnlock()

	return p.labels[site]
}

// Set replaces site's policy (the zero policy hands the site back to the controller's settings).
func (p *SitePolicies) Set(site string, sp SitePolicy) error {
	if err := sp.Validate(); err != nil {
		return fmt.Errorf("site %s: %w", site, err)
	}

	p.mu.Lock()
	old := p.sites[site]

	if sp == (SitePolicy{}) {
		delete(p.sites, site)
	} else {
		p.sites[site] = sp
	}

	hooks := p.onChange
	p.mu.Unlock()

	if old.BMCProtocol != sp.BMCProtocol {
		for _, f := range hooks {
			f(site)
		}
	}

	return nil
}

// OnBMCProtocolChange registers f, called with the site whose BMC protocol changed.
func (p *SitePolicies) OnBMCProtocolChange(f func(site string)) {
	p.mu.Lock()
	defer p.mu.Unlock()

	p.onChange = append(p.onChange, f)
}

func (p *SitePolicies) get(site string) SitePolicy {
	if p == nil {
		return SitePolicy{}
	}

	p.mu.RLock()
	defer p.mu.RUnlock()

	return p.sites[site]
}

// BMCProtocol is site's BMC protocol, fallback (the controller's) when it has none of its own.
func (p *SitePolicies) BMCProtocol(site string, fallback bmcpb.Protocol) bmcpb.Protocol {
	if p == nil {
		return fallback
	}

	p.mu.RLock()
	defer p.mu.RUnlock()

	return p.sites[site].BMCProtocol.ValueOr(fallback)
}

// SecureBoot is what site's operator set for its machines' Secure Boot (unspecified: nothing).
func (p *SitePolicies) SecureBoot(site string) bootpb.SecureBoot { return p.get(site).SecureBoot }

// SecureBootSites lists the sites whose operator said their machines enforce Secure Boot, sorted.
func (p *SitePolicies) SecureBootSites() []string {
	if p == nil {
		return nil
	}

	p.mu.RLock()
	defer p.mu.RUnlock()

	var out []string

	for site, sp := range p.sites {
		if sp.SecureBoot == bootpb.SecureBoot_SECURE_BOOT_ON {
			out = append(out, site)
		}
	}

	slices.Sort(out)

	return out
}

// BootsFromImage reports whether site's machines boot from virtual media (a site without DHCP).
func (p *SitePolicies) BootsFromImage(site string) bool { return p.get(site).BootFromImage }

// WipeMethod is site's wipe method, fallback (the controller's) when it has none of its own.
func (p *SitePolicies) WipeMethod(site string, fallback WipeMethod) WipeMethod {
	if s := p.get(site).WipeMethod; s != "" {
		return s
	}

	return fallback
}

// WipeMethod is how a machine's disks are wiped (lifecycle Config.WipeMethod, SitePolicy.WipeMethod). A
// *WipeMethod is a flag value (pflag.Value) that takes fast or zeroes.
type WipeMethod string

// Wipe methods.
const (
	// WipeFast: the agent drops partition tables and signatures.
	WipeFast WipeMethod = "fast"
	// WipeZeroes: the agent writes zeroes over every disk.
	WipeZeroes WipeMethod = "zeroes"
)

// ParseWipeMethod refuses anything but a wipe method.
func ParseWipeMethod(s string) (WipeMethod, error) {
	if m := WipeMethod(s); m == WipeFast || m == WipeZeroes {
		return m, nil
	}

	return "", fmt.Errorf("wipe method %q: want %s or %s", s, WipeFast, WipeZeroes)
}

// WipeMethodFlag is m as a flag value (pflag.Value): it takes fast or zeroes, so that a configuration holds
// the method parsed.
func WipeMethodFlag(m *WipeMethod) pflag.Value {
	return envflag.Parsed(m, "method", ParseWipeMethod, func(m WipeMethod) string { return string(m) })
}
