// Package realomni builds and runs a real Omni (v1.9.3, from the Go module proxy through hack/omni) for the
// project's own tests: offline, with auth on, configured as an operator would, in a network namespace of the
// caller's or on loopback. Omni's look-ups of an image factory and a container registry go to a fake one
// (Factory) on the same address, so Omni lists Talos and Kubernetes versions and clusters can be created;
// nothing leaves the namespace.
//
// Build keeps the binaries in _out/omni/<key>, keyed by hack/omni's go.mod and go.sum and the Go version;
// Start runs one Omni per data directory; Restart continues on the same data.
package realomni
