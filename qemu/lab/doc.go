// Package lab is the emulation lab of the end-to-end test and `make demo`: a core network namespace for the
// controller and Omni (a real Omni v1.9.3 through qemu/realomni, or the stand-in), site namespaces (a bridge,
// the site's own DHCP server, an edge, and a veth WAN link to the core that can be cut), and QEMU machines
// under TCG, each with a disk, a fixed SMBIOS UUID and a virtual BMC whose chassis starts, stops and resets
// the QEMU process. Every process it starts is supervised with its log under the lab directory, and Close
// removes every namespace, tap and process it created, also after a failure. It is test tooling: nothing in
// the product imports it.
package lab
