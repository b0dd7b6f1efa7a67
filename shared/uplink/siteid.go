package uplink

import (
	"fmt"
	"regexp"
)

// siteIDPattern is an RFC 1123 DNS label: site IDs appear in certificates, resource IDs and file names.
var siteIDPattern = regexp.MustCompile(`^[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?$`)

// ValidateSiteID checks that id is a usable site ID: a lower-case DNS label of at most 63 characters.
func ValidateSiteID(id string) error {
	if !siteIDPattern.MatchString(id) {
		return fmt.Errorf("site ID %q is not a lower-case DNS label (a-z, 0-9, '-', at most 63 characters)", id)
	}

	return nil
}
