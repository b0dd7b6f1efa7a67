//go:build !unix

package limits

// OpenFilesLimit returns 0: the open-files limit is not known on this system.
func OpenFilesLimit() int { return 0 }
