package machined

import (
	"context"
	"fmt"
	"io"
	"os"
	"unsafe"

	"golang.org/x/sys/unix"
)

// fastWipeRange is how much of each end of a device a fast wipe zeroes (go-blockdevice's FastWipeRange):
// where partition tables, their backups and filesystem superblocks live.
const fastWipeRange = 1 << 20

// Wipe wipes the block device (or, in tests, regular file) at path: zeroes, every byte; otherwise a fast
// wipe, a discard of the whole device (its error ignored: discard may be unsupported, and it may not zero)
// and then the first and last MiB zeroed. Each range is zeroed the first way that works, in Talos's order:
// secure discard, discard where it reads back zeroes, BLKZEROOUT, written zeroes. how names the last way used.
func Wipe(ctx context.Context, path string, zeroes bool) (how string, err error) {
	f, err := os.OpenFile(path, os.O_RDWR|unix.O_EXCL|unix.O_CLOEXEC, 0)
	if err != nil {
		return "", fmt.Errorf("open %s: %w", path, err)
	}
	defer f.Close() //nolint:errcheck

	size, err := f.Seek(0, io.SeekEnd)
	if err != nil {
		return "", fmt.Errorf("size of %s: %w", path, err)
	}

	ranges := [][2]uint64{{0, uint64(size)}}

	if !zeroes {
		ioctlRange(f, unix.BLKDISCARD, 0, uint64(size)) //nolint:errcheck // may be unsupported, and may not zero

		ranges = [][2]uint64{{0, min(uint64(size), fastWipeRange)}}
		if size >= 2*fastWipeRange {
			ranges = append(ranges, [2]uint64{uint64(size) - fastWipeRange, fastWipeRange})
		}
	}

	for _, r := range ranges {
		if how, err = wipeRange(ctx, f, r[0], r[1]); err != nil {
			return "", fmt.Errorf("wipe %s [%d, +%d): %w", path, r[0], r[1], err)
		}
	}

	if err := f.Sync(); err != nil {
		return "", fmt.Errorf("sync %s: %w", path, err)
	}

	return how, f.Close()
}

func ioctlRange(f *os.File, req uint, start, length uint64) error {
	r := [2]uint64{start, length}

	_, _, errno := unix.Syscall(unix.SYS_IOCTL, f.Fd(), uintptr(req), uintptr(unsafe.Pointer(&r[0])))
	if errno != 0 {
		return errno
	}

	return nil
}

func wipeRange(ctx context.Context, f *os.File, start, length uint64) (string, error) {
	if ioctlRange(f, unix.BLKSECDISCARD, start, length) == nil {
		return "blksecdiscard", nil
	}

	var discardZeroes int32

	_, _, errno := unix.Syscall(unix.SYS_IOCTL, f.Fd(), unix.BLKDISCARDZEROES, uintptr(unsafe.Pointer(&discardZeroes)))
	if errno == 0 && discardZeroes != 0 && ioctlRange(f, unix.BLKDISCARD, start, length) == nil {
		return "blkdiscardzeroes", nil
	}

	if ioctlRange(f, unix.BLKZEROOUT, start, length) == nil {
		return "blkzeroout", nil
	}

	// Written zeroes, at the range's own offset (go-blockdevice's fallback writes at the file position).
	buf := make([]byte, min(length, 1<<20))

	for off := start; off < start+length; {
		if err := ctx.Err(); err != nil {
			return "", err
		}

		n := min(uint64(len(buf)), start+length-off)

		if _, err := f.WriteAt(buf[:n], int64(off)); err != nil {
			return "", err
		}

		off += n
	}

	return "writezeroes", nil
}
