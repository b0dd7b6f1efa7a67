// Package wanbench measures boot-asset relay over a long WAN: the controller's AssetRelay feeding an edge's
// cache over the real uplink (TLS, yamux, gRPC both ways) through a userspace delay proxy (this package's
// Proxy; the lab kernel has no netem), beside raw TCP through the same proxy. `make bench-wan` runs it and
// prints one WANRELAY line per round-trip time and a WANRESUME line for a transfer cut in the middle. It is
// test tooling: it may import both edge and controller packages.
package wanbench
