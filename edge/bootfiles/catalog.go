// Package bootfiles is the edge's catalog of boot files: the iPXE binaries (Debian's ipxe package) that
// firmware fetches first, read into memory once at start-up and served the same over TFTP (edge/tftp) and HTTP
// (edge/httpd's /tftp/ path, for UEFI HTTP boot). The ProxyDHCP names only files the catalog holds.
package bootfiles

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"net/netip"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"time"
)

// DefaultDir is where Debian's ipxe package installs its binaries.
const DefaultDir = "/usr/lib/ipxe"

// maxNameLen bounds a requested file name (a TFTP request is one datagram anyway).
const maxNameLen = 255

// ErrNotFound is returned for names outside the served set.
var ErrNotFound = errors.New("file not found")

// ErrBadName is returned for names that could escape the served directory or are otherwise invalid.
var ErrBadName = errors.New("invalid file name")

// Fetch is a boot file served to a client, over TFTP or HTTP, or refused to it: for the event journal ("PXE
// seen").
type Fetch struct {
	Name   string
	Remote netip.Addr
	// Err is nil for a completed transfer.
	Err error
}

// File is one served binary.
type File struct {
	Name    string
	Data    []byte
	ModTime time.Time
	// SHA256 is the hex digest of Data (used as the HTTP ETag).
	SHA256 string
}

// Reader returns a fresh reader over the file's bytes.
func (f *File) Reader() *bytes.Reader {
	return bytes.NewReader(f.Data)
}

// Catalog is the immutable set of served binaries, read into memory at start-up so that what is
// served cannot change underneath a transfer.
type Catalog struct {
	files map[string]*File
}

// LoadCatalog reads the named files from dir. Missing files are skipped (a firmware class without its
// binary is simply not bootable); an empty result is an error, as is any other read failure.
func LoadCatalog(dir string, names []string) (*Catalog, error) {
	c := &Catalog{files: map[string]*File{}}

	for _, name := range names {
		clean, err := CleanName(name)
		if err != nil {
			return nil, fmt.Errorf("boot file %q: %w", name, err)
		}

		path := filepath.Join(dir, filepath.FromSlash(clean))

		st, err := os.Stat(path)
		if errors.Is(err, os.ErrNotExist) {
			continue
		}

		if err != nil {
			return nil, fmt.Errorf("stat boot file %s: %w", path, err)
		}

		data, err := os.ReadFile(path)
		if err != nil {
			return nil, fmt.Errorf("read boot file %s: %w", path, err)
		}

		sum := sha256.Sum256(data)
		c.files[clean] = &File{Name: clean, Data: data, ModTime: st.ModTime(), SHA256: hex.EncodeToString(sum[:])}
	}

	if len(c.files) == 0 {
		return nil, fmt.Errorf("none of %v in %s: %w", names, dir, ErrNotFound)
	}

	return c, nil
}

// NewCatalog builds a catalog from in-memory files (tests, embedded builds).
func NewCatalog(files map[string][]byte) *Catalog {
	c := &Catalog{files: map[string]*File{}}

	for name, data := range files {
		sum := sha256.Sum256(data)
		c.files[name] = &File{Name: name, Data: data, SHA256: hex.EncodeToString(sum[:])}
	}

	return c
}

// Has reports whether name is served.
func (c *Catalog) Has(name string) bool {
	_, err := c.Lookup(name)

	return err == nil
}

// Names lists the served names, sorted.
func (c *Catalog) Names() []string {
	out := make([]string, 0, len(c.files))
	for n := range c.files {
		out = append(out, n)
	}

	sort.Strings(out)

	return out
}

// Lookup returns the file for a requested name, after CleanName.
func (c *Catalog) Lookup(requested string) (*File, error) {
	name, err := CleanName(requested)
	if err != nil {
		return nil, err
	}

	f, ok := c.files[name]
	if !ok {
		return nil, fmt.Errorf("%q: %w", name, ErrNotFound)
	}

	return f, nil
}

// CleanName normalises a requested name: one leading slash is dropped (some ROMs send "/ipxe.efi");
// empty names, "..", ".", empty path elements, backslashes, control characters and over-long names are refused.
func CleanName(requested string) (string, error) {
	name := strings.TrimPrefix(requested, "/")

	switch {
	case name == "":
		return "", fmt.Errorf("empty name: %w", ErrBadName)
	case len(name) > maxNameLen:
		return "", fmt.Errorf("name of %d bytes: %w", len(name), ErrBadName)
	case strings.ContainsAny(name, "\\"):
		return "", fmt.Errorf("%q has a backslash: %w", name, ErrBadName)
	}

	for _, r := range name {
		if r < 0x20 || r == 0x7f {
			return "", fmt.Errorf("%q has a control character: %w", name, ErrBadName)
		}
	}

	for _, elem := range strings.Split(name, "/") {
		if elem == "" || elem == "." || elem == ".." {
			return "", fmt.Errorf("%q has path element %q: %w", name, elem, ErrBadName)
		}
	}

	return name, nil
}

var _ io.ReadSeeker = (*bytes.Reader)(nil)
