package bootlab_test

import (
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/outpost-metal/outpost/qemu/bootlab"
)

// TestFirmwareMatrix boots one machine per firmware through the edge to agent mode (cells named
// <firmware>/<step>) and logs each cell's power-on to agent time, beside the bare-dnsmasq peer's (the same
// machine, kernel and initramfs booted by dnsmasq + static files, no edge) where that peer can boot the
// firmware:
//   - SeaBIOS: the NIC's iPXE ROM, ProxyDHCP, the script;
//   - OVMF-PXE: OVMF's PXE, ipxe.efi over TFTP, then as above;
//   - OVMF-HTTPBoot: OVMF's UEFI HTTP boot only (its PXE knobs off) at a site whose edge serves no TFTP: the edge
//     answers vendor class HTTPClient with http://<edge>/tftp/ipxe.efi, every fetch is HTTP from the edge;
//   - OVMF-SecureBoot: secureBootCase (a signed UKI only; the firmware refuses an unsigned one).
func TestFirmwareMatrix(t *testing.T) {
	var (
		mu    sync.Mutex
		table []string
	)

	t.Cleanup(func() {
		if len(table) > 0 {
			t.Logf("power-on to agent (TCG):\n%s", strings.Join(table, "\n"))
		}
	})

	for _, cell := range []struct {
		firmware string
		bc       func(t *testing.T) bootCase
		bare     bool
	}{
		{"SeaBIOS", func(*testing.T) bootCase { return bootCase{firmware: "seabios", timeout: 3 * time.Minute} }, true},
		{"OVMF-PXE", func(*testing.T) bootCase { return bootCase{firmware: "ovmf", timeout: 5 * time.Minute} }, true},
		{"OVMF-HTTPBoot", func(*testing.T) bootCase { return httpBootCase() }, true},
		{"OVMF-SecureBoot", secureBootCase, false},
	} {
		t.Run(cell.firmware+"/agent", func(t *testing.T) {
			edge := netboot(t, cell.bc(t))
			line := fmt.Sprintf("%-16s agent  edge %6s", cell.firmware, edge)

			if cell.bare && !t.Failed() {
				bc := cell.bc(t)
				bc.bare = true
				line += fmt.Sprintf("  bare dnsmasq %6s", netboot(t, bc))
			}

			mu.Lock()
			table = append(table, line)
			mu.Unlock()
		})
	}
}

// httpBootCase boots a UEFI machine by UEFI HTTP boot at a site whose edge serves no TFTP: OVMF's PXE is off
// (its fw_cfg knobs), its HTTP boot client asks with vendor class HTTPClient (option 93 = 16), the edge's
// ProxyDHCP answers with HTTPClient and http://<edge>/tftp/ipxe.efi, the firmware fetches iPXE over HTTP from
// the edge, and iPXE continues to agent mode as over PXE. The site's DHCP server gives the address only.
func httpBootCase() bootCase {
	return bootCase{
		firmware: "ovmf-http", edgeArgs: []string{"-no-tftp"}, timeout: 5 * time.Minute, noTFTP: true,
		logHas: [][]string{
			{`"msg":"proxydhcp reply"`, `"firmware":"http-x86"`, `http://` + bootlab.EdgeIP + `/tftp/ipxe.efi`},
			{`"msg":"http"`, `"uri":"/tftp/ipxe.efi"`},
		},
	}
}
