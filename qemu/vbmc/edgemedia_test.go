package vbmc_test

import (
	"context"
	"errors"
	"testing"

	"github.com/outpost-metal/outpost/edge/bmc"
	"github.com/outpost-metal/outpost/edge/bmc/redfish"
	"github.com/outpost-metal/outpost/qemu/vbmc"
)

// TestEdgeBootsFromVirtualMedia drives the edge's virtual-media path against this BMC's Redfish VirtualMedia:
// the image mounted and shown to the host, a one-time CD boot set, the system's UUID read; a BMC that
// half-mounts or refuses is named, and an IPMI-driven BMC is refused before anything is sent.
func TestEdgeBootsFromVirtualMedia(t *testing.T) {
	t.Parallel()

	const uuid = "0e5a1ab0-0000-4000-8000-00000000000a"
	const image = "http://10.9.0.1/vmedia/" + "0000000000000000000000000000000000000000000000000000000000000000.iso"

	ctx := context.Background()
	media := vbmc.NewMedia(nil)
	m := newMachineWith(t, vbmc.RedfishOptions{User: user, Password: password, Media: media, UUID: uuid})
	mgr := newManager(t, nil, nil)

	got, err := mgr.BootFromMedia(ctx, m.target(bmc.ProtocolRedfish), creds, image)
	if err != nil {
		t.Fatal(err)
	}

	if got != uuid {
		t.Errorf("system uuid %q, want %q", got, uuid)
	}

	if st := media.State(); st.Image != image || !st.Inserted {
		t.Errorf("virtual cd after the boot: %+v", st)
	}

	if o := m.ch.Override(); o.Device != vbmc.BootCD || o.Persistent {
		t.Errorf("boot override %+v, want a one-time cd boot", o)
	}

	// Mounting again replaces the image (ejected first).
	other := image[:len(image)-5] + "1.iso"
	if _, err := mgr.BootFromMedia(ctx, m.target(bmc.ProtocolRedfish), creds, other); err != nil {
		t.Fatal(err)
	}

	if st := media.State(); st.Image != other || st.Ejects != 1 {
		t.Errorf("virtual cd after a second boot: %+v", st)
	}

	if err := mgr.EjectMedia(ctx, m.target(bmc.ProtocolRedfish), creds); err != nil || media.State().Image != "" {
		t.Errorf("eject: %v, %+v", err, media.State())
	}

	media.SetFault(vbmc.MediaHalfMount)

	if _, err := mgr.BootFromMedia(ctx, m.target(bmc.ProtocolRedfish), creds, image); !errors.Is(err, redfish.ErrHalfMounted) {
		t.Errorf("a half-mounting bmc: got %v, want ErrHalfMounted", err)
	}

	media.SetFault(vbmc.MediaRefuse)
	media.Eject(ctx) //nolint:errcheck

	if _, err := mgr.BootFromMedia(ctx, m.target(bmc.ProtocolRedfish), creds, image); err == nil {
		t.Error("a refusing bmc: no error")
	}

	if _, err := mgr.BootFromMedia(ctx, m.target(bmc.ProtocolIPMI), creds, image); !errors.Is(err, bmc.ErrNoVirtualMedia) || !bmc.IsPermanent(err) {
		t.Errorf("over ipmi: got %v, want a permanent ErrNoVirtualMedia", err)
	}
}
