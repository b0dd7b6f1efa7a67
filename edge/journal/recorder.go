package journal

import (
	"go.uber.org/zap"

	"github.com/outpost-metal/outpost/edge/bootfiles"
	"github.com/outpost-metal/outpost/edge/dhcp"
	"github.com/outpost-metal/outpost/edge/httpd"
	"github.com/outpost-metal/outpost/edge/tftp"
	bmcpb "github.com/outpost-metal/outpost/shared/api/bmc"
	bootpb "github.com/outpost-metal/outpost/shared/api/boot"
)

// Recorder turns the boot services' observations into journal events. It implements dhcp.Observer,
// tftp.Observer and httpd.Observer. A failed append (disk full) is logged and counted, never blocks booting.
type Recorder struct {
	j   *Journal
	log *zap.Logger
}

// NewRecorder returns a Recorder appending to j.
func NewRecorder(j *Journal, logger *zap.Logger) *Recorder {
	return &Recorder{j: j, log: logger.With(zap.String("component", "journal"))}
}

var (
	_ dhcp.Observer  = (*Recorder)(nil)
	_ tftp.Observer  = (*Recorder)(nil)
	_ httpd.Observer = (*Recorder)(nil)
)

// Record appends any event; other components (agent tunnel, assets) use it for their own kinds.
func (r *Recorder) Record(e *bootpb.Event) {
	if _, err := r.j.Append(e); err != nil {
		r.j.dropped.Add(1)
		r.log.Warn("journal append failed; event lost", zap.Error(err))
	}
}

// DHCPSeen records a PXE client answered by the ProxyDHCP, or offered nothing for a reason of its own.
func (r *Recorder) DHCPSeen(s dhcp.Seen) {
	ev := &bootpb.DHCPSeen{
		Mac: s.MAC.String(), Firmware: s.Firmware.String(), FirmwareClass: s.Firmware.Class(), Uuid: s.UUID, Ipxe: s.IPXE,
		NotAnswered: string(s.NotAnswered),
	}
	if s.Relay.IsValid() {
		ev.Relay = s.Relay.String()
	}

	r.Record(&bootpb.Event{Kind: &bootpb.Event_DhcpSeen{DhcpSeen: ev}})
}

// TFTPFetch records firmware fetching an iPXE binary over TFTP.
func (r *Recorder) TFTPFetch(f bootfiles.Fetch) {
	r.fetch(f, "tftp")
}

// HTTPFetch records firmware fetching an iPXE binary over HTTP (UEFI HTTP boot).
func (r *Recorder) HTTPFetch(f bootfiles.Fetch) {
	r.fetch(f, "http")
}

func (r *Recorder) fetch(f bootfiles.Fetch, via string) {
	ev := &bootpb.PXESeen{File: f.Name, Via: via}
	if f.Remote.IsValid() {
		ev.RemoteIp = f.Remote.String()
	}

	if f.Err != nil {
		ev.Error = f.Err.Error()
	}

	r.Record(&bootpb.Event{Kind: &bootpb.Event_PxeSeen{PxeSeen: ev}})
}

// AssetFetch records a whole boot asset sent to a machine, or its sending stopped early.
func (r *Recorder) AssetFetch(f httpd.AssetFetch) {
	ev := &bootpb.AssetFetch{File: f.Name, Sent: uint64(max(f.Sent, 0)), Size: uint64(max(f.Size, 0))}
	if f.Remote.IsValid() {
		ev.RemoteIp = f.Remote.String()
	}

	if f.Err != nil {
		ev.Error = f.Err.Error()
	}

	r.Record(&bootpb.Event{Kind: &bootpb.Event_AssetFetch{AssetFetch: ev}})
}

// BootServed records a boot.ipxe answer.
func (r *Recorder) BootServed(b httpd.BootServed) {
	ev := &bootpb.BootServed{
		Uuid: b.UUID.String(), Arch: b.Build.Name(), Platform: b.Platform.Name(), Mode: string(b.Mode), TableVersion: b.TableVersion,
		IpxeArch: b.Build, IpxePlatform: b.Platform,
		WaitingFor: string(b.WaitingFor), SignedImage: b.SignedImage,
	}

	for _, m := range b.Missing[:min(len(b.Missing), maxMissing)] {
		ev.MissingAssets = append(ev.MissingAssets, m[:min(len(m), maxMissingName)])
	}

	if b.MAC != nil {
		ev.Mac = b.MAC.String()
	}

	if b.Remote.IsValid() {
		ev.RemoteIp = b.Remote.String()
	}

	r.Record(&bootpb.Event{Kind: &bootpb.Event_BootServed{BootServed: ev}})
}

// maxMissing and maxMissingName bound the missing assets a boot event names.
const (
	maxMissing     = 4
	maxMissingName = 256
)

// maxPowerReason bounds the reason a power change carries (a BMC's error text).
const maxPowerReason = 256

// PowerChanged records a watched BMC's new power state (it fits bmc.PowerSink).
func (r *Recorder) PowerChanged(machineID string, state bmcpb.PowerState, reason string) {
	if len(reason) > maxPowerReason {
		reason = reason[:maxPowerReason]
	}

	r.Record(&bootpb.Event{Kind: &bootpb.Event_PowerChanged{PowerChanged: bootpb.NewPowerChanged(machineID, state, reason)}})
}
