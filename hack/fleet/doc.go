// Package fleet is the fleet simulator behind `make bench-fleet`: many simulated sites in one process, each a
// real edge built by edge/app without its site network (DHCP and TFTP off), run against the real controller binary and the Omni stand-in
// (in a child process of its own, so the three CPU figures stay apart), with simulated machines and BMCs.
//
// What is real: the controller (the binary, as deployed), the stand-in's State API, SideroLink Provision and
// InfraMachine derivation, and in every site the edge as edge/app builds it: the uplink client with enrolment by join
// token and mutual TLS (edge/uplink), the persisted boot table and its service (edge/boot), the on-disk event
// journal delivered in order (edge/journal), the iPXE HTTP server answering boot.ipxe and /config from the
// table (edge/httpd, called in process), the agent tunnel endpoint and the controller-to-agent call proxy
// (edge/tunnel, on a loopback listener), the intent store (edge/intents) and the asset cache and fetcher
// (edge/assetcache, without an upstream: app.Options.Upstream). Each site's uplink dials through its WAN link
// (app.Options.Dial), from the site's own loopback address.
//
// The edges watch their BMCs when the controller hands them its watch lists, as the real edge does: edge/bmc's
// Watcher schedule (every 20 s, 32 at once) over the simulated BMCs, with every change journaled.
//
// What is simulated: the site network (no ProxyDHCP or TFTP, and the HTTP listener unused: a booting machine's
// DHCP request is journaled as the ProxyDHCP would journal it (app.Edge.Journal), and its boot script and join config are fetched from the edge's
// HTTP handler in process), the machines (a power state and a boot sequence: DHCP seen, boot.ipxe answered from
// the boot table, then in agent mode the join config from /config, SideroLink Provision with a WireGuard key and
// a JSON node-unique token, and a reverse tunnel to the edge carrying a minimal AgentService), and the BMCs: the
// edge's BMC gRPC service answered (app.Options.BMCs) by a simulated BMC per machine (serialized and rate-limited per BMC as
// edge/bmc's Manager does, with configurable latency, failure rate and dead BMCs that never answer) instead of
// edge/bmc's Manager speaking IPMI to simulated BMCs. See Config for the knobs and BMCService for why.
//
// It is test tooling: nothing in the product imports it.
package fleet
