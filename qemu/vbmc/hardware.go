package vbmc

import (
	"context"
	"fmt"
	"net/http"

	"github.com/bougou/go-ipmi/pkg/types"
)

// Hardware is what a virtual BMC reports of its machine: the Redfish service's system, processors, memory, one
// drive, one Ethernet interface, manager and firmware inventory and Secure Boot state, and the IPMI FRU data's
// board and product areas.
type Hardware struct {
	Manufacturer, Model, SerialNumber string
	CPUs                              int
	CPUModel                          string
	MemoryGiB                         int
	DiskBytes                         uint64
	NICSpeedMbps                      int
	BIOSVersion                       string
	BMCFirmware                       string
	// SecureBoot is whether the machine's firmware enforces Secure Boot (its keys are enrolled either way, as
	// OVMF's Secure Boot build with the snakeoil key has them).
	SecureBoot bool
}

// Redfish paths of the inventory (DSP0268: ComputerSystem, Storage, Drive, EthernetInterface, Manager,
// UpdateService, SoftwareInventory).
const (
	storagesPath     = systemPath + "/Storage"
	storagePath      = storagesPath + "/1"
	drivePath        = storagePath + "/Drives/1"
	nicsPath         = systemPath + "/EthernetInterfaces"
	nicPath          = nicsPath + "/1"
	updatePath       = "/redfish/v1/UpdateService"
	firmwaresPath    = updatePath + "/FirmwareInventory"
	biosFirmwarePath = firmwaresPath + "/BIOS"
	bmcFirmwarePath  = firmwaresPath + "/BMC"
	secureBootPath   = systemPath + "/SecureBoot"
)

// hardwareRoot adds the inventory's links to the service root.
func (r *Redfish) hardwareRoot(root map[string]any) {
	if r.opts.Hardware == nil {
		return
	}

	root["Managers"] = map[string]string{"@odata.id": managersPath}
	root["UpdateService"] = map[string]string{"@odata.id": updatePath}
}

// hardwareSystem adds the inventory to the ComputerSystem.
func (r *Redfish) hardwareSystem(sys map[string]any) {
	h := r.opts.Hardware
	if h == nil {
		return
	}

	sys["Manufacturer"], sys["Model"], sys["SerialNumber"], sys["BiosVersion"] = h.Manufacturer, h.Model, h.SerialNumber, h.BIOSVersion
	sys["ProcessorSummary"] = map[string]any{"Count": h.CPUs, "Model": h.CPUModel}
	sys["MemorySummary"] = map[string]any{"TotalSystemMemoryGiB": h.MemoryGiB}
	sys["Storage"] = map[string]string{"@odata.id": storagesPath}
	sys["EthernetInterfaces"] = map[string]string{"@odata.id": nicsPath}
	sys["SecureBoot"] = map[string]string{"@odata.id": secureBootPath}
}

func collection(path, typ string, members ...string) map[string]any {
	links := make([]any, 0, len(members))
	for _, m := range members {
		links = append(links, map[string]string{"@odata.id": m})
	}

	return map[string]any{"@odata.id": path, "@odata.type": "#" + typ + "." + typ, "Name": typ, "Members": links, "Members@odata.count": len(links)}
}

// serveHardware answers the inventory's paths; false when path is not one of them (or there is no Hardware).
func (r *Redfish) serveHardware(w http.ResponseWriter, req *http.Request, path string) bool {
	h := r.opts.Hardware
	if h == nil || req.Method != http.MethodGet {
		return false
	}

	switch path {
	case storagesPath:
		writeJSON(w, http.StatusOK, collection(storagesPath, "StorageCollection", storagePath))
	case storagePath:
		writeJSON(w, http.StatusOK, map[string]any{
			"@odata.id": storagePath, "@odata.type": "#Storage.v1_9_0.Storage", "Id": "1", "Name": "Storage",
			"Drives": []any{map[string]string{"@odata.id": drivePath}}, "Drives@odata.count": 1,
		})
	case drivePath:
		writeJSON(w, http.StatusOK, map[string]any{
			"@odata.id": drivePath, "@odata.type": "#Drive.v1_12_0.Drive", "Id": "1", "Name": "Disk 1",
			"CapacityBytes": h.DiskBytes, "MediaType": "SSD", "Protocol": "SATA",
		})
	case nicsPath:
		writeJSON(w, http.StatusOK, collection(nicsPath, "EthernetInterfaceCollection", nicPath))
	case nicPath:
		writeJSON(w, http.StatusOK, map[string]any{
			"@odata.id": nicPath, "@odata.type": "#EthernetInterface.v1_6_0.EthernetInterface", "Id": "1", "Name": "NIC 1",
			"SpeedMbps": h.NICSpeedMbps, "LinkStatus": "LinkUp",
		})
	case managersPath:
		writeJSON(w, http.StatusOK, collection(managersPath, "ManagerCollection", managerPath))
	case managerPath:
		m := map[string]any{
			"@odata.id": managerPath, "@odata.type": "#Manager.v1_10_0.Manager", "Id": "1", "Name": "Manager",
			"ManagerType": "BMC", "FirmwareVersion": h.BMCFirmware, "Status": map[string]string{"State": "Enabled", "Health": "OK"},
			"Links": map[string]any{"ManagerForServers": []any{map[string]string{"@odata.id": systemPath}}},
		}

		if r.opts.Media != nil {
			m["VirtualMedia"] = map[string]string{"@odata.id": mediaPath}
		}

		writeJSON(w, http.StatusOK, m)
	case updatePath:
		writeJSON(w, http.StatusOK, map[string]any{
			"@odata.id": updatePath, "@odata.type": "#UpdateService.v1_8_0.UpdateService", "Id": "UpdateService",
			"Name": "Update Service", "FirmwareInventory": map[string]string{"@odata.id": firmwaresPath},
		})
	case secureBootPath:
		state := "Disabled"
		if h.SecureBoot {
			state = "Enabled"
		}

		writeJSON(w, http.StatusOK, map[string]any{
			"@odata.id": secureBootPath, "@odata.type": "#SecureBoot.v1_1_0.SecureBoot", "Id": "SecureBoot", "Name": "UEFI Secure Boot",
			"SecureBootEnable": h.SecureBoot, "SecureBootCurrentBoot": state, "SecureBootMode": "UserMode",
		})
	case firmwaresPath:
		writeJSON(w, http.StatusOK, collection(firmwaresPath, "SoftwareInventoryCollection", biosFirmwarePath, bmcFirmwarePath))
	case biosFirmwarePath, bmcFirmwarePath:
		name, version := "BIOS", h.BIOSVersion
		if path == bmcFirmwarePath {
			name, version = "BMC", h.BMCFirmware
		}

		writeJSON(w, http.StatusOK, map[string]any{
			"@odata.id": path, "@odata.type": "#SoftwareInventory.v1_4_0.SoftwareInventory", "Id": name, "Name": name, "Version": version,
		})
	default:
		return false
	}

	return true
}

// SetHardware gives the IPMI BMC FRU data (device 0, §17 of the FRU specification) with a board area
// (manufacturer, the model as product name, serial) and a product area (manufacturer, model, BIOS version as its
// version, serial).
func (i *IPMI) SetHardware(h Hardware) error {
	for _, f := range []string{h.Manufacturer, h.Model, h.SerialNumber, h.BIOSVersion} {
		if len(f) > 0x3f {
			return fmt.Errorf("fru field %q: longer than 63 bytes", f)
		}
	}

	board := (&types.FRUBoardInfoArea{
		ManufacturerTypeLength: fruASCII(h.Manufacturer), Manufacturer: []byte(h.Manufacturer),
		ProductNameTypeLength: fruASCII(h.Model), ProductName: []byte(h.Model),
		SerialNumberTypeLength: fruASCII(h.SerialNumber), SerialNumber: []byte(h.SerialNumber),
	}).Pack()
	product := (&types.FRUProductInfoArea{
		ManufacturerTypeLength: fruASCII(h.Manufacturer), Manufacturer: []byte(h.Manufacturer),
		NameTypeLength: fruASCII(h.Model), Name: []byte(h.Model),
		VersionTypeLength: fruASCII(h.BIOSVersion), Version: []byte(h.BIOSVersion),
		SerialNumberTypeLength: fruASCII(h.SerialNumber), SerialNumber: []byte(h.SerialNumber),
	}).Pack()

	header := types.FRUCommonHeader{FormatVersion: types.FRUFormatVersion, BoardOffset8B: 1, ProductOffset8B: uint8(1 + len(board)/8)}
	sum := 0

	for _, b := range header.Pack()[:7] {
		sum += int(b)
	}

	header.Checksum = uint8(-sum)
	data := append(append(header.Pack(), board...), product...)

	if err := i.hal.Storage().FRU().Write(context.Background(), 0, data); err != nil {
		return fmt.Errorf("write fru data: %w", err)
	}

	return nil
}

// fruASCII is the type/length byte of an 8-bit ASCII field of at most 63 bytes (§13.1).
func fruASCII(s string) types.TypeLength { return types.TypeLength(0xC0 | len(s)&0x3f) }
