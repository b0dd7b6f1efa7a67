package vmedia_test

import (
	"bytes"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/outpost-metal/outpost/edge/vmedia"
)

func TestBootConfigQuotesEachArgument(t *testing.T) {
	cfg, err := vmedia.BootConfig([]string{"console=ttyS0", "talos.config=http://10.0.0.1/config?u=${uuid}", "ip=10.0.0.5::10.0.0.1:255.255.255.0::::off"})
	if err != nil {
		t.Fatal(err)
	}

	want := "linux /outpost/vmlinuz 'console=ttyS0' 'talos.config=http://10.0.0.1/config?u=${uuid}' 'ip=10.0.0.5::10.0.0.1:255.255.255.0::::off'\n"
	if !strings.Contains(cfg, want) {
		t.Fatalf("config lacks %q:\n%s", want, cfg)
	}
}

func TestBootConfigRefusesWhatBreaksOut(t *testing.T) {
	for _, arg := range []string{"a'b", `a\b`, "a\nboot", "", "x\x7f"} {
		if _, err := vmedia.BootConfig([]string{arg}); !errors.Is(err, vmedia.ErrUnsafeArg) {
			t.Errorf("%q: got %v, want ErrUnsafeArg", arg, err)
		}
	}

	if _, err := vmedia.BootConfig([]string{strings.Repeat("a", vmedia.MaxCmdline)}); !errors.Is(err, vmedia.ErrArgsTooLong) {
		t.Errorf("long command line: got %v, want ErrArgsTooLong", err)
	}
}

// TestImageAsXorrisoSeesIt builds an image and reads it with Debian's xorriso, a tool the project did not
// write: one UEFI El Torito entry, and the kernel, initramfs and boot configuration on the ISO 9660 side.
func TestImageAsXorrisoSeesIt(t *testing.T) {
	xorriso, err := exec.LookPath("xorriso")
	if err != nil {
		t.Skip("xorriso missing (Debian xorriso; hack/deps.sh installs it)")
	}

	dir := t.TempDir()
	loader := filepath.Join(dir, "BOOTX64.EFI")

	if err := os.WriteFile(loader, append([]byte("MZ"), bytes.Repeat([]byte{0x90}, 100_000)...), 0o644); err != nil {
		t.Fatal(err)
	}

	kernel := bytes.Repeat([]byte("kernel"), 300_000)
	out := filepath.Join(dir, "image.iso")

	if err := vmedia.Build(loader, vmedia.Contents{
		Kernel: bytes.NewReader(kernel), Initrd: strings.NewReader("initrd"), Args: []string{"console=ttyS0", "ip=10.9.0.7::10.9.0.1:255.255.255.0::::off"},
	}, out, dir); err != nil {
		t.Fatal(err)
	}

	report, err := exec.Command(xorriso, "-indev", out, "-report_el_torito", "plain", "-find", "/", "-type", "f").CombinedOutput()
	if err != nil {
		t.Fatalf("xorriso: %v\n%s", err, report)
	}

	for _, want := range []string{"El Torito boot img :   1  UEFI", "'/outpost/vmlinuz'", "'/outpost/initrd'", "'/outpost/boot.cfg'", "'/EFIBOOT.IMG'"} {
		if !strings.Contains(string(report), want) {
			t.Errorf("xorriso's report lacks %q:\n%s", want, report)
		}
	}

	cfg, err := exec.Command(xorriso, "-indev", out, "-osirrox", "on", "-extract", "/outpost/boot.cfg", filepath.Join(dir, "boot.cfg")).CombinedOutput()
	if err != nil {
		t.Fatalf("xorriso extract: %v\n%s", err, cfg)
	}

	got, err := os.ReadFile(filepath.Join(dir, "boot.cfg"))
	if err != nil || !strings.Contains(string(got), "'ip=10.9.0.7::10.9.0.1:255.255.255.0::::off'") {
		t.Fatalf("boot.cfg as xorriso extracts it: %q (%v)", got, err)
	}

	if _, err := exec.Command(xorriso, "-indev", out, "-osirrox", "on", "-extract", "/outpost/vmlinuz", filepath.Join(dir, "vmlinuz")).CombinedOutput(); err != nil {
		t.Fatal(err)
	}

	if back, err := os.ReadFile(filepath.Join(dir, "vmlinuz")); err != nil || !bytes.Equal(back, kernel) {
		t.Fatalf("kernel extracted differs: %d bytes vs %d (%v)", len(back), len(kernel), err)
	}
}
