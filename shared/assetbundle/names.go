package assetbundle

import (
	"encoding/hex"
	"errors"
	"fmt"
	"regexp"
	"strings"
)

// MaxNameLen bounds logical names (they appear in URLs and in the manifest).
const MaxNameLen = 256

// segmentRe is one path segment of a logical name: no leading dot, no separators, no spaces.
var segmentRe = regexp.MustCompile(`^[A-Za-z0-9_][A-Za-z0-9._+-]*$`)

// ErrBadName reports a logical name that is not acceptable (traversal, odd characters, too long).
var ErrBadName = errors.New("invalid asset name")

// ErrBadDigest reports a digest that is not 64 lower-case hex characters.
var ErrBadDigest = errors.New("invalid sha256 digest")

// ValidateName checks a logical asset name: slash-separated segments of letters, digits, '.', '_', '+', '-',
// none empty, none starting with '.', so "..", absolute paths and backslashes are all refused.
func ValidateName(name string) error {
	if name == "" || len(name) > MaxNameLen {
		return fmt.Errorf("%w: %q: length must be 1-%d", ErrBadName, name, MaxNameLen)
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
