package lab

// Firmware and boot files from Debian's ovmf and ipxe packages.
const (
	OVMFCode = "/usr/share/OVMF/OVMF_CODE_4M.fd"
	OVMFVars = "/usr/share/OVMF/OVMF_VARS_4M.fd"
	IPXEDir  = "/usr/lib/ipxe"
)
