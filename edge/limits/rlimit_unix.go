//go:build unix

package limits

import "syscall"

// OpenFilesLimit returns the process's open-files limit (RLIMIT_NOFILE, soft), 0 when it cannot tell.
func OpenFilesLimit() int {
	var rl syscall.Rlimit
	if err := syscall.Getrlimit(syscall.RLIMIT_NOFILE, &rl); err != nil {
		return 0
	}

	return int(min(rl.Cur, 1<<31-1)) // clamped
}
