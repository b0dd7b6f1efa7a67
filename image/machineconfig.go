package image

import (
	"errors"
	"fmt"
	"net"
	"net/netip"
	"strings"

	"github.com/siderolabs/talos/pkg/machinery/config/config"
	"github.com/siderolabs/talos/pkg/machinery/config/configloader"
	"github.com/siderolabs/talos/pkg/machinery/config/container"
	"github.com/siderolabs/talos/pkg/machinery/config/encoder"
	"github.com/siderolabs/talos/pkg/machinery/config/types/meta"
	"github.com/siderolabs/talos/pkg/machinery/config/types/network"
	"github.com/siderolabs/talos/pkg/machinery/config/types/runtime/extensions"
)

// Environment variables the edge reads (every edge flag also has one, see edge/main.go); the patch sets these.
const (
	EnvController = "OUTPOST_CONTROLLER"
	EnvJoinToken  = "OUTPOST_JOIN_TOKEN"
)

// PatchConfig is what an operator says about one appliance.
type PatchConfig struct {
	// ControllerAddress is the controller's uplink address, host:port; several, comma separated, for an active
	// controller and its standby.
	ControllerAddress string
	// JoinToken is the token `controller site create` printed for this site.
	JoinToken string
	// Hostname is the appliance's host name (optional).
	Hostname string
	// Interface is the link to configure statically (optional; empty keeps Talos's DHCP default).
	Interface string
	// Addresses are static addresses with prefix length for Interface.
	Addresses []netip.Prefix
	// Gateway is the default gateway via Interface (optional).
	Gateway netip.Addr
	// Nameservers are DNS servers (optional).
	Nameservers []netip.Addr
}

// Validate checks the patch configuration.
func (p PatchConfig) Validate() error {
	var errs []error

	// Several addresses (an active controller and its standbys) are comma separated, as the edge reads them;
	// it dials at most 8.
	addrs := strings.Split(p.ControllerAddress, ",")
	if len(addrs) > 8 {
		errs = append(errs, fmt.Errorf("controller address: %d addresses, the edge dials at most 8", len(addrs)))
	}

	for _, addr := range addrs {
		if _, port, err := net.SplitHostPort(strings.TrimSpace(addr)); err != nil || port == "" {
			errs = append(errs, fmt.Errorf("controller address %q: want host:port", addr))
		}
	}

	if p.JoinToken == "" {
		errs = append(errs, errors.New("join token is empty"))
	}

	if p.Interface == "" && (len(p.Addresses) > 0 || p.Gateway.IsValid()) {
		errs = append(errs, errors.New("static addresses or a gateway need an interface"))
	}

	if p.Interface != "" && len(p.Addresses) == 0 {
		errs = append(errs, fmt.Errorf("interface %s: no addresses", p.Interface))
	}

	return errors.Join(errs...)
}

// clientMode is the runtime mode machine configs are validated for: bare metal, installed to disk.
type clientMode struct{}

func (clientMode) String() string        { return "metal" }
func (clientMode) RequiresInstall() bool { return true }
func (clientMode) InContainer() bool     { return false }

// MachineConfigPatch builds the appliance's Talos machine-config patch: an ExtensionServiceConfig giving the
// edge service its controller address and join token, and optional host name, static address, default route
// and resolvers. The documents are validated by machinery, encoded, loaded back and validated again.
func MachineConfigPatch(p PatchConfig) ([]byte, error) {
	if err := p.Validate(); err != nil {
		return nil, fmt.Errorf("machine config patch: %w", err)
	}

	svc := extensions.NewServicesConfigV1Alpha1()
	svc.ServiceName = ServiceName
	svc.ServiceEnvironment = []string{EnvController + "=" + p.ControllerAddress, EnvJoinToken + "=" + p.JoinToken}

	docs := []config.Document{svc}

	if p.Hostname != "" {
		h := network.NewHostnameConfigV1Alpha1()
		h.ConfigHostname = p.Hostname
		docs = append(docs, h)
	}

	if p.Interface != "" {
		link := network.NewLinkConfigV1Alpha1(p.Interface)

		for _, a := range p.Addresses {
			link.LinkAddresses = append(link.LinkAddresses, network.AddressConfig{AddressAddress: a})
		}

		if p.Gateway.IsValid() { // no destination: the default route
			link.LinkRoutes = append(link.LinkRoutes, network.RouteConfig{RouteGateway: meta.Addr{Addr: p.Gateway}})
		}

		docs = append(docs, link)
	}

	if len(p.Nameservers) > 0 {
		r := network.NewResolverConfigV1Alpha1()
		for _, ns := range p.Nameservers {
			r.ResolverNameservers = append(r.ResolverNameservers, network.NameserverConfig{Address: meta.Addr{Addr: ns}})
		}

		docs = append(docs, r)
	}

	ctr, err := container.New(docs...)
	if err != nil {
		return nil, fmt.Errorf("machine config patch: %w", err)
	}

	if _, err := ctr.ValidateAsClient(clientMode{}); err != nil {
		return nil, fmt.Errorf("machine config patch: %w", err)
	}

	out, err := ctr.EncodeBytes(encoder.WithComments(encoder.CommentsDisabled))
	if err != nil {
		return nil, fmt.Errorf("encode machine config patch: %w", err)
	}

	if err := ValidatePatch(out); err != nil {
		return nil, err
	}

	return out, nil
}

// ValidatePatch loads a machine-config patch with machinery's loader and validates every document.
func ValidatePatch(data []byte) error {
	prov, err := configloader.NewFromBytes(data)
	if err != nil {
		return fmt.Errorf("load machine config patch: %w", err)
	}

	if _, err := prov.ValidateAsClient(clientMode{}); err != nil {
		return fmt.Errorf("validate machine config patch: %w", err)
	}

	found := false

	for _, e := range prov.ExtensionServiceConfigs() {
		if e.Name() == ServiceName {
			found = true
		}
	}

	if !found {
		return fmt.Errorf("machine config patch has no ExtensionServiceConfig for %s", ServiceName)
	}

	return nil
}
