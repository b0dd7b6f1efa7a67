package labels

import (
	"cmp"
	"slices"
	"strconv"
	"strings"
)

// Inventory label keys: a machine's hardware as its BMC reports it (see Inventory). A key is absent when the BMC
// does not say (IPMI BMCs have only what their FRU data holds: vendor, model, serial).
const (
	// Vendor is the system's manufacturer ("Dell-Inc").
	Vendor = "vendor"
	// Model is the system's model ("PowerEdge-R640").
	Model = "model"
	// Serial is the system's serial number.
	Serial = "serial"
	// CPUCount is the number of processors (sockets, as the BMC counts them).
	CPUCount = "cpu-count"
	// CPUModel is the processors' model.
	CPUModel = "cpu-model"
	// MemoryGiB is the total system memory in GiB.
	MemoryGiB = "memory-gib"
	// DiskCount is the number of drives.
	DiskCount = "disk-count"
	// DiskLargestGiB is the capacity of the largest drive in GiB.
	DiskLargestGiB = "disk-largest-gib"
	// DiskSizesGiB are the drives' capacities in GiB, largest first, joined by "_" ("1788_447_447"; cut at a
	// whole size to fit 63 characters).
	DiskSizesGiB = "disk-sizes-gib"
	// NICSpeedMbps is the fastest network interface's link speed in Mbit/s.
	NICSpeedMbps = "nic-speed-mbps"
	// BIOSVersion is the system firmware's version.
	BIOSVersion = "bios-version"
	// BMCFirmware is the BMC's own firmware version.
	BMCFirmware = "bmc-firmware"
	// InventorySource is the protocol the inventory was read over: "redfish" or "ipmi".
	InventorySource = "inventory-source"
	// SecureBoot is whether the firmware enforces Secure Boot from its next boot on: "on" or "off".
	SecureBoot = "secure-boot"
)

// Hardware is a machine's inventory as the labels take it.
type Hardware struct {
	Source                   string
	Vendor, Model, Serial    string
	CPUCount                 uint32
	CPUModel                 string
	MemoryGiB                uint32
	DiskCount                uint32
	DiskBytes                []uint64
	NICSpeedsMbps            []uint32
	BIOSVersion, BMCFirmware string
	// SecureBoot is nil when the BMC does not say.
	SecureBoot *bool
}

// maxValue is the longest label value Omni accepts.
const maxValue = 63

// Inventory returns the inventory labels of h: every value a valid label value (Value), empty and zero facts
// left out.
func Inventory(h Hardware) map[string]string {
	out := map[string]string{}

	put := func(k, v string) {
		if v = Value(v); v != "" {
			out[k] = v
		}
	}

	num := func(k string, n uint64) {
		if n > 0 {
			out[k] = strconv.FormatUint(n, 10)
		}
	}

	put(InventorySource, h.Source)
	put(Vendor, h.Vendor)
	put(Model, h.Model)
	put(Serial, h.Serial)
	num(CPUCount, uint64(h.CPUCount))
	put(CPUModel, h.CPUModel)
	num(MemoryGiB, uint64(h.MemoryGiB))
	num(DiskCount, uint64(h.DiskCount))
	put(BIOSVersion, h.BIOSVersion)
	put(BMCFirmware, h.BMCFirmware)

	if h.SecureBoot != nil {
		out[SecureBoot] = map[bool]string{true: "on", false: "off"}[*h.SecureBoot]
	}

	if len(h.NICSpeedsMbps) > 0 {
		num(NICSpeedMbps, uint64(slices.Max(h.NICSpeedsMbps)))
	}

	var sizes []uint64

	for _, b := range h.DiskBytes {
		if gib := b >> 30; gib > 0 {
			sizes = append(sizes, gib)
		}
	}

	if len(sizes) > 0 {
		slices.SortFunc(sizes, func(a, b uint64) int { return cmp.Compare(b, a) })
		num(DiskLargestGiB, sizes[0])

		joined := ""

		for _, s := range sizes {
			next := strconv.FormatUint(s, 10)
			if joined != "" {
				next = joined + "_" + next
			}

			if len(next) > maxValue {
				break
			}

			joined = next
		}

		put(DiskSizesGiB, joined)
	}

	return out
}

// Value turns what a BMC says into a valid label value: every run of characters other than a-z, A-Z, 0-9, '-',
// '_' and '.' becomes one '-', the value is cut to 63 characters and starts and ends alphanumeric ("Intel(R)
// Xeon(R) Gold 6130 CPU @ 2.10GHz" is "Intel-R-Xeon-R-Gold-6130-CPU-2.10GHz"). Nothing usable gives "".
func Value(s string) string {
	var b strings.Builder

	dash := false

	for _, r := range s {
		if b.Len() > 4*maxValue {
			break // enough to cut from
		}

		switch {
		case r < 0x80 && (r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' || r == '-' || r == '_' || r == '.'):
			b.WriteRune(r)

			dash = false
		case !dash:
			b.WriteByte('-')

			dash = true
		}
	}

	v := strings.TrimFunc(b.String(), notAlnum)
	if len(v) > maxValue {
		v = strings.TrimRightFunc(v[:maxValue], notAlnum)
	}

	return v
}

func notAlnum(r rune) bool {
	return (r < 'a' || r > 'z') && (r < 'A' || r > 'Z') && (r < '0' || r > '9')
}
