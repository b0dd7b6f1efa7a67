// Package atomicfile writes files so that readers, and the next start after a crash,
// see either the old content or the new one, never a part.
package atomicfile

import (
	"fmt"
	"os"
	"path/filepath"
)

// Write writes data to path through a temporary file in the same directory: written, synced,
// given perm, then renamed over path, and the directory synced.
func Write(path string, data []byte, perm os.FileMode) error {
	dir := filepath.Dir(path)

	f, err := os.CreateTemp(dir, "."+filepath.Base(path)+".tmp*")
	if err != nil {
		return fmt.Errorf("write %s: %w", path, err)
	}

	tmp := f.Name()
	defer os.Remove(tmp) //nolint:errcheck // gone after a successful rename

	if err := writeSynced(f, data, perm); err != nil {
		return fmt.Errorf("write %s: %w", path, err)
	}

	if err := os.Rename(tmp, path); err != nil {
		return fmt.Errorf("rename into %s: %w", path, err)
	}

	return SyncDir(dir)
}

func writeSynced(f *os.File, data []byte, perm os.FileMode) error {
	if err := f.Chmod(perm); err != nil {
		f.Close() //nolint:errcheck

		return err
	}

	if _, err := f.Write(data); err != nil {
		f.Close() //nolint:errcheck

		return err
	}

	if err := f.Sync(); err != nil {
		f.Close() //nolint:errcheck

		return err
	}

	return f.Close()
}

// SyncDir makes a rename in dir durable.
func SyncDir(dir string) error {
	d, err := os.Open(dir)
	if err != nil {
		return fmt.Errorf("sync directory %s: %w", dir, err)
	}
	defer d.Close() //nolint:errcheck

	if err := d.Sync(); err != nil {
		return fmt.Errorf("sync directory %s: %w", dir, err)
	}

	return nil
}
