// Package ocinames is the naming contract between the controller, which relays the content of OCI images
// (Talos installers) to edges as boot assets, and the edge's registry (edge/registry), which serves them: the
// logical asset name of a manifest by tag and of a blob or child manifest by digest. Both sides call the
// functions here, so the names cannot drift apart.
//
// Every name built from a repository, tag and digest that pass ValidateRepository, ValidateTag and
// ValidateHex is a valid logical asset name of the edge's cache (slash-separated segments matching
// ^[A-Za-z0-9_][A-Za-z0-9._+-]*$, at most MaxNameLen characters).
package ocinames

import (
	"errors"
	"fmt"
	"regexp"
	"strings"
)

// Prefix starts every logical name of OCI content.
const Prefix = "oci/"

// Name length bounds. MaxNameLen is the edge cache's bound on logical names; the repository and tag bounds
// are chosen so that any valid repository with any valid tag or digest fits under it:
// len("oci/") + 113 + len("/manifests/") + 128 = 256, and len("oci/") + 113 + len("/blobs/") + 64 < 256.
const (
	MaxNameLen       = 256
	MaxRepositoryLen = 113
	// MaxTagLen is the distribution spec's bound on tags.
	MaxTagLen = 128
)

// Errors callers branch on.
var (
	// ErrBadRepository reports a repository name outside the distribution spec's grammar or too long.
	ErrBadRepository = errors.New("invalid repository name")
	// ErrBadTag reports a tag outside the distribution spec's grammar.
	ErrBadTag = errors.New("invalid tag")
	// ErrBadDigest reports a digest that is not 64 lower-case hex characters.
	ErrBadDigest = errors.New("invalid sha256 digest")
)

// Grammars of the OCI distribution spec (v1.1, "Pulling manifests"): a repository is path components of lower
// case letters and digits separated by '.', '_', "__" or runs of '-'; a tag is at most 128 letters, digits,
// '_', '.' and '-', not starting with '.' or '-'.
var (
	componentRe = regexp.MustCompile(`^[a-z0-9]+(?:(?:\.|_|__|-+)[a-z0-9]+)*$`)
	tagRe       = regexp.MustCompile(`^[a-zA-Z0-9_][a-zA-Z0-9._-]{0,127}$`)
)

// ValidateRepository checks a repository name as in the original registry without its host
// ("siderolabs/installer", "installer/<schematic id>"): the spec's grammar and at most MaxRepositoryLen
// characters.
func ValidateRepository(repo string) error {
	if repo == "" || len(repo) > MaxRepositoryLen {
		return fmt.Errorf("%w: %q: length must be 1-%d", ErrBadRepository, repo, MaxRepositoryLen)
	}

	for c := range strings.SplitSeq(repo, "/") {
		if !componentRe.MatchString(c) {
			return fmt.Errorf("%w: %q: component %q", ErrBadRepository, repo, c)
		}
	}

	return nil
}

// ValidateTag checks a tag against the spec's grammar (at most MaxTagLen characters).
func ValidateTag(tag string) error {
	if !tagRe.MatchString(tag) {
		return fmt.Errorf("%w: %q", ErrBadTag, tag)
	}

	return nil
}

// ValidateHex checks the hex part of a sha256 digest: 64 lower-case hex characters.
func ValidateHex(hex string) error {
	if len(hex) != 64 {
		return fmt.Errorf("%w: %q", ErrBadDigest, hex)
	}

	for i := range len(hex) {
		if c := hex[i]; (c < '0' || c > '9') && (c < 'a' || c > 'f') {
			return fmt.Errorf("%w: %q", ErrBadDigest, hex)
		}
	}

	return nil
}

// ParseDigest returns the hex of a "sha256:<hex>" digest; other algorithms and malformed digests are
// ErrBadDigest.
func ParseDigest(digest string) (string, error) {
	hex, ok := strings.CutPrefix(digest, "sha256:")
	if !ok {
		return "", fmt.Errorf("%w: %q: only sha256 is supported", ErrBadDigest, digest)
	}

	if err := ValidateHex(hex); err != nil {
		return "", err
	}

	return hex, nil
}

// ManifestName is the logical name of the manifest or index tagged tag in repo: "oci/<repo>/manifests/<tag>",
// pointing at the digest of the manifest's bytes. repo and tag must be valid (ValidateRepository,
// ValidateTag).
func ManifestName(repo, tag string) string {
	return Prefix + repo + "/manifests/" + tag
}

// BlobName is the logical name of a blob (a config or layer) or a child manifest of an index in repo, by the
// lower-case hex of its SHA-256: "oci/<repo>/blobs/<hex>", pointing at that same digest. repo and hex must
// be valid (ValidateRepository, ValidateHex).
func BlobName(repo, hex string) string {
	return Prefix + repo + "/blobs/" + hex
}

// TagOf returns the tag a logical name gives to a manifest of repo, if it is ManifestName(repo, tag) for a
// valid tag.
func TagOf(repo, name string) (string, bool) {
	tag, ok := strings.CutPrefix(name, ManifestName(repo, ""))
	if !ok || ValidateTag(tag) != nil {
		return "", false
	}

	return tag, true
}
