package testagent

import (
	"fmt"
	"os"
	"strings"
)

// DMIProductUUIDPath is where Linux exposes the SMBIOS system UUID (what iPXE calls ${uuid}).
const DMIProductUUIDPath = "/sys/class/dmi/id/product_uuid"

// ReadMachineID returns the SMBIOS system UUID from path (DMIProductUUIDPath on a machine), lower case.
func ReadMachineID(path string) (string, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return "", fmt.Errorf("read smbios uuid: %w", err)
	}

	id := strings.ToLower(strings.TrimSpace(string(b)))
	if len(id) != 36 || strings.Count(id, "-") != 4 {
		return "", fmt.Errorf("read smbios uuid: %q is not a uuid", id)
	}

	return id, nil
}
