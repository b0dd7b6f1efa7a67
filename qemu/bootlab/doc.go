// Package bootlab holds the edge boot service's lab tests: the boot service over the real uplink with the
// controller unreachable, and real QEMU firmware (SeaBIOS with its iPXE ROM, OVMF's own PXE) network-booting
// through the edge in a network namespace beside a site DHCP server (dnsmasq). It is test tooling.
package bootlab
