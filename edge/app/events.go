package app

import (
	"github.com/outpost-metal/outpost/edge/bootfiles"
	"github.com/outpost-metal/outpost/edge/dhcp"
	"github.com/outpost-metal/outpost/edge/httpd"
	"github.com/outpost-metal/outpost/edge/journal"
	"github.com/outpost-metal/outpost/edge/tunnel"
	bootpb "github.com/outpost-metal/outpost/shared/api/boot"
)

// Tap is told what the edge serves, beside the journal (Options.Tap).
type Tap interface {
	DHCPSeen(dhcp.Seen)
	TFTPFetch(bootfiles.Fetch)
	BootServed(httpd.BootServed)
}

// siteEvents is where the boot servers and the agent tunnels report: every event is journaled (for the
// controller), the DHCP answers and the addresses boot scripts were served to are noted in the boot book (what
// an agent tunnel is bound to), and the optional tap is told.
type siteEvents struct {
	rec  *journal.Recorder
	book *tunnel.BootBook
	tap  Tap
}

// DHCPSeen implements dhcp.Observer: the answer starts a boot of that MAC the boot book can bind to.
func (s siteEvents) DHCPSeen(seen dhcp.Seen) {
	s.book.DHCPAnswered(seen.MAC)
	s.rec.DHCPSeen(seen)

	if s.tap != nil {
		s.tap.DHCPSeen(seen)
	}
}

// TFTPFetch implements tftp.Observer.
func (s siteEvents) TFTPFetch(f bootfiles.Fetch) {
	s.rec.TFTPFetch(f)

	if s.tap != nil {
		s.tap.TFTPFetch(f)
	}
}

// HTTPFetch implements httpd.Observer.
func (s siteEvents) HTTPFetch(f bootfiles.Fetch) { s.rec.HTTPFetch(f) }

// AssetFetch implements httpd.AssetObserver.
func (s siteEvents) AssetFetch(f httpd.AssetFetch) { s.rec.AssetFetch(f) }

// BootServed implements httpd.Observer: the boot is journaled and where the machine asked from is noted, the
// evidence its agent's tunnel is bound to. A config fetch is none: it carries no MAC and is answered to any
// host, so a host asking for a switched-off machine's config could take its tunnel.
func (s siteEvents) BootServed(b httpd.BootServed) {
	s.book.Note(b.UUID, b.Remote, b.MAC)
	s.rec.BootServed(b)

	if s.tap != nil {
		s.tap.BootServed(b)
	}
}

// TunnelOpened implements tunnel.EventSink.
func (s siteEvents) TunnelOpened(e tunnel.Event) { s.recordTunnel(e, true) }

// TunnelClosed implements tunnel.EventSink.
func (s siteEvents) TunnelClosed(e tunnel.Event) { s.recordTunnel(e, false) }

func (s siteEvents) recordTunnel(e tunnel.Event, open bool) {
	ev := &bootpb.AgentTunnel{MachineId: e.MachineID, Open: open, AddressMismatch: e.AddressMismatch}

	if e.RemoteAddr.IsValid() {
		ev.RemoteIp = e.RemoteAddr.Addr().String()
	}

	if e.SeenAddr.IsValid() {
		ev.SeenIp = e.SeenAddr.String()
	}

	s.rec.Record(&bootpb.Event{Kind: &bootpb.Event_AgentTunnel{AgentTunnel: ev}})
}

// TunnelRefused implements tunnel.RefusalSink: the controller hears that another host (or a clone) asked for
// a machine's tunnel.
func (s siteEvents) TunnelRefused(r tunnel.Refusal) {
	var remote string
	if r.RemoteAddr.IsValid() {
		remote = r.RemoteAddr.Addr().String()
	}

	s.rec.Record(&bootpb.Event{Kind: &bootpb.Event_TunnelRefused{TunnelRefused: bootpb.NewTunnelRefused(r.MachineID, r.Reason, remote)}})
}
