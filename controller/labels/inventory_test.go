package labels_test

import (
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/outpost-metal/outpost/controller/labels"
)

func TestInventory(t *testing.T) {
	t.Parallel()

	for _, tc := range []struct {
		name string
		hw   labels.Hardware
		want map[string]string
	}{
		{
			name: "redfish server",
			hw: labels.Hardware{
				Source: "redfish", Vendor: "Dell Inc.", Model: "PowerEdge R640", Serial: "7XK3J72", CPUCount: 2,
				CPUModel: "Intel(R) Xeon(R) Gold 6130 CPU @ 2.10GHz", MemoryGiB: 384, DiskCount: 3,
				DiskBytes: []uint64{480 << 30, 1920 << 30, 1920 << 30}, NICSpeedsMbps: []uint32{1000, 25000, 0},
				BIOSVersion: "2.19.1", BMCFirmware: "7.00.00.171", SecureBoot: new(true),
			},
			want: map[string]string{
				"inventory-source": "redfish", "vendor": "Dell-Inc", "model": "PowerEdge-R640", "serial": "7XK3J72", "cpu-count": "2",
				"cpu-model": "Intel-R-Xeon-R-Gold-6130-CPU-2.10GHz", "memory-gib": "384", "disk-count": "3",
				"disk-largest-gib": "1920", "disk-sizes-gib": "1920_1920_480", "nic-speed-mbps": "25000",
				"bios-version": "2.19.1", "bmc-firmware": "7.00.00.171", "secure-boot": "on",
			},
		},
		{
			name: "ipmi fru",
			hw:   labels.Hardware{Source: "ipmi", Vendor: "Supermicro", Model: "SYS-1029P-WTR", Serial: "S1234"},
			want: map[string]string{"inventory-source": "ipmi", "vendor": "Supermicro", "model": "SYS-1029P-WTR", "serial": "S1234"},
		},
		{name: "nothing", want: map[string]string{}},
		{name: "secure boot off", hw: labels.Hardware{SecureBoot: new(false)}, want: map[string]string{"secure-boot": "off"}},
		{
			name: "hostile",
			hw: labels.Hardware{
				Vendor: "\x1b[31m<script>alert(1)</script>", Model: strings.Repeat("A", 500), Serial: "----", CPUModel: "  ünïcödé  ",
				BIOSVersion: "a/b=c,d!e", BMCFirmware: strings.Repeat("ab.", 40), DiskBytes: []uint64{1 << 20, 0},
			},
			want: map[string]string{
				"vendor": "31m-script-alert-1-script", "model": strings.Repeat("A", 63), "cpu-model": "n-c-d",
				"bios-version": "a-b-c-d-e", "bmc-firmware": strings.TrimSuffix(strings.Repeat("ab.", 21), "."),
			},
		},
		{
			name: "many disks cut at a whole size",
			hw:   labels.Hardware{DiskCount: 40, DiskBytes: repeat(7681<<30, 40)},
			want: map[string]string{
				"disk-count": "40", "disk-largest-gib": "7681",
				"disk-sizes-gib": strings.TrimSuffix(strings.Repeat("7681_", 12), "_"),
			},
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()

			got := labels.Inventory(tc.hw)
			require.Equal(t, tc.want, got)

			for k, v := range got {
				require.NoError(t, labels.ValidateKey(k))
				require.NoError(t, labels.ValidateValue(v))
			}
		})
	}
}

func repeat(v uint64, n int) []uint64 {
	out := make([]uint64, n)
	for i := range out {
		out[i] = v
	}

	return out
}

// FuzzValue: whatever a BMC says, Value gives a label value Omni accepts.
func FuzzValue(f *testing.F) {
	f.Add("Dell Inc.")
	f.Add("Intel(R) Xeon(R) Gold 6130 CPU @ 2.10GHz")
	f.Add(strings.Repeat("-._", 50))

	f.Fuzz(func(t *testing.T, s string) {
		require.NoError(t, labels.ValidateValue(labels.Value(s)))
	})
}
