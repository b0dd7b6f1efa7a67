// Package assetcache is the edge's boot-asset cache: content-addressed files (SHA-256) under the state
// directory with a manifest of logical names, filled by verified downloads (image factory or relay from
// the controller) or by import from a directory or tarball, bounded by a size cap with least-recently-used
// eviction that never removes what a current boot plan needs. Handler owns /assets/ on the edge: the cache
// first, then plain files an operator placed in a files directory, with Range, HEAD, ETag and sendfile.
package assetcache

import (
	"fmt"

	"github.com/outpost-metal/outpost/shared/assetbundle"
	"github.com/outpost-metal/outpost/shared/metal"
)

// Asset kinds: a boot profile's kernel and initramfs (its command line is in the boot plan, not an asset).
const (
	KindKernel    = "kernel"
	KindInitramfs = "initramfs"
)

// ErrBadName reports a logical name that is not acceptable (traversal, odd characters, too long).
var ErrBadName = assetbundle.ErrBadName

// ErrBadDigest reports a digest that is not 64 lower-case hex characters.
var ErrBadDigest = assetbundle.ErrBadDigest

// ValidateName checks a logical asset name (assetbundle.ValidateName: the names bundles and the cache share).
func ValidateName(name string) error { return assetbundle.ValidateName(name) }

// ValidateDigest checks a lower-case hex SHA-256 digest.
func ValidateDigest(digest string) error { return assetbundle.ValidateDigest(digest) }

// AgentName is the logical name of the agent-mode boot file (vmlinuz, initramfs.xz) for an architecture, as
// the edge's boot scripts ask for it: under iPXE's name for the architecture (agent/x86_64/vmlinuz).
func AgentName(arch metal.Arch, file string) string {
	return "agent/" + arch.IPXE() + "/" + file
}

// Ref identifies one asset: its logical name, digest and size, and where it may be fetched from.
type Ref struct {
	Name   string
	SHA256 string
	Size   int64
	URLs   []string
}

// Validate checks a reference's name, digest and size.
func (r Ref) Validate() error {
	if err := ValidateName(r.Name); err != nil {
		return err
	}

	if err := ValidateDigest(r.SHA256); err != nil {
		return fmt.Errorf("asset %s: %w", r.Name, err)
	}

	if r.Size < 0 {
		return fmt.Errorf("asset %s: negative size %d", r.Name, r.Size)
	}

	return nil
}
