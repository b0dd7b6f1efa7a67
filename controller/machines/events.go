package machines

import (
	"context"
	"errors"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/zap"

	bootpb "github.com/outpost-metal/outpost/shared/api/boot"
	"github.com/outpost-metal/outpost/shared/metal"
	"github.com/outpost-metal/outpost/shared/printable"
)

// HandleEvent feeds an edge event into the locations (it fits bootevents.Handler): a boot answer places the
// machine at the site and records its architecture, an agent tunnel opening or closing records agent presence,
// a DHCP request records the firmware of a machine already placed. Events naming no valid machine are logged,
// counted and dropped: they never fail (which would make the edge resend them forever) and never act on
// anything.
func (l *Locations) HandleEvent(_ context.Context, site string, e *bootpb.Event) error {
	switch k := e.GetKind().(type) {
	case *bootpb.Event_BootServed:
		id, err := metal.ParsePeerID(k.BootServed.GetUuid())
		if err != nil {
			l.reject(site, "bad_machine_id", err)

			return nil
		}

		moved, err := l.Seen(site, id)
		if err != nil {
			l.reject(site, "bad_machine_id", err)

			return nil
		}

		if moved {
			l.rejected.WithLabelValues("machine_moved").Inc()
		}

		if arch, ok := k.BootServed.MachineArch(); ok {
			l.SetArch(id, arch)
		}

		l.AddMAC(id, k.BootServed.GetMac())

		if fw, ok := k.BootServed.MachineFirmware(); ok {
			l.SetFirmware(id, string(fw), "ipxe")
		}

		if fw, ok := l.firmwareOfMAC(k.BootServed.GetMac()); ok {
			l.SetFirmware(id, fw, "dhcp")
		}
	case *bootpb.Event_AgentTunnel:
		id, err := metal.ParsePeerID(k.AgentTunnel.GetMachineId())
		if err == nil {
			err = l.AgentConnected(site, id, k.AgentTunnel.GetOpen())
		}

		switch {
		case errors.Is(err, ErrClaimRefused):
			l.reject(site, "claim_from_other_site", err)
			l.Raise(id, AlertClaimedElsewhere, "agent tunnel at site "+site+" from "+printable.String(k.AgentTunnel.GetRemoteIp(), 64))
		case err != nil:
			l.reject(site, "bad_machine_id", err)
		}
	case *bootpb.Event_DhcpSeen:
		fw, ok := k.DhcpSeen.MachineFirmware()
		if !ok {
			return nil
		}

		l.SetFirmwareByMAC(k.DhcpSeen.GetMac(), string(fw))

		if id, err := metal.ParsePeerID(k.DhcpSeen.GetUuid()); err == nil {
			l.SetFirmware(id, string(fw), "dhcp")
		}
	case *bootpb.Event_PowerChanged:
		var at time.Time
		if ts := e.GetTime(); ts.IsValid() {
			at = ts.AsTime()
		}

		if id, err := metal.ParsePeerID(k.PowerChanged.GetMachineId()); err == nil {
			l.powerReported(site, id, k.PowerChanged.ReportedState(), k.PowerChanged.GetError(), at)
		}
	case *bootpb.Event_TunnelRefused:
		alert, ok := alertOfRefusal[k.TunnelRefused.ReportedRefusal()]
		if !ok {
			l.reject(site, "unknown_refusal_reason", nil)

			return nil
		}

		id, err := metal.ParsePeerID(k.TunnelRefused.GetMachineId())
		if err != nil {
			// A malformed ID names no machine located anywhere, so no machine of this site either.
			l.rejected.WithLabelValues("refusal_from_other_site").Inc()

			return nil
		}

		if loc, known := l.Locate(id); !known || loc.SiteID != site {
			// Only the machine's own site speaks for it; a refusal elsewhere is that site's business.
			l.rejected.WithLabelValues("refusal_from_other_site").Inc()

			return nil
		}

		l.Raise(id, alert, "agent tunnel from "+printable.String(k.TunnelRefused.GetRemoteIp(), 64)+" refused at site "+site)
	case *bootpb.Event_PxeSeen, *bootpb.Event_AssetFetch:
		// names no machine (the timeline ties them to one by address)
	default:
		l.reject(site, "unknown_event", nil)
	}

	return nil
}

// alertOfRefusal is the alert each reason an edge refuses a known machine's tunnel for raises.
var alertOfRefusal = map[bootpb.TunnelRefusal]string{
	bootpb.TunnelRefusal_TUNNEL_REFUSAL_CONTESTED_MACHINE_ID:    AlertTunnelContested,
	bootpb.TunnelRefusal_TUNNEL_REFUSAL_SOURCE_NOT_BOOT_ADDRESS: AlertTunnelOtherSource,
	bootpb.TunnelRefusal_TUNNEL_REFUSAL_DUPLICATE_MACHINE_ID:    AlertSecondTunnel,
}

func (l *Locations) reject(site, reason string, err error) {
	l.rejected.WithLabelValues(reason).Inc()
	l.logger.Warn("edge event dropped", zap.String("site", site), zap.String("reason", reason), zap.Error(err))
}

// Describe implements prometheus.Collector.
func (l *Locations) Describe(ch chan<- *prometheus.Desc) {
	l.rejected.Describe(ch)
	l.alerts.Describe(ch)
}

// Collect implements prometheus.Collector.
func (l *Locations) Collect(ch chan<- prometheus.Metric) {
	l.rejected.Collect(ch)
	l.alerts.Collect(ch)
}
