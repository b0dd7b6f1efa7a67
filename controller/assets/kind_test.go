package assets_test

import (
	"bytes"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/outpost-metal/outpost/controller/assets"
)

// FuzzKindCheck: the first bytes of whatever the factory (or anything pretending to be it) answers are
// checked against the asset's kind before the asset is held. Any bytes: no panic, and a verdict that follows
// the documented magic numbers.
func FuzzKindCheck(f *testing.F) {
	f.Add([]byte("MZ\x90\x00"))
	f.Add([]byte("\xfd7zXZ\x00\x00"))
	f.Add([]byte("<!doctype html><title>502</title>"))
	f.Add(bytes.Repeat([]byte{0}, 0x240))

	kernel := assets.KindCheck(assets.InstallAssetName("v1.11.5", "abc", "amd64", "kernel"))
	initrd := assets.KindCheck(assets.InstallAssetName("v1.11.5", "abc", "amd64", "initramfs.xz"))
	signed := assets.KindCheck(assets.InstallAssetName("v1.11.5", "abc", "amd64", assets.SignedKind))

	f.Fuzz(func(t *testing.T, b []byte) {
		isKernel := bytes.HasPrefix(b, []byte("MZ")) ||
			(len(b) >= 0x206 && string(b[0x202:0x206]) == "HdrS") ||
			(len(b) >= 0x3c && string(b[0x38:0x3c]) == "ARM\x64")
		require.Equal(t, isKernel, kernel(b) == nil, "kernel verdict on %q", b[:min(len(b), 16)])

		isInitrd := false
		for _, m := range []string{"\xfd7zXZ\x00", "\x1f\x8b", "\x28\xb5\x2f\xfd", "070701", "070702"} {
			isInitrd = isInitrd || bytes.HasPrefix(b, []byte(m))
		}

		require.Equal(t, isInitrd, initrd(b) == nil, "initramfs verdict on %q", b[:min(len(b), 16)])
		require.Equal(t, bytes.HasPrefix(b, []byte("MZ")), signed(b) == nil, "signed image verdict on %q", b[:min(len(b), 16)])
	})
}
