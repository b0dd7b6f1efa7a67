package assetcache

import (
	"archive/tar"
	"bufio"
	"compress/gzip"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"os"
	"path"
	"path/filepath"
	"strconv"

	"go.uber.org/zap"

	"github.com/outpost-metal/outpost/shared/assetbundle"
)

// BundleManifestName is the file at the root of an import directory or tarball that lists its assets.
const BundleManifestName = assetbundle.ManifestName

// maxBundleEntries bounds the entries of an import tarball.
const maxBundleEntries = 10000

// ErrTraversal: an import names a path outside the bundle (absolute, "..", a link).
var ErrTraversal = assetbundle.ErrTraversal

// Bundle is the manifest of an import directory or tarball.
type Bundle = assetbundle.Manifest

// BundleAsset is one asset of a bundle.
type BundleAsset = assetbundle.Asset

// ParseBundle decodes and checks a bundle manifest.
func ParseBundle(data []byte) (Bundle, error) { return assetbundle.Parse(data) }

func bundlePath(p string) (string, error) { return assetbundle.CleanPath(p) }

// ErrForeignBundle: a bundle made by another controller than the one this edge is enrolled with.
var ErrForeignBundle = errors.New("bundle made by another controller")

// parseBundle parses a manifest and refuses one made by a controller other than the edge's own.
func (s *Store) parseBundle(data []byte) (Bundle, error) {
	b, err := ParseBundle(data)
	if err != nil {
		return Bundle{}, err
	}

	if b.Controller != "" && s.cfg.Controller != "" && b.Controller != s.cfg.Controller {
		return Bundle{}, fmt.Errorf("%w: its controller's CA is sha256:%s, this edge's is sha256:%s", ErrForeignBundle, b.Controller, s.cfg.Controller)
	}

	return b, nil
}

// Import copies the assets listed in a bundle (a directory or a tar, optionally gzip-compressed, file) into the
// store. Every asset is verified against the bundle manifest's size and digest. A tarball is staged and checked
// completely before anything is added; a bad bundle (paths escaping it, links, a manifest lying about sizes or
// digests, more than fits) is refused with an error and leaves the cache as it was.
func (s *Store) Import(ctx context.Context, src string) ([]Ref, error) {
	fi, err := os.Stat(src)
	if err != nil {
		return nil, fmt.Errorf("import %s: %w", src, err)
	}

	var refs []Ref

	if fi.IsDir() {
		refs, err = s.importDir(ctx, src)
	} else {
		refs, err = s.importTar(ctx, src)
	}

	if err != nil {
		if errors.Is(err, ErrTraversal) {
			s.metrics.errors.WithLabelValues("traversal").Inc()
		}

		return nil, fmt.Errorf("import %s: %w", src, err)
	}

	s.log.Info("imported assets", zap.String("source", src), zap.Int("count", len(refs)))

	return refs, nil
}

func (s *Store) importDir(ctx context.Context, dir string) ([]Ref, error) {
	root, err := os.OpenRoot(dir)
	if err != nil {
		return nil, err
	}
	defer root.Close() //nolint:errcheck

	data, err := root.ReadFile(BundleManifestName)
	if err != nil {
		return nil, fmt.Errorf("read %s: %w", BundleManifestName, err)
	}

	b, err := s.parseBundle(data)
	if err != nil {
		return nil, err
	}

	// check every file's presence and size before copying anything
	for _, a := range b.Assets {
		p, _ := bundlePath(a.Path)

		fi, err := root.Lstat(p)
		if err != nil {
			if isEscape(err) {
				return nil, fmt.Errorf("asset %s: %w: %q", a.Name, ErrTraversal, a.Path)
			}

			return nil, fmt.Errorf("asset %s: %w", a.Name, err)
		}

		if !fi.Mode().IsRegular() {
			return nil, fmt.Errorf("asset %s: %w: %q is not a regular file", a.Name, ErrTraversal, a.Path)
		}

		if fi.Size() != a.Size {
			s.metrics.errors.WithLabelValues("size_mismatch").Inc()

			return nil, fmt.Errorf("asset %s: %w: manifest says %d bytes, %s has %d", a.Name, ErrSizeMismatch, a.Size, a.Path, fi.Size())
		}
	}

	refs := make([]Ref, 0, len(b.Assets))

	for _, a := range b.Assets {
		ref := Ref{Name: a.Name, SHA256: a.SHA256, Size: a.Size}
		p, _ := bundlePath(a.Path)

		if err := s.Put(ctx, ref, rootSource{root: root, path: p}); err != nil {
			return refs, err
		}

		refs = append(refs, ref)
	}

	return refs, nil
}

func isEscape(err error) bool {
	var pe *os.PathError

	return errors.As(err, &pe) && pe.Err != nil && pe.Err.Error() == "path escapes from parent"
}

// rootSource reads a file inside an os.Root (which refuses paths and links leaving the directory).
type rootSource struct {
	root *os.Root
	path string
}

func (rootSource) Name() string { return "import" }

func (r rootSource) Open(_ context.Context, _ Ref, offset int64) (io.ReadCloser, error) {
	f, err := r.root.Open(r.path)
	if err != nil {
		return nil, PermanentError(err)
	}

	if _, err := f.Seek(offset, io.SeekStart); err != nil {
		f.Close() //nolint:errcheck

		return nil, PermanentError(err)
	}

	return f, nil
}

type stagedFile struct {
	path string
	size int64
	sum  string
}

func (s *Store) importTar(ctx context.Context, file string) ([]Ref, error) {
	f, err := os.Open(file)
	if err != nil {
		return nil, err
	}
	defer f.Close() //nolint:errcheck

	br := bufio.NewReader(f)

	var r io.Reader = br

	if magic, _ := br.Peek(2); len(magic) == 2 && magic[0] == 0x1f && magic[1] == 0x8b {
		zr, err := gzip.NewReader(br)
		if err != nil {
			return nil, fmt.Errorf("open gzip: %w", err)
		}
		defer zr.Close() //nolint:errcheck

		r = zr
	}

	staging, err := makeStagingDir(s.idx.tmpDir())
	if err != nil {
		return nil, err
	}
	defer os.RemoveAll(staging) //nolint:errcheck

	staged, manifestData, err := stageTar(ctx, tar.NewReader(r), staging, s.space.max, s.metrics)
	if err != nil {
		return nil, err
	}

	if manifestData == nil {
		return nil, fmt.Errorf("%s missing from the tarball", BundleManifestName)
	}

	b, err := s.parseBundle(manifestData)
	if err != nil {
		return nil, err
	}

	var total int64

	for _, a := range b.Assets {
		p, _ := bundlePath(a.Path)

		sf, ok := staged[p]
		if !ok {
			return nil, fmt.Errorf("asset %s: %q not in the tarball", a.Name, a.Path)
		}

		if sf.size != a.Size {
			s.metrics.errors.WithLabelValues("size_mismatch").Inc()

			return nil, fmt.Errorf("asset %s: %w: manifest says %d bytes, %s has %d", a.Name, ErrSizeMismatch, a.Size, a.Path, sf.size)
		}

		if sf.sum != a.SHA256 {
			s.metrics.errors.WithLabelValues("digest_mismatch").Inc()

			return nil, fmt.Errorf("asset %s: %w: manifest says sha256 %s, %s has %s", a.Name, ErrDigestMismatch, a.SHA256, a.Path, sf.sum)
		}

		total += a.Size
	}

	if total > s.space.max {
		s.metrics.errors.WithLabelValues("no_space").Inc()

		return nil, fmt.Errorf("%w: bundle holds %d bytes, the cap is %d", ErrNoSpace, total, s.space.max)
	}

	refs := make([]Ref, 0, len(b.Assets))

	for _, a := range b.Assets {
		ref := Ref{Name: a.Name, SHA256: a.SHA256, Size: a.Size}
		p, _ := bundlePath(a.Path)

		if err := s.adopt(ctx, ref, staged[p].path); err != nil {
			return refs, err
		}

		refs = append(refs, ref)
	}

	return refs, nil
}

// makeStagingDir creates a directory for staging an import in the cache's temporary directory tmp (on the same
// file system as the blobs, so staged files are renamed in).
func makeStagingDir(tmp string) (string, error) {
	dir, err := os.MkdirTemp(tmp, "import-*")
	if err != nil {
		return "", fmt.Errorf("create staging directory: %w", err)
	}

	return filepath.Clean(dir), nil
}

// stageTar writes every regular file of a tarball into the staging directory, hashing as it goes, and returns
// the bundle manifest's bytes. Anything but directories and regular files with local paths is refused, and so
// is a tarball whose files add up to more than maxBytes.
func stageTar(ctx context.Context, tr *tar.Reader, staging string, maxBytes int64, m *metrics) (map[string]stagedFile, []byte, error) {
	staged := map[string]stagedFile{}

	var (
		manifestData []byte
		total        int64
	)

	for i := 0; ; i++ {
		if err := ctx.Err(); err != nil {
			return nil, nil, err
		}

		if i >= maxBundleEntries {
			return nil, nil, fmt.Errorf("tarball has more than %d entries", maxBundleEntries)
		}

		hdr, err := tr.Next()
		if errors.Is(err, io.EOF) {
			return staged, manifestData, nil
		}

		if err != nil {
			return nil, nil, fmt.Errorf("read tarball: %w", err)
		}

		p, err := bundlePath(hdr.Name)
		if err != nil {
			if path.Clean(hdr.Name) == "." && hdr.Typeflag == tar.TypeDir {
				continue
			}

			return nil, nil, fmt.Errorf("tarball entry: %w", err)
		}

		switch hdr.Typeflag {
		case tar.TypeDir:
			continue
		case tar.TypeReg:
		default:
			return nil, nil, fmt.Errorf("tarball entry %q: %w: type %q is not a regular file or directory", hdr.Name, ErrTraversal, hdr.Typeflag)
		}

		if _, dup := staged[p]; dup || (p == BundleManifestName && manifestData != nil) {
			return nil, nil, fmt.Errorf("tarball entry %q appears twice", hdr.Name)
		}

		if p == BundleManifestName {
			manifestData, err = io.ReadAll(io.LimitReader(tr, 16<<20))
			if err != nil {
				return nil, nil, fmt.Errorf("read %s: %w", BundleManifestName, err)
			}

			continue
		}

		total += hdr.Size
		if hdr.Size < 0 || total > maxBytes {
			m.errors.WithLabelValues("no_space").Inc()

			return nil, nil, fmt.Errorf("%w: tarball holds more than the cap of %d bytes", ErrNoSpace, maxBytes)
		}

		sf, err := stageFile(tr, filepath.Join(staging, strconv.Itoa(i)))
		if err != nil {
			m.countError(err)

			return nil, nil, fmt.Errorf("stage %q: %w", hdr.Name, err)
		}

		staged[p] = sf
	}
}

func stageFile(r io.Reader, dst string) (stagedFile, error) {
	f, err := os.OpenFile(dst, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o644)
	if err != nil {
		return stagedFile{}, err
	}

	w := &hashingFile{f: f, h: sha256.New()}

	if _, err := io.Copy(w, r); err != nil {
		f.Close() //nolint:errcheck

		return stagedFile{}, err
	}

	if err := f.Close(); err != nil {
		return stagedFile{}, err
	}

	return stagedFile{path: dst, size: w.n, sum: hex.EncodeToString(w.h.Sum(nil))}, nil
}

// adopt moves a staged, already verified file into the cache (or just records the name when the digest is
// already cached).
func (s *Store) adopt(ctx context.Context, ref Ref, staged string) error {
	done, fl, err := s.begin(ref)
	if err != nil {
		return err
	}

	if done {
		return nil
	}

	if fl != nil { // a download of the same asset is under way: its result decides
		select {
		case <-fl.done:
		case <-ctx.Done():
			return fmt.Errorf("adopt %s: %w", ref.Name, ctx.Err())
		}

		if fl.err != nil {
			return fl.err
		}

		return s.Link(ref)
	}

	err = s.adoptFile(ref, staged)
	s.finish(ref, err)

	return err
}

func (s *Store) adoptFile(ref Ref, staged string) error {
	f, err := os.Open(staged)
	if err != nil {
		// the file was moved in by an earlier manifest entry with the same path
		if errors.Is(err, os.ErrNotExist) {
			return s.Link(ref)
		}

		return fmt.Errorf("adopt %s: %w", ref.Name, err)
	}

	if err := f.Sync(); err != nil {
		f.Close() //nolint:errcheck

		return fmt.Errorf("adopt %s: sync: %w", ref.Name, err)
	}

	f.Close() //nolint:errcheck

	return s.install(ref, staged, func() {})
}
