package bootlab

import (
	"bytes"
	"compress/gzip"
	"debug/elf"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"sort"
	"strings"
)

// CPIOWriter writes a cpio archive in the "newc" format the Linux kernel unpacks as an initramfs
// (Documentation/driver-api/early-userspace/buffer-format.rst). Device nodes are written as headers,
// so building an initramfs needs neither root nor mknod.
type CPIOWriter struct {
	w   io.Writer
	ino uint32
	err error
}

// NewCPIOWriter returns a writer on w.
func NewCPIOWriter(w io.Writer) *CPIOWriter {
	return &CPIOWriter{w: w, ino: 1}
}

// File modes of cpio entries (the st_mode type bits).
const (
	modeDir  = 0o040000
	modeFile = 0o100000
	modeChar = 0o020000
)

func (c *CPIOWriter) entry(name string, mode uint32, data []byte, rdevMajor, rdevMinor uint32) {
	if c.err != nil {
		return
	}

	nlink := uint32(1)
	if mode&0o170000 == modeDir {
		nlink = 2
	}

	hdr := fmt.Sprintf("070701%08X%08X%08X%08X%08X%08X%08X%08X%08X%08X%08X%08X%08X",
		c.ino, mode, 0, 0, nlink, 0, len(data), 0, 0, rdevMajor, rdevMinor, len(name)+1, 0)
	c.ino++

	buf := make([]byte, 0, len(hdr)+len(name)+8+len(data)+4)
	buf = append(buf, hdr...)
	buf = append(buf, name...)
	buf = append(buf, 0)
	buf = pad4(buf)
	buf = append(buf, data...)
	buf = pad4(buf)

	_, c.err = c.w.Write(buf)
}

func pad4(b []byte) []byte {
	for len(b)%4 != 0 {
		b = append(b, 0)
	}

	return b
}

// Dir adds a directory.
func (c *CPIOWriter) Dir(name string) { c.entry(name, modeDir|0o755, nil, 0, 0) }

// File adds a regular file with the given permissions.
func (c *CPIOWriter) File(name string, perm uint32, data []byte) {
	c.entry(name, modeFile|perm, data, 0, 0)
}

// CharDev adds a character device node.
func (c *CPIOWriter) CharDev(name string, major, minor uint32) {
	c.entry(name, modeChar|0o600, nil, major, minor)
}

// Close writes the trailer and returns the first error.
func (c *CPIOWriter) Close() error {
	c.entry("TRAILER!!!", 0, nil, 0, 0)

	return c.err
}

// ModuleDeps returns the modules needed to load names, dependencies first, as paths relative to modulesDir.
// Dependencies come from each module's .modinfo section ("depends="), since modules.dep exists only after
// depmod runs on an installed kernel and this one is only unpacked.
func ModuleDeps(modulesDir string, names []string) ([]string, error) {
	byName := map[string]string{} // module name -> path relative to modulesDir

	err := filepath.WalkDir(modulesDir, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}

		if !d.IsDir() && strings.HasSuffix(path, ".ko") {
			rel, err := filepath.Rel(modulesDir, path)
			if err != nil {
				return err
			}

			// Module names use '_' where file names may use '-'.
			byName[strings.ReplaceAll(strings.TrimSuffix(d.Name(), ".ko"), "-", "_")] = rel
		}

		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("list modules: %w", err)
	}

	var (
		order []string
		seen  = map[string]bool{}
		visit func(string) error
	)

	visit = func(name string) error {
		if seen[name] {
			return nil
		}

		seen[name] = true

		rel, ok := byName[name]
		if !ok {
			return fmt.Errorf("module %s not found under %s", name, modulesDir)
		}

		deps, err := moduleDepends(filepath.Join(modulesDir, rel))
		if err != nil {
			return err
		}

		for _, d := range deps {
			if err := visit(d); err != nil {
				return err
			}
		}

		order = append(order, rel)

		return nil
	}

	for _, n := range names {
		if err := visit(n); err != nil {
			return nil, err
		}
	}

	return order, nil
}

// moduleDepends reads "depends=" from a kernel module's .modinfo section.
func moduleDepends(path string) ([]string, error) {
	f, err := elf.Open(path)
	if err != nil {
		return nil, fmt.Errorf("open module %s: %w", path, err)
	}
	defer f.Close() //nolint:errcheck

	sec := f.Section(".modinfo")
	if sec == nil {
		return nil, nil
	}

	data, err := sec.Data()
	if err != nil {
		return nil, fmt.Errorf("read .modinfo of %s: %w", path, err)
	}

	for _, field := range bytes.Split(data, []byte{0}) {
		if v, ok := strings.CutPrefix(string(field), "depends="); ok {
			if v == "" {
				return nil, nil
			}

			return strings.Split(v, ","), nil
		}
	}

	return nil, nil
}

// BuildInitramfs writes a gzip-compressed initramfs holding initBinary as /init, /dev/console, and the
// kernel modules needed for modules (with /modules.order listing them in load order).
func BuildInitramfs(w io.Writer, initBinary []byte, modulesDir string, modules []string) error {
	order, err := ModuleDeps(modulesDir, modules)
	if err != nil {
		return err
	}

	gz := gzip.NewWriter(w)
	c := NewCPIOWriter(gz)

	for _, d := range []string{"dev", "proc", "sys", "lib", "lib/modules"} {
		c.Dir(d)
	}

	c.CharDev("dev/console", 5, 1)
	c.File("init", 0o755, initBinary)

	dirs := map[string]bool{}

	var list strings.Builder

	for _, mod := range order {
		dir := filepath.Dir(filepath.Join("lib/modules", mod))

		var parents []string
		for p := dir; p != "lib/modules" && p != "." && !dirs[p]; p = filepath.Dir(p) {
			parents = append(parents, p)
			dirs[p] = true
		}

		sort.Strings(parents)

		for _, p := range parents {
			c.Dir(p)
		}

		data, err := os.ReadFile(filepath.Join(modulesDir, mod))
		if err != nil {
			return fmt.Errorf("read module %s: %w", mod, err)
		}

		c.File(filepath.Join("lib/modules", mod), 0o644, data)
		list.WriteString("/" + filepath.Join("lib/modules", mod) + "\n")
	}

	c.File("modules.order", 0o644, []byte(list.String()))

	if err := c.Close(); err != nil {
		return fmt.Errorf("write cpio: %w", err)
	}

	if err := gz.Close(); err != nil {
		return fmt.Errorf("compress initramfs: %w", err)
	}

	return nil
}
