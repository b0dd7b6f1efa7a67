package app

import (
	"context"
	"errors"
	"fmt"
	"net"
	"strings"
	"time"

	"github.com/outpost-metal/outpost/edge/assetcache"
	"github.com/outpost-metal/outpost/edge/bmc"
	"github.com/outpost-metal/outpost/edge/boot"
	"github.com/outpost-metal/outpost/edge/httpd"
	"github.com/outpost-metal/outpost/edge/tunnel"
	"github.com/outpost-metal/outpost/edge/vmedia"
	bootpb "github.com/outpost-metal/outpost/shared/api/boot"
	"github.com/outpost-metal/outpost/shared/metal"
)

// imageArch is the only architecture images are built for (the loader is x86_64 UEFI GRUB), and imageBuild
// the iPXE build that would boot such a machine.
const (
	imageArch  = metal.AMD64
	imageBuild = bootpb.IPXEArch_IPXE_ARCH_X86_64
)

// imagePlanner decides what a machine's virtual-media image boots exactly as its boot script would be decided
// (httpd.Decide over the same plan, assets and policy), then reads the kernel and initramfs names off the
// edge's own /assets/ URLs.
type imagePlanner struct {
	cfg      httpd.Config
	host     string
	table    *boot.Table
	assets   httpd.AssetIndex
	upstream func() httpd.UpstreamRule
}

// Boot implements vmedia.Planner.
func (p imagePlanner) Boot(uuid string, mac net.HardwareAddr) (vmedia.Boot, error) {
	id := metal.ID(metal.NormalizeID(uuid))
	ans := httpd.Decide(p.cfg, httpd.Request{
		Query:    httpd.BootQuery{UUID: id, MAC: mac, Build: imageBuild, Platform: bootpb.IPXEPlatform_IPXE_PLATFORM_EFI},
		Host:     p.host,
		Plan:     p.table.Lookup(id, mac, imageArch),
		Assets:   p.assets,
		Upstream: p.upstream(),
		Now:      time.Now(),
	})

	switch ans.Kind {
	case httpd.KindKernel:
	case httpd.KindWait:
		return vmedia.Boot{}, fmt.Errorf("the site does not hold the %s assets yet: %s", ans.Waiting, strings.Join(ans.Missing, ", "))
	case httpd.KindExit, httpd.KindSanboot:
		return vmedia.Boot{}, errors.New("the machine's plan boots its disk: there is nothing to boot from an image")
	default:
		return vmedia.Boot{}, fmt.Errorf("the machine's plan boots nothing (%s)", ans.Reason)
	}

	local := "http://" + p.host + assetcache.Prefix
	kernel, ok1 := strings.CutPrefix(ans.Kernel.GetKernelUrl(), local)
	initrd, ok2 := strings.CutPrefix(ans.Kernel.GetInitrdUrl(), local)

	if !ok1 || !ok2 {
		return vmedia.Boot{}, fmt.Errorf("the %s kernel is not held by the edge (%s): an image can only hold what the site caches",
			ans.Mode, ans.Kernel.GetKernelUrl())
	}

	return vmedia.Boot{Mode: string(ans.Mode), Kernel: kernel, Initrd: initrd, Args: ans.Args}, nil
}

// images is bmc.Images over a vmedia.Store: a machine that boots an image is bound, for its agent tunnel, to
// the static address the image gives it (no DHCP or boot script request is there to say where it booted).
type images struct {
	store *vmedia.Store
	book  *tunnel.BootBook
}

// Image implements bmc.Images.
func (i images) Image(ctx context.Context, uuid string, mac net.HardwareAddr) (bmc.BootImage, error) {
	img, err := i.store.Image(ctx, uuid, mac)
	if err != nil {
		return bmc.BootImage{}, err
	}

	return bmc.BootImage{URL: img.URL, Mode: img.Mode, MAC: img.Static.MAC, Address: img.Static.Address}, nil
}

// Remember implements bmc.Images.
func (i images) Remember(uuid string, img bmc.BootImage) error {
	if err := i.store.Remember(uuid, img.MAC); err != nil {
		return err
	}

	if id, err := metal.ParsePeerID(uuid); err == nil {
		i.book.Note(id, img.Address.Addr(), img.MAC)
	}

	return nil
}
