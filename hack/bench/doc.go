// Package bench holds benchmarks that need a whole topology (network namespaces, peer servers from Debian):
// `make bench` runs them beside the unit benchmarks. They skip, saying why, without root or the peers.
package bench
