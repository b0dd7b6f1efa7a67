package lab_test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/siderolabs/image-factory/pkg/schematic"

	"github.com/outpost-metal/outpost/controller/assets"
	"github.com/outpost-metal/outpost/qemu/bootlab"
	"github.com/outpost-metal/outpost/qemu/lab"
	"github.com/outpost-metal/outpost/qemu/realomni"
)

// TestSecureBootSiteBootsTalosUKIs: a site whose machines enforce Secure Boot boots them with the image
// factory's signed unified kernel images, never iPXE. The lab's factory builds each Secure Boot UKI as the real
// one does, from the schematic (the lab's kernel and /init, the schematic's kernel arguments as its locked
// command line), signed with the snakeoil key that OVMF's Secure Boot build enrolls. The site is air-gapped
// (asset policy cache): only the controller reaches the factory.
//
//   - The operator says the site's machines enforce Secure Boot (controller site set --secure-boot on); once the
//     edge has said how its machines reach it, the controller resolves the site's agent mode as a signed image
//     with the edge's addresses baked in, fetches it from the factory once and the edge holds it by relay.
//   - A new machine (OVMF Secure Boot, UEFI HTTP boot only) has no plan: the edge offers it that image by HTTP
//     boot, its firmware verifies and runs it, and the machine reaches agent mode, is accepted and made ready
//     in a real Omni.
//   - Allocated, it installs from its own plan's signed install image (another schematic: no
//     metal.provider.address, so the lab's /init installs), fetched once as well.
//   - Every offer the edge made the machine was a signed image under /assets/, and its firmware refused the
//     unsigned OS the lab's installer wrote to its disk ("Access Denied" on its console): enforcement is real.
func TestSecureBootSiteBootsTalosUKIs(t *testing.T) {
	bootlab.SkipUnlessLab(t, "objcopy", "sbsign", "openssl")

	for _, f := range []string{lab.OVMFSecureBootCode, lab.OVMFSnakeoilVars, lab.SnakeoilKey, lab.SnakeoilCert, bootlab.UKIStub} {
		if _, err := os.Stat(f); err != nil {
			t.Skipf("lab test: %s missing (Debian ovmf, systemd-boot-efi)", f)
		}
	}

	ctx, a, _, images := airGapLab(t, "secureboot", 40*time.Minute, "cache")
	s := steps{t, a}
	site := a.Sites[0]

	// The factory's Secure Boot UKIs: agent mode's (the metal agent's schematic) runs the lab's agent image,
	// an install's the factory's install initramfs; the command line is the schematic's kernel arguments.
	ukiDir := t.TempDir()
	a.Factory.SetSecureBootUKI(func(sc *schematic.Schematic, _, arch string) ([]byte, error) {
		if arch != "amd64" {
			return nil, fmt.Errorf("the lab builds amd64 UKIs only, not %s", arch)
		}

		initrd := a.InstallInitramfs
		if slices.Contains(sc.Customization.SystemExtensions.OfficialExtensions, "siderolabs/metal-agent") {
			initrd = images.Initramfs
		}

		return bootlab.BuildSignedUKI(ctx, ukiDir,
			bootlab.UKI{Kernel: images.Kernel, Initrd: initrd, Cmdline: strings.Join(sc.Customization.ExtraKernelArgs, " ")},
			bootlab.Signer{Key: lab.SnakeoilKey, Cert: lab.SnakeoilCert, Passphrase: "snakeoil"})
	})

	s.step("the site's machines enforce Secure Boot: controller site set --secure-boot on", func() error {
		return a.Controller.SetSite(ctx, site.Name, "--secure-boot", "on")
	})

	var agentUKI string

	s.step("the edge holds the site's signed agent image, fetched once from the factory by the controller and relayed", func() error {
		var err error

		agentUKI, err = waitEdgeHolds(ctx, a, site)

		return err
	})

	m, err := a.AddMachineSpec(ctx, site, lab.MachineSpec{
		Name: "sb-1", UUID: "0e5a1ab0-0000-4000-8000-0000000b0101", MAC: "52:54:00:0e:b1:01",
		Firmware: lab.UEFISecureBoot, BMC: lab.IPMI, MemoryMiB: 1024,
	})
	if err != nil {
		t.Fatal(err)
	}

	edgeLog := a.Edges[0].Log
	logFrom := edgeLog.Size()

	s.step("a new machine boots the site's signed agent image by HTTP boot, reaches agent mode and is made ready in Omni",
		func() error { return a.Discover(ctx, m) })

	var installFrom int64

	s.step("allocated, it installs from its own plan's signed install image", func() error {
		installFrom = m.Serial.Size()
		from := installFrom

		if err := a.Allocate(ctx, m, "sb-"+m.Spec.Name); err != nil {
			return err
		}

		return m.WaitSerial(ctx, from, "OUTPOST-INSTALL-WRITTEN", 10*time.Minute)
	})

	s.step("its firmware refuses the unsigned OS on its disk", func() error {
		return m.WaitSerial(ctx, installFrom, "Access Denied", 5*time.Minute)
	})

	m.PowerOffNow()

	s.step("the edge offered the machine signed images under /assets/ only, the agent's and an install's", func() error {
		offers, err := bootFilesOffered(edgeLog.Since(logFrom), m.Spec.MAC)
		if err != nil {
			return err
		}

		var agent, install int

		for _, offer := range offers {
			f, _, named := strings.Cut(offer, "?uuid=")

			switch {
			case !named:
				return fmt.Errorf("the edge offered %q without naming the machine (its boot's evidence)", offer)
			case !strings.Contains(f, "/assets/talos/") || !strings.HasSuffix(f, "/"+assets.SignedKind):
				return fmt.Errorf("the edge offered %q to a machine that enforces Secure Boot (offers: %v)", f, offers)
			case strings.HasSuffix(f, "/assets/"+agentUKI):
				agent++
			default:
				install++
			}
		}

		if agent == 0 || install == 0 {
			return fmt.Errorf("want offers of the agent image %s and of an install image, got %v", agentUKI, offers)
		}

		t.Logf("the edge offered %d times the agent image and %d times an install image, nothing else", agent, install)

		return nil
	})

	s.step("machine show: Secure Boot on, said by the site; its timeline has the signed images served", func() error {
		show, err := a.Controller.Command(ctx, 30*time.Second, "machine", "show", m.Spec.UUID)
		if err != nil {
			return err
		}

		for _, want := range []string{"on (site)", "signed image served: agent mode", "install plan served as a signed image"} {
			if !strings.Contains(show, want) {
				return fmt.Errorf("machine show has no %q:\n%s", want, show)
			}
		}

		return nil
	})

	s.step("the controller fetched each signed image from the factory once", func() error {
		got := map[string]int{}

		for _, r := range a.Factory.RequestLog() {
			if r.Kind == realomni.KindImageUKI && r.Method == "GET" && r.Status < 300 {
				if r.Local != a.FactoryHost {
					return fmt.Errorf("a signed image went to %s, outside the core: %+v", r.Remote, r)
				}

				got[r.Path]++
			}
		}

		if len(got) != 2 {
			return fmt.Errorf("the controller fetched %d signed images, want 2 (the agent's, the install's): %v", len(got), got)
		}

		for path, n := range got {
			if n != 1 {
				return fmt.Errorf("the controller fetched %s %d times, want once", path, n)
			}
		}

		t.Logf("signed images fetched from the factory: %v", got)

		return nil
	})

	s.step("the controller pulled the install's Secure Boot installer image, and no installer for agent mode", func() error {
		var pulled []string

		for _, r := range a.Factory.RequestLog() {
			if r.Kind == realomni.KindRegistryManifest && r.Status < 300 && r.Local == a.FactoryHost {
				pulled = append(pulled, r.Path)
			}
		}

		secure := slices.ContainsFunc(pulled, func(p string) bool { return strings.HasPrefix(p, "/v2/installer-secureboot/") })
		plain := slices.ContainsFunc(pulled, func(p string) bool { return strings.HasPrefix(p, "/v2/installer/") })

		if !secure || plain {
			return fmt.Errorf("want the Secure Boot installer pulled and no other: %v", pulled)
		}

		return nil
	})
}

// signedCachedRE finds a signed image among what `controller site show` says the site's edge holds.
var signedCachedRE = regexp.MustCompile(`(?m)^cached\s+(talos/\S+/amd64/` + regexp.QuoteMeta(assets.SignedKind) + `)\s`)

// waitEdgeHolds waits until the site's edge holds a signed amd64 image (its asset report, as `controller site
// show` prints it) and returns its name.
func waitEdgeHolds(ctx context.Context, a *lab.AirGap, site *lab.Site) (string, error) {
	deadline := time.Now().Add(5 * time.Minute)

	for {
		show, err := a.Controller.SiteShow(ctx, site.Name)
		if m := signedCachedRE.FindStringSubmatch(show); err == nil && m != nil {
			return m[1], nil
		}

		switch {
		case time.Now().Before(deadline):
		case err != nil:
			return "", fmt.Errorf("the edge of %s holds no signed image after 5 minutes: %w", site.Name, err)
		default:
			return "", fmt.Errorf("the edge of %s holds no signed image after 5 minutes; controller site show:\n%s", site.Name, show)
		}

		select {
		case <-ctx.Done():
			return "", ctx.Err()
		case <-time.After(time.Second):
		}
	}
}

// bootFilesOffered are the boot files of the edge's ProxyDHCP replies to mac in its debug log (JSON lines).
func bootFilesOffered(log []byte, mac string) ([]string, error) {
	var out []string

	for _, line := range bytes.Split(log, []byte("\n")) {
		if !bytes.Contains(line, []byte(`"proxydhcp reply"`)) {
			continue
		}

		var rec struct {
			MAC      string `json:"mac"`
			BootFile string `json:"boot_file"`
		}

		if err := json.Unmarshal(line, &rec); err != nil {
			return nil, fmt.Errorf("edge log line %q: %w", line, err)
		}

		if strings.EqualFold(rec.MAC, mac) {
			out = append(out, rec.BootFile)
		}
	}

	return out, nil
}
