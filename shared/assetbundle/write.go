package assetbundle

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"

	"github.com/outpost-metal/outpost/shared/atomicfile"
)

// File is one asset to put in a bundle: its logical name and the file that holds it.
type File struct {
	Name   string
	Source string
}

// TreeFiles names every regular file under dir prefix/<path below dir> (forward slashes), in path order: a
// directory of install assets laid out as the edge asks for them.
func TreeFiles(prefix, dir string) ([]File, error) {
	var out []File

	err := filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}

		if !d.Type().IsRegular() {
			return fmt.Errorf("%s: not a regular file (links are not followed into a bundle)", p)
		}

		rel, err := filepath.Rel(dir, p)
		if err != nil {
			return err
		}

		out = append(out, File{Name: strings.TrimSuffix(prefix, "/") + "/" + filepath.ToSlash(rel), Source: p})

		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("bundle tree %s: %w", dir, err)
	}

	return out, nil
}

// Write writes a bundle (what the edge's import and --assets-preseed-dir read), made by the controller whose
// CA has the fingerprint controller ("": by hand), into dir: each file
// once, named by its digest, and the manifest listing every name with its size and digest, written last, so a
// bundle that was interrupted has no manifest and imports nothing. Names are checked as the import checks
// them; two names may share one file (an asset under two architectures' names).
func Write(dir string, files []File, controller string) (Manifest, error) {
	b := Manifest{Version: 1, Controller: controller}

	if len(files) == 0 {
		return b, errors.New("nothing to bundle")
	}

	seen := map[string]bool{}

	for _, f := range files {
		if err := ValidateName(f.Name); err != nil {
			return Manifest{}, err
		}

		if seen[f.Name] {
			return Manifest{}, fmt.Errorf("asset %s named twice", f.Name)
		}

		seen[f.Name] = true
	}

	if err := os.MkdirAll(dir, 0o755); err != nil {
		return Manifest{}, fmt.Errorf("bundle directory: %w", err)
	}

	if _, err := os.Stat(filepath.Join(dir, ManifestName)); err == nil {
		return Manifest{}, fmt.Errorf("%s already holds a bundle (%s)", dir, ManifestName)
	}

	copied := map[string]Asset{} // source -> its copy

	for _, f := range files {
		a, ok := copied[f.Source]
		if !ok {
			var err error
			if a, err = copyIntoBundle(dir, f.Source); err != nil {
				return Manifest{}, err
			}

			copied[f.Source] = a
		}

		a.Name = f.Name
		b.Assets = append(b.Assets, a)
	}

	slices.SortFunc(b.Assets, func(x, y Asset) int { return strings.Compare(x.Name, y.Name) })

	data, err := json.MarshalIndent(b, "", "  ")
	if err != nil {
		return Manifest{}, fmt.Errorf("encode %s: %w", ManifestName, err)
	}

	if _, err := Parse(data); err != nil {
		return Manifest{}, err // what the import would refuse is not written
	}

	if err := atomicfile.Write(filepath.Join(dir, ManifestName), append(data, '\n'), 0o644); err != nil {
		return Manifest{}, fmt.Errorf("write %s: %w", ManifestName, err)
	}

	return b, nil
}

// copyIntoBundle copies src into dir under its digest, hashing while it copies.
func copyIntoBundle(dir, src string) (Asset, error) {
	in, err := os.Open(src)
	if err != nil {
		return Asset{}, fmt.Errorf("bundle: %w", err)
	}
	defer in.Close() //nolint:errcheck // read only

	tmp, err := os.CreateTemp(dir, ".partial-*")
	if err != nil {
		return Asset{}, fmt.Errorf("bundle: %w", err)
	}
	defer os.Remove(tmp.Name()) //nolint:errcheck // gone after the rename

	h := sha256.New()

	n, err := io.Copy(io.MultiWriter(tmp, h), in)
	if err == nil {
		err = tmp.Sync()
	}

	if cerr := tmp.Close(); err == nil {
		err = cerr
	}

	if err != nil {
		return Asset{}, fmt.Errorf("bundle %s: %w", src, err)
	}

	sum := hex.EncodeToString(h.Sum(nil))
	if err := os.Rename(tmp.Name(), filepath.Join(dir, sum)); err != nil {
		return Asset{}, fmt.Errorf("bundle %s: %w", src, err)
	}

	return Asset{SHA256: sum, Size: n, Path: sum}, nil
}
