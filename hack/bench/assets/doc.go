// Package assetsbench holds the cross-component tests and benchmarks of boot-asset delivery: the controller's
// relay feeding an edge cache over a real gRPC stream (cut and resumed), /assets throughput against nginx, and
// relay throughput against raw TLS. It is test tooling: it may import both edge and controller packages.
package assetsbench
