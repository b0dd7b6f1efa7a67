package lab

import (
	"sync"

	"github.com/outpost-metal/outpost/qemu/bootlab"
)

// Firmware from Debian's ovmf package: OVMF, and its Secure Boot build with variables that enroll the snakeoil
// key shipped beside it (encrypted with the passphrase "snakeoil"), with which the lab signs its images.
const (
	OVMFCode           = "/usr/share/OVMF/OVMF_CODE_4M.fd"
	OVMFVars           = "/usr/share/OVMF/OVMF_VARS_4M.fd"
	OVMFSecureBootCode = "/usr/share/OVMF/OVMF_CODE_4M.secboot.fd"
	OVMFSnakeoilVars   = "/usr/share/OVMF/OVMF_VARS_4M.snakeoil.fd"
	SnakeoilKey        = "/usr/share/ovmf/PkKek-1-snakeoil.key"
	SnakeoilCert       = "/usr/share/ovmf/PkKek-1-snakeoil.pem"
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
