package machined

import (
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"

	"github.com/siderolabs/talos/pkg/machinery/resources/block"
	"github.com/siderolabs/talos/pkg/machinery/resources/hardware"
)

// ReadSystemInformation builds the SystemInformation resource from SMBIOS as the kernel exposes it under
// <sysRoot>/class/dmi/id (product_uuid is required; the other fields are read when present).
func ReadSystemInformation(sysRoot string) (*hardware.SystemInformation, error) {
	dir := filepath.Join(sysRoot, "class", "dmi", "id")

	uuid, err := readTrim(filepath.Join(dir, "product_uuid"))
	if err != nil {
		return nil, fmt.Errorf("read smbios uuid: %w", err)
	}

	if uuid == "" {
		return nil, errors.New("read smbios uuid: empty")
	}

	opt := func(name string) string {
		v, _ := readTrim(filepath.Join(dir, name)) //nolint:errcheck // optional fields

		return v
	}

	r := hardware.NewSystemInformation(hardware.SystemInformationID)
	*r.TypedSpec() = hardware.SystemInformationSpec{
		Manufacturer: opt("sys_vendor"),
		ProductName:  opt("product_name"),
		Version:      opt("product_version"),
		BIOSVersion:  opt("bios_version"),
		SerialNumber: opt("product_serial"),
		UUID:         strings.ToLower(uuid),
		SKUNumber:    opt("product_sku"),
	}

	return r, nil
}

// Disk is a whole disk found under /sys/block.
type Disk struct {
	// Name is the kernel's name (vda), the Disk resource's ID and what BlockDeviceWipe names.
	Name    string
	DevPath string
	Size    uint64
	// SectorSize is the logical block size, IOSize the minimum I/O size.
	SectorSize, IOSize uint
	Readonly, CDROM    bool
	Rotational         bool
	Model, Serial      string
	Transport          string
}

// Resource is the disk as Talos's block.Disk.
func (d Disk) Resource() *block.Disk {
	r := block.NewDisk(block.NamespaceName, d.Name)
	*r.TypedSpec() = block.DiskSpec{
		DevPath: d.DevPath, Size: d.Size, PrettySize: prettySize(d.Size), IOSize: d.IOSize, SectorSize: d.SectorSize,
		Readonly: d.Readonly, CDROM: d.CDROM, Model: d.Model, Serial: d.Serial, Transport: d.Transport, Rotational: d.Rotational,
	}

	return r
}

// virtualPrefixes are block devices that are not hardware disks (Talos lists no Disk for them either).
var virtualPrefixes = []string{"loop", "ram", "zram", "dm-", "md", "nbd", "nullb"}

// ReadDisks lists the whole disks under <sysRoot>/block (entries backed by a device; virtual ones skipped),
// sorted by name, with their device nodes under devDir.
func ReadDisks(sysRoot, devDir string) ([]Disk, error) {
	dir := filepath.Join(sysRoot, "block")

	entries, err := os.ReadDir(dir)
	if err != nil {
		return nil, fmt.Errorf("list block devices: %w", err)
	}

	var disks []Disk

	for _, e := range entries {
		name := e.Name()
		if virtual(name) {
			continue
		}

		base := filepath.Join(dir, name)

		if _, err := os.Stat(filepath.Join(base, "device")); err != nil {
			continue // not backed by hardware
		}

		sectors, err := readUint(filepath.Join(base, "size"))
		if err != nil {
			return nil, fmt.Errorf("block device %s: %w", name, err)
		}

		d := Disk{
			Name: name, DevPath: filepath.Join(devDir, name), Size: sectors * 512,
			SectorSize: uint(readUintOr(filepath.Join(base, "queue", "logical_block_size"), 512)),
			IOSize:     uint(readUintOr(filepath.Join(base, "queue", "minimum_io_size"), 512)),
			Readonly:   readUintOr(filepath.Join(base, "ro"), 0) == 1,
			Rotational: readUintOr(filepath.Join(base, "queue", "rotational"), 0) == 1,
			CDROM:      strings.HasPrefix(name, "sr"),
			Transport:  transport(name),
		}

		d.Model, _ = readTrim(filepath.Join(base, "device", "model")) //nolint:errcheck // optional
		d.Serial, _ = readTrim(filepath.Join(base, "serial"))         //nolint:errcheck // optional (virtio)

		disks = append(disks, d)
	}

	sort.Slice(disks, func(i, j int) bool { return disks[i].Name < disks[j].Name })

	return disks, nil
}

func virtual(name string) bool {
	for _, p := range virtualPrefixes {
		if strings.HasPrefix(name, p) {
			return true
		}
	}

	return false
}

// transport is what Talos reports for the kinds of disk a lab guest has.
func transport(name string) string {
	switch {
	case strings.HasPrefix(name, "vd"):
		return "virtio"
	case strings.HasPrefix(name, "nvme"):
		return "nvme"
	case strings.HasPrefix(name, "sd"), strings.HasPrefix(name, "sr"):
		return "scsi"
	default:
		return ""
	}
}

// maxSysfsValue bounds what is read from one sysfs attribute.
const maxSysfsValue = 4096

func readTrim(path string) (string, error) {
	f, err := os.Open(path)
	if err != nil {
		return "", err
	}
	defer f.Close() //nolint:errcheck

	b, err := io.ReadAll(io.LimitReader(f, maxSysfsValue))
	if err != nil {
		return "", err
	}

	return strings.TrimSpace(string(b)), nil
}

// prettySize is a size in binary units with one decimal, as Talos shows it ("64 MiB", "1.5 GiB").
func prettySize(n uint64) string {
	units := []string{"B", "KiB", "MiB", "GiB", "TiB", "PiB", "EiB"}
	v, i := float64(n), 0

	for v >= 1024 && i < len(units)-1 {
		v /= 1024
		i++
	}

	return strings.Replace(strconv.FormatFloat(v, 'f', 1, 64), ".0", "", 1) + " " + units[i]
}

func readUint(path string) (uint64, error) {
	s, err := readTrim(path)
	if err != nil {
		return 0, err
	}

	v, err := strconv.ParseUint(s, 10, 64)
	if err != nil {
		return 0, fmt.Errorf("parse %s: %w", filepath.Base(path), err)
	}

	return v, nil
}

func readUintOr(path string, def uint64) uint64 {
	v, err := readUint(path)
	if err != nil {
		return def
	}

	return v
}
