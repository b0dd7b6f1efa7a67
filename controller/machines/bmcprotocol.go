package machines

import (
	"fmt"

	"github.com/spf13/pflag"

	bmcpb "github.com/outpost-metal/outpost/shared/api/bmc"
	"github.com/outpost-metal/outpost/shared/envflag"
)

// ParseBMCProtocol checks a BMC protocol setting: auto, ipmi or redfish.
func ParseBMCProtocol(s string) (bmcpb.Protocol, error) {
	switch s {
	case "", "auto":
		return bmcpb.Protocol_PROTOCOL_AUTO, nil
	case "ipmi":
		return bmcpb.Protocol_PROTOCOL_IPMI, nil
	case "redfish":
		return bmcpb.Protocol_PROTOCOL_REDFISH, nil
	default:
		return 0, fmt.Errorf("bmc protocol %q: want auto, ipmi or redfish", s)
	}
}

// BMCProtocolName is the setting that names p: auto, ipmi or redfish ("" for none of them).
func BMCProtocolName(p bmcpb.Protocol) string {
	switch p {
	case bmcpb.Protocol_PROTOCOL_AUTO:
		return "auto"
	case bmcpb.Protocol_PROTOCOL_IPMI:
		return "ipmi"
	case bmcpb.Protocol_PROTOCOL_REDFISH:
		return "redfish"
	default:
		return ""
	}
}

// BMCProtocolFlag is p as a flag value (pflag.Value): it takes auto, ipmi or redfish, so that a configuration
// holds the protocol parsed.
func BMCProtocolFlag(p *bmcpb.Protocol) pflag.Value {
	return envflag.Parsed(p, "protocol", ParseBMCProtocol, BMCProtocolName)
}
