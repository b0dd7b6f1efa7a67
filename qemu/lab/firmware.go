package lab

import (
	"sync"

	"github.com/outpost-metal/outpost/qemu/bootlab"
)

// Firmware from Debian's ovmf package.
const (
	OVMFCode = "/usr/share/OVMF/OVMF_CODE_4M.fd"
	OVMFVars = "/usr/share/OVMF/OVMF_VARS_4M.fd"
)

// IPXEDir is the directory of the iPXE binaries the lab's edges and bare peers serve: Debian's iPXE for every
// firmware, as hack/ipxe.sh lays it out under the repository above the working directory (the same files the
// appliance ships). It is looked up once per process.
var IPXEDir = sync.OnceValues(func() (string, error) {
	root, err := bootlab.FindRepoRoot()
	if err != nil {
		return "", err
	}

	return bootlab.IPXE(root)
})
