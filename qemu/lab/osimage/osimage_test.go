package osimage_test

import (
	"bytes"
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/outpost-metal/outpost/qemu/lab/osimage"
)

func TestLayout(t *testing.T) {
	t.Parallel()

	img := osimage.Build("MARK")

	require.Len(t, img, osimage.Size)
	require.Equal(t, []byte{0x55, 0xAA}, img[510:512], "MBR boot signature")
	require.Equal(t, byte(0xEF), img[446+4], "partition 1 is an EFI System Partition")
	require.Contains(t, string(img[:446]), "MARK bios")

	esp := img[2048*512:]
	require.Equal(t, "FAT16   ", string(esp[54:62]))
	require.True(t, bytes.Contains(esp, []byte("BOOTX64 EFI")), "no removable-media loader in the ESP")
	require.True(t, bytes.Contains(esp, []byte("MZ")), "no PE image in the ESP")
}

// TestFirmwareBootsIt boots the image with no network under SeaBIOS and OVMF (QEMU, TCG) and waits for the
// marker on the serial console.
func TestFirmwareBootsIt(t *testing.T) {
	if testing.Short() {
		t.Skip("lab test: skipped under -short")
	}

	if _, err := exec.LookPath("qemu-system-x86_64"); err != nil {
		t.Skip("lab test: qemu-system-x86_64 not installed (make deps)")
	}

	for _, fw := range []string{"bios", "uefi"} {
		t.Run(fw, func(t *testing.T) {
			t.Parallel()

			dir := t.TempDir()
			disk := filepath.Join(dir, "disk.img")
			require.NoError(t, os.WriteFile(disk, osimage.Build("OUTPOST-TEST"), 0o644))

			serial := filepath.Join(dir, "serial.log")
			args := []string{"-m", "256", "-nodefaults", "-display", "none", "-serial", "file:" + serial, "-no-reboot", "-net", "none",
				"-drive", "file=" + disk + ",format=raw,if=none,id=d0", "-device", "virtio-blk-pci,drive=d0,bootindex=1"}

			if fw == "uefi" {
				code, vars := "/usr/share/OVMF/OVMF_CODE_4M.fd", filepath.Join(dir, "vars.fd")
				b, err := os.ReadFile("/usr/share/OVMF/OVMF_VARS_4M.fd")
				if err != nil {
					t.Skip("lab test: OVMF not installed (make deps)")
				}

				require.NoError(t, os.WriteFile(vars, b, 0o644))
				args = append(args, "-machine", "q35,accel=tcg", "-drive", "if=pflash,format=raw,readonly=on,file="+code,
					"-drive", "if=pflash,format=raw,file="+vars)
			} else {
				args = append(args, "-machine", "pc,accel=tcg")
			}

			ctx, cancel := context.WithTimeout(t.Context(), 2*time.Minute)
			defer cancel()

			cmd := exec.CommandContext(ctx, "qemu-system-x86_64", args...)
			require.NoError(t, cmd.Start())

			t.Cleanup(func() { cmd.Process.Kill(); cmd.Wait() }) //nolint:errcheck

			want := "OUTPOST-TEST " + fw

			require.Eventually(t, func() bool {
				b, _ := os.ReadFile(serial) //nolint:errcheck

				return bytes.Contains(b, []byte(want))
			}, 2*time.Minute, 200*time.Millisecond, "no %q on the serial console", want)
		})
	}
}
