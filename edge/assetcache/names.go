// Package assetcache is the edge's boot-asset cache: content-addressed files (SHA-256) under the state
// directory with a manifest of logical names, filled by verified downloads (image factory or relay from
// the controller) or by import from a directory or tarball, bounded by a size cap with least-recently-used
// eviction that never removes what a current boot plan needs. Handler owns /assets/ on the edge: the cache
// first, then plain files an operator placed in a files directory, with Range, HEAD, ETag and sendfile.
package assetcache

import (
	"encoding/hex"
	"errors"
	"fmt"
	"regexp"
	"strings"
)

// Asset kinds: a boot profile's kernel and initramfs (its command line is in the boot plan, not an asset).
const (
	KindKernel    = "kernel"
	KindInitramfs = "initramfs"
)

// maxNameLen bounds logical names (they appear in URLs and in the manifest).
const maxNameLen = 256

// segmentRe is one path segment of a logical name: no leading dot, no separators, no spaces.
var segmentRe = regexp.MustCompile(`^[A-Za-z0-9_][A-Za-z0-9._+-]*$`)

// ErrBadName reports a logical name that is not acceptable (traversal, odd characters, too long).
var ErrBadName = errors.New("invalid asset name")

// ErrBadDigest reports a digest that is not 64 lower-case hex characters.
var ErrBadDigest = errors.New("invalid sha256 digest")

// ValidateName checks a logical asset name: slash-separated segments of letters, digits, '.', '_', '+', '-',
// none empty, none starting with '.', so "..", absolute paths and backslashes are all refused.
func ValidateName(name string) error {
	if name == "" || len(name) > maxNameLen {
		return fmt.Errorf("%w: %q: length must be 1-%d", ErrBadName, name, maxNameLen)
	}

	for seg := range strings.SplitSeq(name, "/") {
		if !segmentRe.MatchString(seg) {
			return fmt.Errorf("%w: %q: segment %q", ErrBadName, name, seg)
		}
	}

	return nil
}

// ValidateDigest checks a lower-case hex SHA-256 digest.
func ValidateDigest(digest string) error {
	if len(digest) != 64 || strings.ToLower(digest) != digest {
		return fmt.Errorf("%w: %q", ErrBadDigest, digest)
	}

	if _, err := hex.DecodeString(digest); err != nil {
		return fmt.Errorf("%w: %q", ErrBadDigest, digest)
	}

	return nil
}

// AgentName is the logical name of an agent-mode boot asset for an architecture ("amd64", "arm64").
func AgentName(arch, kind string) string {
	return "agent/" + arch + "/" + kind
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
